// MXFP4 operands for the native GEMM ops that emulate FP4 on Hopper's FP8 tensor cores (dense
// gemm_fp4_ops.cpp, grouped grouped_gemm_fp8_ops.cpp): quantization to packed E2M1 with E8M0
// scales per 32, and the restatement as E4M3 with one fp32 power-of-two scale per 1x128 K block.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "bindings/torch/fp8_quantize.h"
#include "bindings/torch/scratch.h"

namespace primus_turbo::torch_binding {

// A packed MXFP4 operand quantized along its last dimension: q [rows, K/2], E8M0 scales [rows,
// ceil(K/32)] (or [ceil(rows/32), ceil(K/32)] for 32x32 blocks) as uint8.
struct Fp4 {
  Tensor q;
  Tensor s;
};

// x [m, k] quantized to MXFP4 along k (row, [m, k/2]) and/or along m stored transposed (col,
// [k, m/2]). flags: PT_QUANT_2D_BLOCK / RHT / SR; seed: stochastic rounding's. A copy whose Scratch
// is given (one only this call's launches read) comes from it, else from its own allocations.
std::pair<std::optional<Fp4>, std::optional<Fp4>> quantize_fp4(const Tensor& x, bool want_row, bool want_col,
                                                               int32_t flags, int64_t seed, int32_t device,
                                                               void* stream, Scratch* row_scratch = nullptr,
                                                               Scratch* col_scratch = nullptr);

// Scratch bytes of one MXFP4 copy [rows, cols] (32x32 blocks with two_d).
size_t fp4_scratch_bytes(int64_t rows, int64_t cols, bool two_d);

// x as E4M3 [rows, K] with fp32 scales per row and 1x128 K block: [ceil(K/128), round_up(rows, 4)]
// with mn_major (the dense GEMM's layout), else [rows, ceil(K/128)] (the grouped GEMM's A and B).
// From scratch where given.
Quantized restate(const Fp4& x, bool mn_major, int32_t device, void* stream, Scratch* scratch = nullptr);

// Scratch bytes of the restatement of a [rows, k] operand.
size_t restated_scratch_bytes(int64_t rows, int64_t k, bool mn_major);

}  // namespace primus_turbo::torch_binding
