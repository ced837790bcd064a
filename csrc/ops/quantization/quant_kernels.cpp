#include "ops/quantization/quant_kernels.h"

#include <tuple>

#include "core/error.h"
#include "core/tensor.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::quant {

namespace {

const char* cuda_type(int32_t dt) {
  if (const char* t = cuda_float_type(dt)) return t;
  PT_THROW(PT_ERROR_NOT_SUPPORTED, "quantization: unsupported input dtype ", dtype_name(dt));
}

const char* format_type(int32_t dt) {
  switch (dt) {
    case PT_FLOAT8_E4M3: return "E4M3";
    case PT_FLOAT8_E5M2: return "E5M2";
    case PT_FLOAT4_E2M1_X2: return "E2M1";
    default: PT_THROW(PT_ERROR_NOT_SUPPORTED, "quantization: unsupported quantized dtype ", dtype_name(dt));
  }
}

}  // namespace

Kernels load_kernels(int32_t x_dtype, int32_t q_dtype, const std::string& arch) {
  using Key = std::tuple<int32_t, int32_t, std::string>;
  static jit::LoadedCache<Key, Kernels> loaded;
  return loaded.get(Key{x_dtype, q_dtype, arch}, [&] {
    jit::ModuleRequest r;
    const char* fmt = format_type(q_dtype);
    r.name = str_cat("quant_", dtype_short_name(x_dtype), "_", fmt);
    r.needs_cutlass = false;
    r.arch = arch;
    r.source = str_cat(
        "#include \"primus_turbo/kernels/quantization/quantizer.cuh\"\n"
        "using Kernel = primus_turbo::kernels::quant::Quantizer<",
        cuda_type(x_dtype), ", primus_turbo::kernels::quant::", fmt, ">;\nPT_JIT_EXPORT_QUANTIZER(Kernel)\n");
    // May compile: not under the lock, so other modules can build in parallel.
    auto module = jit::get_module(r);
    Kernels k{module->function<PtQuantFn>("pt_quantize_run"), module->function<PtQuantAmaxFn>("pt_quant_amax_run"),
              module->function<PtDequantFn>("pt_dequantize_run"),
              module->function<PtQuantBatchFn>("pt_quantize_batch_run")};
    return k;
  });
}

}  // namespace primus_turbo::quant
