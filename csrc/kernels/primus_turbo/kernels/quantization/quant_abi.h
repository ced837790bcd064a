// The binary contract between the core and a quantization JIT module (kernels/quantization/).
// Kept apart from jit_abi.h so that changing it invalidates only the quantization modules.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// Quantizes a contiguous [m, k] tensor x. Two outputs, either may be absent (null q):
//   row: quantized along k (the last dim), q_row [m, k] (FP4: [m, k/2]);
//   col: quantized along m, stored as [k, m] (FP4: [k, m/2]) when col_transposed, else [m, k].
// A scale covers row_block elements of a row (col_block of a column); 0 means the scale comes
// from an amax computed beforehand (tensorwise / rowwise). block_2d: square row_block blocks
// whose scales the col output reuses (weights). Scales are fp32 (scale_inv = 1 / scale) or E8M0
// bytes (power of two, OCP MX).
typedef struct PtQuantParams {
  int64_t m, k;
  const void* x;
  void* q_row;
  void* s_row;
  void* q_col;
  void* s_col;
  int col_transposed;
  int row_block;
  int col_block;
  int block_2d;
  const float* amax_row;  // row_block == 0: per row [m] if amax_row_per_row, else one value
  int amax_row_per_row;
  const float* amax_col;  // col_block == 0: per column [k] if amax_col_per_col, else one value
  int amax_col_per_col;
  int e8m0;
  int rht;        // FP4: 16-point random Hadamard transform along the quantized dim
  int sr;         // FP4: stochastic rounding from a counter-based hash of (seed, element index)
  uint64_t seed;
  void* stream;
  int row_amax_inline;  // row output only, row_block == 0: each row's amax computed in the same
                        // kernel (a block per row, read twice, the second time from L2)
  int64_t s_row_ld_mn;  // > 0: 1-D block scales of the row output at s_row[block * s_row_ld_mn + row]
  int64_t s_col_ld_mn;  // > 0: the same for the transposed column output, s_col[block * ld + column of x]
  int num_sms;          // SMs of the device: sizes the grid-stride launches
  int64_t s_row_ld_2d;  // > 0: 2-D block scales of the row output at s_row[block_row * ld + block_col],
                        // the entries past the block count zeroed (the GEMM's padded layout)
  int64_t s_col_ld_2d;  // > 0: the same for the transposed column output
  int64_t col_rows;     // > 0: x is a stack of [col_rows, k] matrices (col_rows % 128 == 0) and the
                        // transposed column output is each one's: q_col [m / col_rows, k, col_rows],
                        // s_col [m / col_rows, k or k blocks, col_rows / 128] (no ld_mn / ld_2d), or
                        // per column of each matrix [m / col_rows, k] (col_block 0, amax_col likewise)
  int after_amax_pass;  // the stream's previous kernel is this tensor's amax pass: the register-tile
                        // kernel is launched as its programmatic dependent (loads its tile, then waits)
} PtQuantParams;

// Absolute maxima of a contiguous [m, k] tensor, accumulated with atomic max into buffers the
// caller zeroed: the whole tensor, per row [m], per column [k] (null: not wanted).
typedef struct PtQuantAmaxParams {
  int64_t m, k;
  const void* x;
  float* amax_tensor;
  float* amax_rows;
  float* amax_cols;
  void* stream;
  int num_sms;        // SMs of the device: sizes the grid-stride launch
  int64_t col_rows;   // > 0: x is a stack of [col_rows, k] matrices (col_rows % 128 == 0) and the
                      // column maxima are each one's: amax_cols [m / col_rows, k]
} PtQuantAmaxParams;

// out[r, c] = q[r, c] * scale_inv[(r / block_m) * ld_s + c / block_k]; q is [m, k] (FP4 packed
// [m, k/2]), out [m, k] contiguous.
typedef struct PtDequantParams {
  int64_t m, k;
  const void* q;
  const void* s;
  void* out;
  int64_t block_m, block_k, ld_s;
  int e8m0;
  void* stream;
} PtDequantParams;

// Up to two FP8 quantizations of one input dtype and format in one cooperative launch (no FP4,
// RHT or E8M0): for each job whose scales come from an amax (row_block or col_block 0), amax_row /
// amax_col point into scratch the kernel zeroes itself (tensorwise: amax_row == amax_col, one
// value; rowwise: amax_row [m] per row, amax_col [k] per column); 1-D block scales laid out
// blocks-major (s_row_ld_mn / s_col_ld_mn) get their padding rows zeroed by the kernel too.
typedef struct PtQuantBatch {
  PtQuantParams jobs[2];
  int count;
  void* stream;
  int num_sms;
} PtQuantBatch;

typedef int (*PtQuantFn)(const PtQuantParams* params, char* err, size_t err_len);
typedef int (*PtQuantBatchFn)(const PtQuantBatch* batch, char* err, size_t err_len);
typedef int (*PtQuantAmaxFn)(const PtQuantAmaxParams* params, char* err, size_t err_len);
typedef int (*PtDequantFn)(const PtDequantParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
