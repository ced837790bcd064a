// The planned dense FP8 GEMM of gemm_fp8_ops.cpp and its training directions, for the other native
// ops built on them (the MXFP4 emulation of gemm_fp4_ops.cpp, swiglu_mlp_fp8_ops.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>

#include "bindings/torch/fp8_quantize.h"

namespace primus_turbo::torch_binding {

// out (+)= (x.q * x.s) @ (y.q * y.s)^T, both K-major, on the cached plan of this problem. Scales as
// the dense quantizer writes them (1x128 blocks MN-major: [kb, round_up(rows, 4)]). fast_accum:
// the GEMM may skip the FP32 promotion of its partial sums (PT_GEMM_FP8_FAST_ACCUM; forward
// products only, where the config asks for it).
void fp8_mm(const Quantized& x, const Quantized& y, const Tensor& out, float beta, int32_t device, void* stream,
            bool fast_accum = false);

// The checks of ops/gemm_fp8.py: check_hp_operands, in the same order and words, for op (e.g.
// "gemm_fp8", "gemm_fp4"); backward: M and N must be multiples of 16 too. Returns (M, K, N).
std::tuple<int64_t, int64_t, int64_t> check_dense_operands(const char* op, const Tensor& a, const Tensor& b, bool ta,
                                                           bool tb, ScalarType out_dtype, bool backward,
                                                           const char* k_reason, const char* bwd_reason);

// The inference op gemm_fp8 (no backward follows: the product only), with a_amax and fast_accum as
// below.
Tensor gemm_fp8_inference(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, ScalarType out_dtype,
                          ScalarType fwd_dtype, int64_t granularity, const Tensor* a_amax, bool fast_accum);

// The training forward of gemm_fp8_fwd: (out, a_bwd, sa_bwd, b_bwd, sb_bwd), the copies the
// backward reads (a along M, b along N), or placeholders without for_backward. a_amax (TENSORWISE,
// float32 [1], may be null): a's amax as the op that wrote a reported it; a's amax pass is skipped.
// fast_accum: the forward product may accumulate in the fast mode (the config's fast_accum; fp8_mm).
using Fp8ForwardResult = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;
Fp8ForwardResult gemm_fp8_training_forward(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                                           ScalarType out_dtype, ScalarType fwd_dtype, int64_t granularity,
                                           bool for_backward, const Tensor* a_amax, bool fast_accum);

// The forward of gemm_fp8_fwd_qb: b given already quantized, its copy along K (b.q [N, K], in the
// weight scaling of the granularity; a layer's per-step cache, checked here), only a quantized.
// (out, a_bwd, sa_bwd): a's copy along M, or placeholders without for_backward; b's copy along N
// for the backward is the caller's. a_amax and fast_accum as above.
using Fp8GivenBResult = std::tuple<Tensor, Tensor, Tensor>;
Fp8GivenBResult gemm_fp8_forward_given_b(const Tensor& a, const Quantized& b, bool trans_a, ScalarType out_dtype,
                                         ScalarType fwd_dtype, int64_t granularity, bool for_backward,
                                         const Tensor* a_amax, bool fast_accum);

// The backward of gemm_fp8_bwd: (grad_a, grad_b), placeholders for a gradient not asked for (or
// accumulated into main_grad). grad_amax as a_amax above, for the output gradient.
std::tuple<Tensor, Tensor> gemm_fp8_backward(const Tensor& grad, const Tensor& a_bwd, const Tensor& sa_bwd,
                                             const Tensor& b_bwd, const Tensor& sb_bwd, bool trans_a, bool trans_b,
                                             ScalarType grad_dtype, int64_t granularity, ScalarType a_dtype,
                                             ScalarType b_dtype, bool need_a, bool need_b,
                                             const std::optional<Tensor>& main_grad, const Tensor* grad_amax);

}  // namespace primus_turbo::torch_binding
