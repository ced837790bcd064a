// CUTLASS backend: generates the few lines that instantiate kernels/gemm/cutlass_gemm_sm90.cuh for
// one (dtype, layout, config), has the JIT runtime build or load it, and launches it.
#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/gemm/gemm_backend.h"
#include "ops/gemm/gemm_cutlass_configs.h"
#include "primus_turbo/kernels/jit_abi.h"
#include "runtime/device.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::gemm {

namespace {

const char* cutlass_type(int32_t dt) {
  switch (dt) {
    case PT_FLOAT32: return "float";
    case PT_FLOAT16: return "cutlass::half_t";
    case PT_BFLOAT16: return "cutlass::bfloat16_t";
    default: PT_THROW(PT_ERROR_NOT_SUPPORTED, "CUTLASS GEMM: unsupported dtype code ", dt);
  }
}

jit::ModuleRequest module_request(const Problem& p, const CutlassConfig& c) {
  jit::ModuleRequest r;
  r.name = str_cat("gemm_cutlass_", dtype_short_name(p.ab_dtype), "_", dtype_short_name(p.d_dtype), "_",
                   p.layout_code(), "_", c.name());
  r.needs_cutlass = true;
  r.source = str_cat(
      "#include \"primus_turbo/kernels/gemm/cutlass_gemm_sm90.cuh\"\n"
      "using Kernel = primus_turbo::kernels::CutlassGemmSm90<\n    ",
      cutlass_type(p.ab_dtype), ", ", cutlass_type(p.d_dtype), ",\n    ",
      p.a.k_major ? "cutlass::layout::RowMajor" : "cutlass::layout::ColumnMajor", ", ",
      p.b.k_major ? "cutlass::layout::ColumnMajor" : "cutlass::layout::RowMajor", ",\n    ",
      c.tile_m, ", ", c.tile_n, ", ", c.tile_k, ", ", c.cluster_m, ", ", c.cluster_n, ",\n    ",
      c.pingpong ? "primus_turbo::kernels::Pingpong" : "primus_turbo::kernels::Cooperative",
      ">;\nPT_JIT_EXPORT_GEMM(Kernel)\n");
  return r;
}

struct LoadedKernel {
  PtGemmRunFn run = nullptr;
};

// Memoized by (dtypes, layouts, config): after the first call, finding the kernel costs one map
// lookup, with no source generation or hashing.
LoadedKernel load_kernel(const Problem& p, int config) {
  using Key = std::tuple<int32_t, int32_t, bool, bool, int>;
  static std::mutex mutex;
  static std::map<Key, LoadedKernel> loaded;
  const Key key{p.ab_dtype, p.d_dtype, p.a.k_major, p.b.k_major, config};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = loaded.find(key);
    if (it != loaded.end()) return it->second;
  }
  // May compile: not under the lock, so other configs can build in parallel.
  auto module = jit::get_module(module_request(p, cutlass_candidates().at(config)));
  LoadedKernel kernel{module->function<PtGemmRunFn>("pt_gemm_run")};
  std::lock_guard<std::mutex> lock(mutex);
  loaded.emplace(key, kernel);
  return kernel;
}

