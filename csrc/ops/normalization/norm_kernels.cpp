#include "ops/normalization/norm_kernels.h"

#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "core/tensor.h"
#include "runtime/device.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::norm {

namespace {

const char* cuda_type(int32_t dt) {
  if (const char* t = cuda_float_type(dt)) return t;
  PT_THROW(PT_ERROR_NOT_SUPPORTED, "normalization: unsupported dtype code ", dt);
}

// FP8 forward modules: "_fp8row_e4m3" etc. in the name, the mode and format as template arguments.
std::string fp8_name(const Problem& p) {
  if (p.fp8 == 0) return "";
  return str_cat("_fp8", p.fp8 == 1 ? "row" : "blk128", "_", p.fp8_dtype == PT_FLOAT8_E4M3 ? "e4m3" : "e5m2");
}

std::string fp8_args(const Problem& p) {
  if (p.fp8 == 0) return "";
  return str_cat(", ", p.fp8, ", primus_turbo::kernels::quant::", p.fp8_dtype == PT_FLOAT8_E4M3 ? "E4M3" : "E5M2");
}

jit::ModuleRequest module_request(const Problem& p, int hidden, const std::string& arch) {
  jit::ModuleRequest r;
  r.name = str_cat(kind_name(p.kind), "_", dtype_short_name(p.x_dtype), "_", dtype_short_name(p.gamma_dtype), "_",
                   p.vectorized ? "vec" : "scalar", "_", hidden ? str_cat("h", hidden) : "hany", fp8_name(p));
  r.needs_cutlass = false;
  r.arch = arch;
  r.source = str_cat(
      "#include \"primus_turbo/kernels/normalization/norm.cuh\"\n"
      "using Kernel = primus_turbo::kernels::norm::Norm<",
      cuda_type(p.x_dtype), ", ", cuda_type(p.gamma_dtype), ", ", p.vectorized ? "true" : "false", ", ",
      hidden, ", ", p.layernorm() ? "true" : "false", ", ", p.residual() ? "true" : "false", fp8_args(p),
      ">;\n", p.fp8 ? "PT_JIT_EXPORT_NORM_FWD(Kernel)\n" : "PT_JIT_EXPORT_NORM(Kernel)\n");
  return r;
}

}  // namespace

Kernels load_kernels(const Problem& p, const std::string& arch) {
  const int hidden = specialized_hidden(p.hidden, p.vectorized);
  using Key = std::tuple<int, int32_t, int32_t, bool, int, std::string, int, int32_t>;
  static std::mutex mutex;
  static std::map<Key, Kernels> loaded;
  const Key key{static_cast<int>(p.kind), p.x_dtype, p.gamma_dtype, p.vectorized, hidden, arch, p.fp8,
                p.fp8 ? p.fp8_dtype : 0};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = loaded.find(key);
    if (it != loaded.end()) return it->second;
  }
  // May compile: not under the lock, so other modules can build in parallel.
  auto module = jit::get_module(module_request(p, hidden, arch));
  Kernels k{module->function<PtNormFwdFn>("pt_norm_fwd_run"),
            p.fp8 ? nullptr : module->function<PtNormBwdFn>("pt_norm_bwd_run")};
  std::lock_guard<std::mutex> lock(mutex);
  loaded.emplace(key, k);
  return k;
}

}  // namespace primus_turbo::norm
