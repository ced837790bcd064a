/* MX operands for Hopper's block-scaled FP8 GEMM (no MX / FP4 tensor cores on sm_90). */
#pragma once

#include "primus_turbo/primus_turbo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Restates a K-major MX operand with one fp32 power-of-two scale per 1x128 K block: for each row
   and 128-block, emax = max of its four E8M0 exponents, q_out = q * 2^(e - emax) (rounded to the
   FP8 grid only where the product falls below the smallest normal), scale_out = 2^(emax - 127)
   (2^(emax - 133) for FP4, whose values are written as E4M3 times 2^6).
   q: float8_e4m3 / float8_e5m2 [rows, k], or float4_e2m1_x2 / uint8 packed [rows, k / 2];
   scale: float8_e8m0 / uint8 [rows, ceil(k / 32)], or [ceil(rows / 32), ceil(k / 32)] (32x32
   blocks); q_out: q's FP8 dtype (E4M3 for FP4) [rows, k]; scale_out: float32 [rows, ceil(k / 128)].
   All contiguous, k a multiple of 16, q and q_out 16-byte aligned. No host synchronization. */
PT_API pt_status pt_mx_to_blocks(const pt_tensor* q, const pt_tensor* scale, pt_tensor* q_out, pt_tensor* scale_out,
                                 void* stream);
/* The same with scale_out blocks-major, float32 [ceil(k / 128), round_up(rows, 4)] (the layout the
   1x128 block-scaled FP8 GEMM reads, gemm_fp8.h); the padding entries are set to 0. */
PT_API pt_status pt_mx_to_blocks_mn_major(const pt_tensor* q, const pt_tensor* scale, pt_tensor* q_out,
                                          pt_tensor* scale_out, void* stream);
/* Compiles (or loads from the cache) the module for one input dtype without running it. Needs no GPU. */
PT_API pt_status pt_mx_to_blocks_prepare(int32_t q_dtype);

#ifdef __cplusplus
}
#endif