class CutlassBackend final : public Backend {
 public:
  std::string rejection(const Problem& p) const override {
    if (p.ab_dtype != PT_BFLOAT16 && p.ab_dtype != PT_FLOAT16) {
      return str_cat("CUTLASS GEMM takes bfloat16 or float16 inputs, got ", dtype_name(p.ab_dtype),
                     " (float32 runs on CUBLASLT at full float32 precision)");
    }
    const DeviceInfo& dev = device_info(current_device());
    if (dev.major != 9 || dev.minor != 0) {
      return str_cat("CUTLASS GEMM kernels are built for Hopper (sm_90a); this GPU is sm_",
                     dev.major, dev.minor);
    }
    if (!p.a.aligned16 || !p.b.aligned16 || !p.d_aligned16) {
      return "CUTLASS GEMM needs 16-byte aligned pointers and leading dimensions (TMA)";
    }
    // TMA also needs the contiguous extent of each operand to be a whole number of 16 bytes.
    const int64_t ab_vec = 8, d_vec = p.d_dtype == PT_FLOAT32 ? 4 : 8;
    const int64_t a_inner = p.a.k_major ? p.k : p.m, b_inner = p.b.k_major ? p.k : p.n;
    if (a_inner % ab_vec || b_inner % ab_vec || p.n % d_vec) {
      return str_cat("CUTLASS GEMM needs the contiguous dimensions to be multiples of 16 bytes ",
                     "(m=", p.m, ", n=", p.n, ", k=", p.k, ", layout ", p.layout_code(), ")");
    }
    if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) {
      return "CUTLASS GEMM takes sizes below 2^31";
    }
    return "";
  }

  int num_configs(const Problem&) const override {
    return static_cast<int>(cutlass_candidates().size());
  }

  int default_config(const Problem& p) const override {
    return cutlass_default_config(p, device_info(current_device()).sm_count);
  }

  std::string config_name(const Problem& p, int config) const override {
    check_config(p, config);
    return str_cat("cutlass_", cutlass_candidates()[config].name());
  }

  void prepare(const Problem& p, int config) const override {
    check_config(p, config);
    load_kernel(p, config);
  }

  void run(const Problem& p, int config, void* workspace, size_t workspace_bytes,
           cudaStream_t stream) const override {
    check_config(p, config);
    const std::string why = rejection(p);
    PT_CHECK_SUPPORTED(why.empty(), why);
    launch(p, config, load_kernel(p, config), current_device(), workspace, workspace_bytes,
           stream);
  }

  std::unique_ptr<BoundRun> bind(const Problem& p, int config) const override;

  void launch(const Problem& p, int config, LoadedKernel kernel, int device, void* workspace,
              size_t workspace_bytes, cudaStream_t stream) const {
    bind_device_context(device);
    PtGemmParams params{};
    params.m = p.m;
    params.n = p.n;
    params.k = p.k;
    params.a = p.a.ptr;
    params.lda = p.a.ld;
    params.b = p.b.ptr;
    params.ldb = p.b.ld;
    params.d = p.d;
    params.ldd = p.ldd;
    params.alpha = p.alpha;
    params.beta = p.beta;
    params.workspace = workspace;
    params.workspace_bytes = workspace_bytes;
    params.stream = stream;
    params.device = device;
    params.num_sms = device_info(device).sm_count;
    params.swizzle = cutlass_candidates()[config].swizzle;
    char err[1024] = {0};
    if (kernel.run(&params, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "CUTLASS GEMM kernel ", config_name(p, config), " (", p.m, "x", p.n,
               "x", p.k, ", ", p.layout_code(), ") failed: ", err);
    }
  }

 private:
  void check_config(const Problem&, int config) const {
    const int n = static_cast<int>(cutlass_candidates().size());
    PT_CHECK_ARG(config >= 0 && config < n, "CUTLASS config ", config, " is out of range [0, ", n,
                 ")");
  }
};

// The kernel is loaded and the problem accepted once, when the plan is made.
class CutlassBoundRun final : public BoundRun {
 public:
  CutlassBoundRun(const CutlassBackend& backend, const Problem& p, int config)
      : backend_(backend), config_(config), kernel_(load_kernel(p, config)),
        device_(current_device()) {}
  void run(const Problem& p, void* workspace, size_t workspace_bytes,
           cudaStream_t stream) const override {
    backend_.launch(p, config_, kernel_, device_, workspace, workspace_bytes, stream);
  }

 private:
  const CutlassBackend& backend_;
  int config_;
  LoadedKernel kernel_;
  int device_;
};

std::unique_ptr<BoundRun> CutlassBackend::bind(const Problem& p, int config) const {
  check_config(p, config);
  return std::make_unique<CutlassBoundRun>(*this, p, config);
}

}  // namespace

const Backend& cutlass_backend() {
  static CutlassBackend backend;
  return backend;
}

const Backend& backend_for(int32_t backend) {
  switch (backend) {
    case PT_BACKEND_CUBLASLT: return cublaslt_backend();
    case PT_BACKEND_CUTLASS: return cutlass_backend();
    default:
      PT_THROW(PT_ERROR_INVALID_ARGUMENT, "GEMM has no backend code ", backend,
               "; expected CUBLASLT or CUTLASS");
  }
}

}  // namespace primus_turbo::gemm
