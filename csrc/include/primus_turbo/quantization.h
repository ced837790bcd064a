// Primus-Turbo C API: FP8 / FP4 quantization (included from primus_turbo.h).
#pragma once

#include "primus_turbo/primus_turbo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pt_quant_granularity {
  PT_QUANT_TENSORWISE = 0,    // one fp32 scale for the tensor
  PT_QUANT_ROWWISE = 1,       // one fp32 scale per row (or per column) over the whole dimension
  PT_QUANT_BLOCKWISE = 2,     // one fp32 scale per block of block_size (32, 64 or 128) elements
  PT_QUANT_MX_BLOCKWISE = 3,  // OCP MX: one E8M0 power-of-two scale per 32 elements
} pt_quant_granularity;

typedef enum pt_quant_flags {
  PT_QUANT_2D_BLOCK = 1,  // square block_size x block_size blocks (weights)
  PT_QUANT_RHT = 2,       // FP4: 16-point random Hadamard transform along the quantized dimension
  PT_QUANT_SR = 4,        // FP4: stochastic rounding, deterministic for a given seed
  PT_QUANT_SCALES_MN_MAJOR = 8,  // BLOCKWISE 1-D blocks: scales in the layout the 1x128 block-scaled
                                 // GEMM reads (see pt_quantize)
  PT_QUANT_SCALES_PAD4 = 16,     // BLOCKWISE 2-D blocks: the block count along the last scale dim
                                 // rounded up to 4, as the 128x128 block-scaled GEMM reads them
} pt_quant_flags;

// Quantizes a contiguous 2-D x [m, k] (float32/float16/bfloat16) with scale = FMT_MAX / amax per
// scale group (fp32 scales; amax clamped to 1e-30 so an all-zero group gives q = 0) or the E8M0
// exponent ceil(log2(amax / FMT_MAX)) (the smallest power of two under which nothing clips),
// rounding to nearest even and saturating.
// Outputs (either may be null; both are written from one read of x):
//   q_row / s_row: quantized along k. q_row [m, k] FP8 or [m, k/2] FP4 (low nibble = even element).
//                  s_row: 1 element (TENSORWISE), m (ROWWISE), [m, ceil(k/B)] (blockwise),
//                  [ceil(m/B), ceil(k/B)] (2-D).
//   q_col / s_col: quantized along m. col_transposed: q_col [k, m] (FP4 [k, m/2]), s_col k
//                  (ROWWISE), [k, ceil(m/B)], [ceil(k/B), ceil(m/B)] (2-D); otherwise q_col [m, k],
//                  s_col k (ROWWISE), [ceil(m/B), k]. FP4 column output is always transposed.
// PT_QUANT_SCALES_MN_MAJOR (BLOCKWISE, 1-D blocks, column output transposed): each output's scales
// are stored blocks-major with that output's rows contiguous and their count rounded up to 4, as
// the FP8 GEMM reads 1x128 scales (gemm_fp8.h): s_row [ceil(k/B), round_up(m, 4)], s_col
// [ceil(m/B), round_up(k, 4)]; the padding entries are set to 0. PT_QUANT_SCALES_PAD4 (BLOCKWISE
// 2-D blocks) likewise: s_row [ceil(m/B), round_up(ceil(k/B), 4)], s_col [ceil(k/B),
// round_up(ceil(m/B), 4)], padding 0.
// A stack of matrices, x [b, m, k] (16-bit input to FP8, TENSORWISE, ROWWISE or BLOCKWISE with
// 128-element blocks, m % 128 == 0, k % 8 == 0): each output and scale tensor is the 2-D one of
// every matrix, stacked ([b, ...]; ROWWISE: s_row b * m, s_col b * k elements); the column output
// must be transposed (q_col [b, k, m]). TENSORWISE keeps one scale for the whole stack. Expert
// weights get both orientations this way from one read (ROWWISE: an amax pass, then one more).
// s_* hold scale_inv (fp32, x ~ q * scale_inv) or E8M0 bytes (float8_e8m0fnu or uint8). TENSORWISE
// and ROWWISE reduce the amax on the device first (workspace: pt_quantize_workspace_bytes, 16-byte
// aligned; a ROWWISE stack's is that of (b * m, b * k)); nothing synchronizes with the host, so the
// call can be captured in a CUDA graph. An
// empty x writes nothing (scale tensors that still have elements are the caller's to fill).
PT_API pt_status pt_quantize(const pt_tensor* x, pt_tensor* q_row, pt_tensor* s_row, pt_tensor* q_col,
                             pt_tensor* s_col, int32_t granularity, int32_t block_size, int32_t col_transposed,
                             int32_t flags, uint64_t seed, void* workspace, size_t workspace_bytes,
                             void* stream);
PT_API size_t pt_quantize_workspace_bytes(int64_t m, int64_t k, int32_t granularity);

// One quantization of pt_quantize's arguments (seed 0: no FP4 stochastic rounding here).
typedef struct pt_quantize_job {
  const pt_tensor* x;
  pt_tensor* q_row;
  pt_tensor* s_row;
  pt_tensor* q_col;
  pt_tensor* s_col;
  int32_t granularity;
  int32_t block_size;
  int32_t col_transposed;
  int32_t flags;
  // TENSORWISE FP8 only, or null: x's amax reduced beforehand by the op that wrote x (float32, one
  // value on the device, e.g. pt_gated_act_fwd's amax). The job then skips its own amax pass.
  const pt_tensor* amax;
} pt_quantize_job;

// One or two quantizations (a GEMM's operands), with pt_quantize's results. Small FP8 ones of one
// input dtype and format run as one cooperative launch (their amax reductions included: no
// memset, no separate amax pass); the others as pt_quantize would. workspace:
// pt_quantize_jobs_workspace_bytes, 256-byte aligned, contents ignored (each job gets its share).
PT_API pt_status pt_quantize_jobs(const pt_quantize_job* jobs, int32_t count, void* workspace,
                                  size_t workspace_bytes, void* stream);
PT_API size_t pt_quantize_jobs_workspace_bytes(const pt_quantize_job* jobs, int32_t count);
// out [m, k] = q * scale_inv, scales laid out as pt_quantize writes them for q's layout: axis -1 (or
// 1): groups along the last dimension; axis 0: along the first (FP8 only; FP4 is packed along the
// last). flags: PT_QUANT_2D_BLOCK or 0.
PT_API pt_status pt_dequantize(const pt_tensor* q, const pt_tensor* scale_inv, pt_tensor* out,
                               int32_t granularity, int32_t block_size, int32_t axis, int32_t flags,
                               void* stream);
// Compiles (or loads) the sm_90a module for an input dtype and a quantized dtype. Needs no GPU.
PT_API pt_status pt_quantize_prepare(int32_t x_dtype, int32_t q_dtype);

#ifdef __cplusplus
}
#endif
