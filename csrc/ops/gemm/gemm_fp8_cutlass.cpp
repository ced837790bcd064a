// CUTLASS FP8 backend: generates the lines that instantiate kernels/gemm/cutlass_gemm_fp8_sm90.cuh
// for one (dtypes, scale granularities, config), has the JIT runtime build or load it, launches it.
// It takes 1x128 / 128x128 block scales (any pair, E4M3 or E5M2 on either side); tensorwise and
// rowwise problems run on cuBLASLt (the binding expands their scales to 1x128 blocks for E5M2 x
// E5M2, which cuBLASLt lacks).
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/gemm/gemm_fp8_backend.h"
#include "primus_turbo/kernels/gemm/gemm_fp8_abi.h"
#include "runtime/device.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::gemm {

namespace {

struct Fp8Config {
  int tile_m, tile_n, cluster_m, cluster_n;
  std::string name() const { return str_cat(tile_m, "x", tile_n, "x128_c", cluster_m, "x", cluster_n, "_coop"); }
};

// Bounded on purpose (each point is a ~1 minute compile): the 128x128 tile with either cluster
// orientation and a tall tile for large M. The collective needs exactly one 128x128 scale per
// tile along a 128-row-scaled operand, so that operand's tile side must be 128.
const std::vector<Fp8Config>& all_candidates() {
  static const std::vector<Fp8Config> configs = {
      {128, 128, 1, 2},
      {128, 128, 2, 1},
      {256, 128, 2, 1},
  };
  return configs;
}

int scale_rows(int32_t scaling);

// The candidates valid for one scaling pair; a config index counts within this list.
std::vector<Fp8Config> candidates(int32_t a_scaling, int32_t b_scaling) {
  std::vector<Fp8Config> out;
  for (const auto& c : all_candidates()) {
    if ((scale_rows(a_scaling) == 1 || c.tile_m == 128) && (scale_rows(b_scaling) == 1 || c.tile_n == 128))
      out.push_back(c);
  }
  return out;
}

const char* cutlass_type(int32_t dt) {
  switch (dt) {
    case PT_FLOAT8_E4M3: return "cutlass::float_e4m3_t";
    case PT_FLOAT8_E5M2: return "cutlass::float_e5m2_t";
    case PT_FLOAT32: return "float";
    case PT_FLOAT16: return "cutlass::half_t";
    case PT_BFLOAT16: return "cutlass::bfloat16_t";
    default: PT_THROW(PT_ERROR_NOT_SUPPORTED, "CUTLASS FP8 GEMM: unsupported dtype code ", dt);
  }
}

bool is_block(int32_t scaling) {
  return scaling == PT_FP8_SCALING_BLOCK_1x128 || scaling == PT_FP8_SCALING_BLOCK_128x128;
}
int scale_rows(int32_t scaling) { return scaling == PT_FP8_SCALING_BLOCK_128x128 ? 128 : 1; }

struct KernelKey {
  int32_t a_dtype, b_dtype, d_dtype, a_scaling, b_scaling;
  int config;
  auto tie() const { return std::tie(a_dtype, b_dtype, d_dtype, a_scaling, b_scaling, config); }
  bool operator<(const KernelKey& o) const { return tie() < o.tie(); }
};

jit::ModuleRequest module_request(const KernelKey& k) {
  const Fp8Config c = candidates(k.a_scaling, k.b_scaling).at(k.config);
  jit::ModuleRequest r;
  r.name = str_cat("gemm_fp8_cutlass_", dtype_short_name(k.a_dtype), "x", dtype_short_name(k.b_dtype),
                   "_", dtype_short_name(k.d_dtype), "_sf", scale_rows(k.a_scaling), "x",
                   scale_rows(k.b_scaling), "_", c.name());
  r.needs_cutlass = true;
  r.source = str_cat(
      "#include \"primus_turbo/kernels/gemm/cutlass_gemm_fp8_sm90.cuh\"\n"
      "using Kernel = primus_turbo::kernels::CutlassGemmFp8Sm90<\n    ",
      cutlass_type(k.a_dtype), ", ", cutlass_type(k.b_dtype), ", ", cutlass_type(k.d_dtype), ",\n    ",
      scale_rows(k.a_scaling), ", ", scale_rows(k.b_scaling), ", ", c.tile_m, ", ", c.tile_n, ", ",
      c.cluster_m, ", ", c.cluster_n, ", primus_turbo::kernels::Fp8Cooperative>;\n"
      "PT_JIT_EXPORT_GEMM_FP8(Kernel)\n");
  return r;
}

PtGemmFp8RunFn load_kernel(const KernelKey& key) {
  static std::mutex mutex;
  static std::map<KernelKey, PtGemmFp8RunFn> loaded;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = loaded.find(key);
    if (it != loaded.end()) return it->second;
  }
  auto module = jit::get_module(module_request(key));  // may compile: outside the lock
  auto fn = module->function<PtGemmFp8RunFn>("pt_gemm_fp8_run");
  std::lock_guard<std::mutex> lock(mutex);
  loaded.emplace(key, fn);
  return fn;
}

