// Quantization problems: argument checks of the C entry points and the facts the launch needs
// (sizes, formats, which outputs, how scales are laid out).
#pragma once

#include <cstddef>
#include <cstdint>

#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::quant {

struct QuantProblem {
  int64_t m = 0, k = 0;  // x is [m, k] (a stack [b, m / b, k]: its rows)
  int64_t col_rows = 0;   // a stack: rows of each matrix, whose column output is its own (0: one matrix)
  int32_t x_dtype = PT_BFLOAT16;
  int32_t q_dtype = PT_FLOAT8_E4M3;  // PT_FLOAT4_E2M1_X2 for FP4 (uint8 storage accepted)
  int32_t granularity = PT_QUANT_TENSORWISE;
  int32_t block = 0;  // elements per scale along the quantized dim (blockwise / MX)
  bool row = false, col = false, col_transposed = false;
  bool block_2d = false, rht = false, sr = false;
  bool mn_major = false;  // PT_QUANT_SCALES_MN_MAJOR
  bool pad4 = false;      // PT_QUANT_SCALES_PAD4
  bool fp4() const { return q_dtype == PT_FLOAT4_E2M1_X2; }
};

QuantProblem make_quant_problem(const pt_tensor* x, const pt_tensor* q_row, const pt_tensor* s_row,
                                const pt_tensor* q_col, const pt_tensor* s_col, int32_t granularity,
                                int32_t block_size, int32_t col_transposed, int32_t flags);

// Bytes of device scratch for the amax of tensorwise / rowwise problems (0 for block scales): of
// an [m, k] tensor, and of a problem (a ROWWISE stack [b, m / b, k] needs that of [m, b * k]).
size_t workspace_bytes(int64_t m, int64_t k, int32_t granularity);
size_t workspace_bytes(const QuantProblem& p);

struct DequantProblem {
  int64_t m = 0, k = 0;  // out is [m, k]
  int32_t q_dtype = PT_FLOAT8_E4M3;
  int32_t out_dtype = PT_BFLOAT16;
  bool e8m0 = false;
  int64_t block_m = 1, block_k = 1, ld_s = 0;  // scale of (r, c): s[(r / block_m) * ld_s + c / block_k]
};

DequantProblem make_dequant_problem(const pt_tensor* q, const pt_tensor* scale_inv, const pt_tensor* out,
                                    int32_t granularity, int32_t block_size, int32_t axis, int32_t flags);

}  // namespace primus_turbo::quant
