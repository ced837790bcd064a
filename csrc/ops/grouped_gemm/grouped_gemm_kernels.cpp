#include "ops/grouped_gemm/grouped_gemm_kernels.h"

#include <tuple>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/grouped_gemm/grouped_gemm_configs.h"
#include "primus_turbo/kernels/grouped_gemm/grouped_gemm_abi.h"
#include "runtime/device.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::grouped_gemm {

std::string rejection(const Problem& p) {
  const DeviceInfo& dev = device_info(current_device());
  if (dev.major != 9 || dev.minor != 0) {
    return str_cat("CUTLASS grouped GEMM kernels are built for Hopper (sm_90a); this GPU is sm_",
                   dev.major, dev.minor);
  }
  if (!p.aligned16) return "CUTLASS grouped GEMM needs 16-byte aligned data pointers (TMA)";
  // Every per-group operand starts a whole row into its tensor and rows must be 16-byte
  // multiples for TMA: K and N multiples of 8 elements.
  if (p.k % 8 || p.n % 8) {
    return str_cat("CUTLASS grouped GEMM needs K and N to be multiples of 8 (16 bytes), got K=",
                   p.k, ", N=", p.n);
  }
  if (p.rows > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) {
    return "CUTLASS grouped GEMM takes sizes below 2^31";
  }
  return "";
}

namespace {

const char* cutlass_type(int32_t dt) {
  switch (dt) {
    case PT_FLOAT16: return "cutlass::half_t";
    case PT_BFLOAT16: return "cutlass::bfloat16_t";
    default: PT_THROW(PT_ERROR_NOT_SUPPORTED, "CUTLASS grouped GEMM: unsupported dtype ", dt);
  }
}

jit::ModuleRequest module_request(const Problem& p, const Config& c) {
  const std::string layout = p.layout_code();
  jit::ModuleRequest r;
  r.name = str_cat("grouped_gemm_cutlass_", dtype_short_name(p.dtype), "_", layout, "_", c.name());
  r.needs_cutlass = true;
  r.source = str_cat(
      "#include \"primus_turbo/kernels/grouped_gemm/cutlass_grouped_gemm_sm90.cuh\"\n"
      "namespace g = primus_turbo::kernels::grouped;\n"
      "using Kernel = g::CutlassGroupedGemmSm90<\n    ",
      cutlass_type(p.dtype), ", ", cutlass_type(p.dtype), ",\n    ",
      layout[1] == 'k' ? "cutlass::layout::RowMajor" : "cutlass::layout::ColumnMajor", ", ",
      layout[3] == 'k' ? "cutlass::layout::ColumnMajor" : "cutlass::layout::RowMajor", ",\n    ",
      c.tile_m, ", ", c.tile_n, ", ", c.tile_k, ", ", c.cluster_m, ", ", c.cluster_n, ",\n    ",
      c.pingpong ? "g::Pingpong" : "g::Cooperative", ">;\nPT_JIT_EXPORT_GROUPED_GEMM(Kernel)\n");
  return r;
}

struct Loaded {
  PtGroupedGemmRunFn run = nullptr;
  PtGroupedGemmWorkspaceFn workspace = nullptr;
};

void check_config(int config) {
  const int n = static_cast<int>(candidates().size());
  PT_CHECK_ARG(config >= 0 && config < n, "grouped GEMM config ", config,
               " is out of range [0, ", n, ")");
}

// Memoized by (dtype, layout, config): after the first call, one map lookup.
Loaded load(const Problem& p, int config) {
  check_config(config);
  using Key = std::tuple<int32_t, std::string, int>;
  static jit::LoadedCache<Key, Loaded> loaded;
  return loaded.get(Key{p.dtype, p.layout_code(), config}, [&] {
    // May compile: outside the lock, so other configs build in parallel.
    auto module = jit::get_module(module_request(p, candidates()[config]));
    return Loaded{module->function<PtGroupedGemmRunFn>("pt_grouped_gemm_run"),
                  module->function<PtGroupedGemmWorkspaceFn>("pt_grouped_gemm_workspace")};
  });
}

PtGroupedGemmParams make_params(const Problem& p, int device) {
  PtGroupedGemmParams params{};
  params.split = p.wgrad ? PT_GROUPED_SPLIT_REDUCTION : PT_GROUPED_SPLIT_ROWS;
  params.num_groups = p.groups;
  params.rows = p.rows;
  params.m = p.kernel_m();
  params.n = p.kernel_n();
  params.k = p.kernel_k();
  params.group_lens = p.group_lens;
  params.group_offs = p.group_offs;
  params.a = p.kernel_a();
  params.b = p.kernel_b();
  params.d = p.d;
  params.device = device;
  params.num_sms = p.sm_budget(device_info(device).sm_count);
  return params;
}

}  // namespace

void prepare(const Problem& p, int config) { load(p, config); }

size_t workspace_bytes(const Problem& p, int config) {
  Loaded k = load(p, config);
  PtGroupedGemmParams params = make_params(p, current_device());
  size_t bytes = 0;
  char err[512] = {0};
  PT_CHECK_INTERNAL(k.workspace(&params, &bytes, err, sizeof(err)) == 0, err);
  return bytes;
}

void run(const Problem& p, int config, void* workspace, size_t workspace_bytes,
         cudaStream_t stream) {
  const std::string why = rejection(p);
  PT_CHECK_SUPPORTED(why.empty(), why);
  Loaded k = load(p, config);
  const int device = current_device();
  bind_device_context(device);
  PtGroupedGemmParams params = make_params(p, device);
  params.workspace = workspace;
  params.workspace_bytes = workspace_bytes;
  params.stream = stream;
  char err[1024] = {0};
  if (k.run(&params, err, sizeof(err)) != 0) {
    PT_THROW(PT_ERROR_CUDA, "CUTLASS grouped GEMM ", candidates()[config].name(), " (G=", p.groups,
             ", M=", p.rows, ", N=", p.n, ", K=", p.k, ", ", p.layout_code(), ") failed: ", err);
  }
}

}  // namespace primus_turbo::grouped_gemm
