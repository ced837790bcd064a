#include "ops/attention/attention_kernels.h"

#include <tuple>

#include "core/env.h"
#include "core/error.h"
#include "core/tensor.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::attention {

Kernels load_kernels(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch) {
  using Key = std::tuple<int32_t, int32_t, int32_t, std::string>;
  static jit::LoadedCache<Key, Kernels> loaded;
  return loaded.get(Key{dtype, head_dim, head_dim_v, arch}, [&] {
    PT_CHECK_SUPPORTED(dtype == PT_BFLOAT16 || dtype == PT_FLOAT16, "attention: unsupported dtype ", dtype_name(dtype));
    jit::ModuleRequest r;
    r.name = str_cat("attention_", dtype_short_name(dtype), "_d", head_dim, "_dv", head_dim_v);
    r.arch = arch;
    r.source = str_cat("#include \"primus_turbo/kernels/attention/attention.cuh\"\n"
                       "using Kernel = primus_turbo::kernels::attention::Attention<",
                       cuda_float_type(dtype), ", ", head_dim, ", ", head_dim_v, ">;\nPT_JIT_EXPORT_ATTENTION(Kernel)\n");
    const auto module = jit::get_module(r);
    return Kernels{module->function<PtAttnFn>("pt_attn_fwd_run"), module->function<PtAttnFn>("pt_attn_bwd_run")};
  });
}

Kernels load_wgmma_kernels(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch) {
  static const bool wanted = env_value("PRIMUS_TURBO_ATTN_KERNEL").value_or("") == "wgmma";
  if (!wanted || arch != "90a" || head_dim != head_dim_v || (head_dim != 64 && head_dim != 128)) return Kernels{};
  using Key = std::tuple<int32_t, int32_t, std::string>;
  static jit::LoadedCache<Key, Kernels> loaded;
  return loaded.get(Key{dtype, head_dim, arch}, [&] {
    jit::ModuleRequest r;
    r.name = str_cat("attention_sm90_", dtype_short_name(dtype), "_d", head_dim);
    r.arch = arch;
    r.needs_cutlass = true;  // CuTe's wgmma atoms and swizzled layouts
    r.source = str_cat("#include \"primus_turbo/kernels/common/warp.cuh\"\n"
                       "#include \"primus_turbo/kernels/jit_export.cuh\"\n"
                       "#include \"primus_turbo/kernels/attention/attn_bwd_sm90.cuh\"\n"
                       "PT_JIT_EXPORT_ATTENTION_SM90(", cuda_float_type(dtype), ", ", head_dim, ", ", head_dim, ")\n");
    const auto module = jit::get_module(r);
    return Kernels{module->function<PtAttnFn>("pt_attn_fwd_run"), module->function<PtAttnFn>("pt_attn_bwd_run")};
  });
}

}  // namespace primus_turbo::attention
