// Primus-Turbo C API: RMSNorm and gated activations (SwiGLU, GeGLU) that also write their output
// quantized to FP8 in the same pass, so that an FP8 GEMM reads it directly.
//
// The value quantized is the op's output rounded to x's dtype: q and scale_inv are bit-identical to
// pt_quantize of that output along its last dimension (scale = FMT_MAX / max(amax, 1e-30),
// scale_inv = 1 / scale stored as float32, round to nearest even, saturating). granularity:
//   PT_QUANT_ROWWISE   one scale per row; scale_inv has one element per row;
//   PT_QUANT_BLOCKWISE one scale per 128 consecutive elements of a row (the last block of a row
//                      may be partial); scale_inv [rows, ceil(cols / 128)] row-major.
// q: contiguous float8_e4m3 or float8_e5m2 with the output's shape (its dtype picks the format),
// 16-byte aligned. The high-precision output is optional (null: not written). These kernels need
// 16-byte accesses: the output's last dimension a multiple of 16 bytes of x's dtype (8 elements
// for float16/bfloat16, 4 for float32) and 16-byte aligned tensors; otherwise PT_ERROR_NOT_SUPPORTED.
// The backward is the plain op's (pt_rmsnorm_bwd, pt_rmsnorm_residual_bwd, pt_gated_act_bwd).
#pragma once

#include "primus_turbo/primus_turbo.h"

#ifdef __cplusplus
extern "C" {
#endif

// y = RMSNorm(s) as pt_rmsnorm_fwd with s = x, or s = x + residual (in x's dtype, written to
// residual_out) when residual is not null (then as pt_rmsnorm_residual_fwd). y may be null.
PT_API pt_status pt_rmsnorm_fp8_fwd(const pt_tensor* x, const pt_tensor* residual, const pt_tensor* gamma,
                                    pt_tensor* y, pt_tensor* residual_out, pt_tensor* q, pt_tensor* scale_inv,
                                    pt_tensor* rstd, int32_t granularity, float eps, int32_t zero_centered,
                                    void* stream);

// out = act(gate) * up * probs[row] as pt_gated_act_fwd (act 0 SiLU, 1 GELU; probs and row_mask
// optional; masked rows give zeros and the all-zero scale). out may be null.
PT_API pt_status pt_gated_act_fp8_fwd(int32_t act, const pt_tensor* x, const pt_tensor* probs,
                                      const pt_tensor* row_mask, pt_tensor* out, pt_tensor* q, pt_tensor* scale_inv,
                                      int32_t granularity, void* stream);

// Compile (or load from the cache) the sm_90a modules that contiguous, aligned tensors use, without
// running them. fp8_dtype: PT_FLOAT8_E4M3 or PT_FLOAT8_E5M2. Need no GPU.
PT_API pt_status pt_rmsnorm_fp8_prepare(int32_t residual, int32_t dtype, int32_t gamma_dtype, int64_t hidden,
                                        int32_t granularity, int32_t fp8_dtype);
PT_API pt_status pt_gated_act_fp8_prepare(int32_t act, int32_t dtype, int64_t cols, int32_t granularity,
                                          int32_t fp8_dtype);

#ifdef __cplusplus
}
#endif
