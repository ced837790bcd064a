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

namespace {

// PRIMUS_TURBO_ATTN_KERNEL=mma keeps the mma.sync kernels on Hopper too; read once per process.
const std::string& kernel_choice() {
  static const std::string choice = env_value("PRIMUS_TURBO_ATTN_KERNEL").value_or("");
  return choice;
}

// A module of the sm90 kernels (CuTe's wgmma atoms, swizzled layouts and barriers).
jit::ModuleRequest sm90_request(const std::string& name, const char* header, const char* export_macro, int32_t dtype,
                                int32_t head_dim, int32_t head_dim_v, const std::string& arch) {
  jit::ModuleRequest r;
  r.name = name;
  r.arch = arch;
  r.needs_cutlass = true;
  r.source = str_cat("#include \"primus_turbo/kernels/common/warp.cuh\"\n"
                     "#include \"primus_turbo/kernels/jit_export.cuh\"\n"
                     "#include \"primus_turbo/kernels/attention/", header, "\"\n", export_macro, "(",
                     cuda_float_type(dtype), ", ", head_dim, ", ", head_dim_v, ")\n");
  return r;
}

// The entry point of the sm90 module of one direction, memoized per direction, dtype and head dims
// (an integer key: this lookup runs on every call).
PtAttnFn load_sm90(bool backward, int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch) {
  using Key = std::tuple<bool, int32_t, int32_t, int32_t>;
  static jit::LoadedCache<Key, PtAttnFn> loaded;
  return loaded.get(Key{backward, dtype, head_dim, head_dim_v}, [&] {
    const char* dir = backward ? "bwd" : "fwd";
    const std::string name =
        str_cat("attention_", dir, "_sm90_", dtype_short_name(dtype), "_d", head_dim, "_dv", head_dim_v);
    const char* macro = backward ? "PT_JIT_EXPORT_ATTENTION_SM90_BWD" : "PT_JIT_EXPORT_ATTENTION_SM90_FWD";
    return jit::get_module(sm90_request(name, str_cat("attn_", dir, "_sm90.cuh").c_str(), macro, dtype, head_dim,
                                        head_dim_v, arch))
        ->function<PtAttnFn>(str_cat("pt_attn_", dir, "_run").c_str());
  });
}

}  // namespace

PtAttnFn load_sm90_forward(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch) {
  if (arch != "90a" || kernel_choice() == "mma") return nullptr;
  return load_sm90(false, dtype, head_dim, head_dim_v, arch);
}

bool sm90_backward_head_dims(int64_t d, int64_t dv) {
  return (d == dv && (d == 64 || d == 96 || d == 128)) || (d == 192 && dv == 128);
}

bool sm90_fused_dq_head_dims(int64_t d, int64_t dv) { return d == 128 && dv == 128; }

PtAttnFn load_sm90_backward(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch) {
  if (arch != "90a" || kernel_choice() == "mma" || !sm90_backward_head_dims(head_dim, head_dim_v)) return nullptr;
  return load_sm90(true, dtype, head_dim, head_dim_v, arch);
}

bool fp8_head_dims(int64_t d, int64_t dv) {
  return (d == dv && (d == 64 || d == 96 || d == 128)) || (d == 192 && dv == 128);
}

PtAttnFp8Fn load_fp8_forward(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch) {
  PT_CHECK_SUPPORTED(arch == "90a", "FP8 attention runs on Hopper (sm_90a) only; this device is sm_", arch);
  PT_CHECK_SUPPORTED(dtype == PT_BFLOAT16 || dtype == PT_FLOAT16, "FP8 attention: unsupported dtype ",
                     dtype_name(dtype));
  PT_CHECK_SUPPORTED(fp8_head_dims(head_dim, head_dim_v), "FP8 attention supports head dims 64, 96 and 128 (q/k and ",
                     "v alike) and 192 for q/k with 128 for v; got ", head_dim, "/", head_dim_v,
                     ": use flash_attn_func (16-bit) for this shape");
  using Key = std::tuple<int32_t, int32_t, int32_t>;
  static jit::LoadedCache<Key, PtAttnFp8Fn> loaded;
  return loaded.get(Key{dtype, head_dim, head_dim_v}, [&] {
    const jit::ModuleRequest r =
        sm90_request(str_cat("attention_fp8_", dtype_short_name(dtype), "_d", head_dim, "_dv", head_dim_v),
                     "attn_fwd_fp8_sm90.cuh", "PT_JIT_EXPORT_ATTENTION_FP8", dtype, head_dim, head_dim_v, arch);
    return jit::get_module(r)->function<PtAttnFp8Fn>("pt_attn_fp8_fwd_run");
  });
}

bool fp8_backward_head_dims(int64_t d, int64_t dv) { return d == dv && (d == 64 || d == 96 || d == 128); }

PtAttnFp8BwdFn load_fp8_backward(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch) {
  PT_CHECK_SUPPORTED(arch == "90a", "the FP8 attention backward runs on Hopper (sm_90a) only; this device is sm_",
                     arch);
  PT_CHECK_SUPPORTED(dtype == PT_BFLOAT16 || dtype == PT_FLOAT16, "FP8 attention backward: unsupported dtype ",
                     dtype_name(dtype));
  PT_CHECK_SUPPORTED(fp8_backward_head_dims(head_dim, head_dim_v), "the FP8 attention backward supports head dims ",
                     "64, 96 and 128 (q/k and v alike); got ", head_dim, "/", head_dim_v);
  using Key = std::tuple<int32_t, int32_t, int32_t>;
  static jit::LoadedCache<Key, PtAttnFp8BwdFn> loaded;
  return loaded.get(Key{dtype, head_dim, head_dim_v}, [&] {
    const jit::ModuleRequest r =
        sm90_request(str_cat("attention_fp8_bwd_", dtype_short_name(dtype), "_d", head_dim, "_dv", head_dim_v),
                     "attn_bwd_fp8_sm90.cuh", "PT_JIT_EXPORT_ATTENTION_FP8_BWD", dtype, head_dim, head_dim_v, arch);
    return jit::get_module(r)->function<PtAttnFp8BwdFn>("pt_attn_fp8_bwd_run");
  });
}

}  // namespace primus_turbo::attention
