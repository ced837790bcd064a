#include "ops/activation/gated_kernels.h"

#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "core/tensor.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::gated {

namespace {

const char* cuda_type(int32_t dt) {
  if (const char* t = cuda_float_type(dt)) return t;
  PT_THROW(PT_ERROR_NOT_SUPPORTED, "gated activation: unsupported dtype code ", dt);
}

jit::ModuleRequest module_request(const Problem& p, const std::string& arch) {
  jit::ModuleRequest r;
  const bool e4m3 = p.fp8_dtype == PT_FLOAT8_E4M3;
  r.name = str_cat("gated_", act_name(p.act), "_", dtype_short_name(p.dtype), "_", p.vectorized ? "vec" : "scalar",
                   p.fp8 ? str_cat("_fp8", p.fp8 == 1 ? "row" : "blk128", "_", e4m3 ? "e4m3" : "e5m2") : "");
  r.needs_cutlass = false;
  r.arch = arch;
  r.source = str_cat(
      "#include \"primus_turbo/kernels/activation/gated.cuh\"\n"
      "using Kernel = primus_turbo::kernels::gated::GatedAct<",
      cuda_type(p.dtype), ", ", static_cast<int>(p.act), ", ", p.vectorized ? "true" : "false",
      p.fp8 ? str_cat(", ", p.fp8, ", primus_turbo::kernels::quant::", e4m3 ? "E4M3" : "E5M2") : "",
      ">;\n", p.fp8 ? "PT_JIT_EXPORT_GATED_FWD(Kernel)\n" : "PT_JIT_EXPORT_GATED(Kernel)\n");
  return r;
}

}  // namespace

Kernels load_kernels(const Problem& p, const std::string& arch) {
  using Key = std::tuple<int, int32_t, bool, std::string, int, int32_t>;
  static std::mutex mutex;
  static std::map<Key, Kernels> loaded;
  const Key key{static_cast<int>(p.act), p.dtype, p.vectorized, arch, p.fp8, p.fp8 ? p.fp8_dtype : 0};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = loaded.find(key);
    if (it != loaded.end()) return it->second;
  }
  // May compile: not under the lock, so other modules can build in parallel.
  auto module = jit::get_module(module_request(p, arch));
  Kernels k{module->function<PtGatedActFn>("pt_gated_fwd_run"),
            p.fp8 ? nullptr : module->function<PtGatedActFn>("pt_gated_bwd_run")};
  std::lock_guard<std::mutex> lock(mutex);
  loaded.emplace(key, k);
  return k;
}

}  // namespace primus_turbo::gated
