// The JIT modules of quantization: one per (input dtype, quantized format, arch), each exporting
// quantize, amax, dequantize and the batched quantize (kernels/quantization/quantizer.cuh).
#pragma once

#include <string>

#include "primus_turbo/kernels/quantization/quant_abi.h"

namespace primus_turbo::quant {

struct Kernels {
  PtQuantFn quantize = nullptr;
  PtQuantAmaxFn amax = nullptr;
  PtDequantFn dequantize = nullptr;
  PtQuantBatchFn batch = nullptr;
};

// Builds or loads the module (memoized). x_dtype: float32/float16/bfloat16 (the dequantized dtype
// for dequantize); q_dtype: float8_e4m3fn, float8_e5m2 or float4_e2m1fn_x2.
Kernels load_kernels(int32_t x_dtype, int32_t q_dtype, const std::string& arch);

}  // namespace primus_turbo::quant