void check_config(int32_t a_scaling, int32_t b_scaling, int config) {
  const int n = static_cast<int>(candidates(a_scaling, b_scaling).size());
  PT_CHECK_ARG(config >= 0 && config < n, "CUTLASS FP8 config ", config, " is out of range [0, ", n, ")");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The kernel and the launch parameters that depend only on the problem's shape; a run adds the
// pointers and the stream.
class CutlassFp8BoundRun final : public Fp8BoundRun {
 public:
  CutlassFp8BoundRun(PtGemmFp8RunFn fn, const PtGemmFp8Params& shape, std::string name)
      : fn_(fn), shape_(shape), name_(std::move(name)) {}

  void run(const Fp8Problem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) const override {
    PtGemmFp8Params params = shape_;
    params.a = p.a.ptr, params.b = p.b.ptr;
    params.sfa = p.a.scale, params.sfb = p.b.scale;
    params.d = p.d;
    params.workspace = workspace, params.workspace_bytes = workspace_bytes;
    params.stream = stream;
    char err[1024] = {0};
    if (fn_(&params, err, sizeof(err)) != 0) PT_THROW(PT_ERROR_CUDA, "CUTLASS FP8 GEMM ", name_, " failed: ", err);
  }

 private:
  PtGemmFp8RunFn fn_;
  PtGemmFp8Params shape_;
  std::string name_;
};

class CutlassFp8Backend final : public Fp8Backend {
 public:
  std::string rejection(const Fp8Problem& p) const override {
    if (!is_block(p.a.scaling) || !is_block(p.b.scaling))
      return "the CUTLASS FP8 GEMM takes 1x128 / 128x128 block scales (tensorwise and rowwise run on "
             "CUBLASLT)";
    const DeviceInfo& dev = device_info(current_device());
    if (dev.major != 9 || dev.minor != 0)
      return str_cat("the CUTLASS FP8 GEMM is built for Hopper (sm_90a); this GPU is sm_", dev.major, dev.minor);
    const int64_t d_vec = p.d_dtype == PT_FLOAT32 ? 4 : 8;
    if (p.k % 16 || p.a.ld % 16 || p.b.ld % 16 || p.n % d_vec || p.ldd % d_vec || !aligned16(p.a.ptr) ||
        !aligned16(p.b.ptr) || !aligned16(p.d))
      return str_cat("the CUTLASS FP8 GEMM needs 16-byte aligned rows (k=", p.k, ", n=", p.n, ")");
    if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) return "the CUTLASS FP8 GEMM takes sizes below 2^31";
    return "";
  }

  int num_configs(const Fp8Problem& p) const override {
    return static_cast<int>(candidates(p.a.scaling, p.b.scaling).size());
  }

  void run(const Fp8Problem& p, int config, void* workspace, size_t workspace_bytes,
           cudaStream_t stream) const override {
    make_run(p, config).run(p, workspace, workspace_bytes, stream);
  }

  std::unique_ptr<Fp8BoundRun> bind(const Fp8Problem& p, int config) const override {
    return std::make_unique<CutlassFp8BoundRun>(make_run(p, config));
  }

 private:
  CutlassFp8BoundRun make_run(const Fp8Problem& p, int config) const {
    const std::string why = rejection(p);
    PT_CHECK_SUPPORTED(why.empty(), why);
    if (config < 0) config = 0;
    check_config(p.a.scaling, p.b.scaling, config);
    PtGemmFp8RunFn fn = load_kernel({p.a.dtype, p.b.dtype, p.d_dtype, p.a.scaling, p.b.scaling, config});
    const int device = current_device();
    bind_device_context(device);
    const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    const auto round4 = [](int64_t v) { return (v + 3) / 4 * 4; };
    // Leading dimensions of the pt_fp8_scaling layouts.
    const auto sf_ld = [&](int32_t scaling, int64_t rows) {
      return scaling == PT_FP8_SCALING_BLOCK_1x128 ? round4(rows) : round4(ceil_div(p.k, 128));
    };
    PtGemmFp8Params params{};
    params.m = p.m, params.n = p.n, params.k = p.k;
    params.lda = p.a.ld, params.ldb = p.b.ld;
    params.sfa_ld = sf_ld(p.a.scaling, p.m), params.sfb_ld = sf_ld(p.b.scaling, p.n);
    params.ldd = p.ldd;
    params.beta = p.beta;
    params.device = device;
    params.num_sms = device_info(device).sm_count;
    return CutlassFp8BoundRun(fn, params,
                              str_cat(candidates(p.a.scaling, p.b.scaling)[config].name(), " (", p.key(), ")"));
  }
};

}  // namespace

const Fp8Backend& cutlass_fp8_backend() {
  static CutlassFp8Backend backend;
  return backend;
}

void prepare_cutlass_fp8(int32_t a_dtype, int32_t b_dtype, int32_t d_dtype, int32_t a_scaling,
                         int32_t b_scaling, int config) {
  PT_CHECK_ARG(is_block(a_scaling) && is_block(b_scaling),
               "the CUTLASS FP8 GEMM takes 1x128 / 128x128 block scalings");
  check_config(a_scaling, b_scaling, config);
  load_kernel({a_dtype, b_dtype, d_dtype, a_scaling, b_scaling, config});
}

int cutlass_fp8_num_configs() { return static_cast<int>(all_candidates().size()); }

}  // namespace primus_turbo::gemm
