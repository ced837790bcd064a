#include "ops/moe/permute_kernels.h"

#include <tuple>

#include "core/error.h"
#include "core/tensor.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::moe {

namespace {

const char* cuda_type(int32_t dt) {
  if (const char* t = cuda_float_type(dt)) return t;
  PT_THROW(PT_ERROR_NOT_SUPPORTED, "MoE permute: unsupported dtype code ", dt);
}

}  // namespace

Kernels load_kernels(int32_t dtype, bool vectorized, const std::string& arch) {
  using Key = std::tuple<int32_t, bool, std::string>;
  static jit::LoadedCache<Key, Kernels> loaded;
  return loaded.get(Key{dtype, vectorized, arch}, [&] {
    jit::ModuleRequest r;
    r.name = str_cat("moe_permute_", dtype_short_name(dtype), vectorized ? "_vec" : "_scalar");
    r.needs_cutlass = false;
    r.arch = arch;
    r.source = str_cat("#include \"primus_turbo/kernels/moe/permute.cuh\"\n"
                       "using Kernel = primus_turbo::kernels::moe::MoePermute<",
                       cuda_type(dtype), ", ", vectorized ? "true" : "false", ">;\nPT_JIT_EXPORT_MOE_PERMUTE(Kernel)\n");
    auto module = jit::get_module(r);  // may compile: not under the lock
    Kernels k{module->function<PtMoePermuteFn>("pt_moe_build_map_run"),
              module->function<PtMoePermuteFn>("pt_moe_permute_run"),
              module->function<PtMoePermuteFn>("pt_moe_unpermute_run"),
              module->function<PtMoePermuteFn>("pt_moe_unpermute_bwd_run"),
              module->function<PtMoeRouteFn>("pt_moe_route_build_run"),
              module->function<PtMoeRouteFn>("pt_moe_rows_scatter_run"),
              module->function<PtMoeRouteFn>("pt_moe_rows_gather_run")};
    return k;
  });
}

}  // namespace primus_turbo::moe
