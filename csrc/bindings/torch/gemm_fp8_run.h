// The planned dense FP8 GEMM of gemm_fp8_ops.cpp, for the other native ops built on it (the MXFP4
// emulation of gemm_fp4_ops.cpp).
#pragma once

#include <cstdint>
#include <tuple>

#include "bindings/torch/fp8_quantize.h"

namespace primus_turbo::torch_binding {

// out (+)= (x.q * x.s) @ (y.q * y.s)^T, both K-major, on the cached plan of this problem. Scales as
// the dense quantizer writes them (1x128 blocks MN-major: [kb, round_up(rows, 4)]).
void fp8_mm(const Quantized& x, const Quantized& y, const Tensor& out, float beta, int32_t device, void* stream);

// The checks of ops/gemm_fp8.py: check_hp_operands, in the same order and words, for op (e.g.
// "gemm_fp8", "gemm_fp4"); backward: M and N must be multiples of 16 too. Returns (M, K, N).
std::tuple<int64_t, int64_t, int64_t> check_dense_operands(const char* op, const Tensor& a, const Tensor& b, bool ta,
                                                           bool tb, ScalarType out_dtype, bool backward,
                                                           const char* k_reason, const char* bwd_reason);

}  // namespace primus_turbo::torch_binding
