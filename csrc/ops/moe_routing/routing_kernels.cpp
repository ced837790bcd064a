#include "ops/moe_routing/routing_kernels.h"

#include <utility>

#include "core/error.h"
#include "core/tensor.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::moe_routing {

namespace {

const char* cuda_type(int32_t dt) {
  if (const char* t = cuda_float_type(dt)) return t;
  PT_THROW(PT_ERROR_NOT_SUPPORTED, "MoE routing: unsupported dtype code ", dt);
}

constexpr const char* kHeader = "#include \"primus_turbo/kernels/moe_routing/routing.cuh\"\n";

}  // namespace

RoutingKernels load_routing(int32_t dtype, const std::string& arch) {
  using Key = std::pair<int32_t, std::string>;
  static jit::LoadedCache<Key, RoutingKernels> loaded;
  return loaded.get(Key{dtype, arch}, [&] {
    jit::ModuleRequest r;
    r.name = str_cat("moe_routing_", dtype_short_name(dtype));
    r.needs_cutlass = false;
    r.arch = arch;
    r.source = str_cat(kHeader, "using Kernel = primus_turbo::kernels::moe_routing::Routing<", cuda_type(dtype),
                       ">;\nPT_JIT_EXPORT_MOE_ROUTING(Kernel)\n");
    auto module = jit::get_module(r);  // may compile: not under the lock
    RoutingKernels k{module->function<PtRoutingFwdFn>("pt_routing_fwd_run"),
                     module->function<PtRoutingBwdFn>("pt_routing_bwd_run")};
    return k;
  });
}

UtilKernels load_utils(const std::string& arch) {
  static jit::LoadedCache<std::string, UtilKernels> loaded;
  return loaded.get(arch, [&] {
    jit::ModuleRequest r;
    r.name = "moe_routing_utils";
    r.needs_cutlass = false;
    r.arch = arch;
    r.source = str_cat(kHeader, "PT_JIT_EXPORT_MOE_ROUTING_UTILS\n");
    auto module = jit::get_module(r);
    UtilKernels k{module->function<PtMultihotFn>("pt_multihot_fwd_run"),
                  module->function<PtMultihotFn>("pt_multihot_bwd_run"),
                  module->function<PtTokensMaskFn>("pt_tokens_mask_run")};
    return k;
  });
}

}  // namespace primus_turbo::moe_routing
