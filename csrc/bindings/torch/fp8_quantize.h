// FP8 quantization as the native GEMM ops compose it (dense gemm_fp8_ops.cpp, grouped
// grouped_gemm_fp8_ops.cpp): one pt_quantize_jobs call quantizes a GEMM's operands, each into its
// copy along its last dimension (row) and/or along its first, stored transposed (col), from one
// read of the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "bindings/torch/torch_binding.h"
#include "primus_turbo/quantization.h"

namespace primus_turbo::torch_binding {

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An FP8 operand quantized along its last dimension, with its scales as the quantizer wrote them.
struct Quantized {
  Tensor q;
  Tensor s;
  int32_t scaling;  // pt_fp8_scaling
};

// How an operand is quantized: a pt_quant_granularity (FP8: TENSORWISE, ROWWISE, BLOCKWISE with
// 128-element blocks), 2-D 128x128 blocks for a BLOCKWISE weight, and where 1-D block scales go:
// blocks-major as the dense 1x128 GEMM reads them (PT_QUANT_SCALES_MN_MAJOR), or [rows, blocks].
struct QuantSpec {
  ScalarType dtype;
  int64_t granularity;
  bool two_d = false;
  bool mn_major = false;
  bool pad4 = false;  // 2-D block scales with their last dim rounded up to 4 (PT_QUANT_SCALES_PAD4)
};

// (activation / gradient scaling, weight scaling) of a granularity; raises for the others.
std::pair<int32_t, int32_t> fp8_scalings(int64_t granularity, const char* op);

using QuantPair = std::pair<std::optional<Quantized>, std::optional<Quantized>>;

// One quantization of a batch: x [m, k] (contiguous) quantized along k (row, [m, k]) and / or along
// m stored transposed (col, [k, m]); x [b, m, k] (a weight stack: 16-bit, TENSORWISE, ROWWISE or
// 2-D blocks, m % 128 == 0) gives each matrix's, stacked ([b, m, k], [b, k, m], scales [b, ...]).
// Scales: TENSORWISE 0-dim; ROWWISE [rows, 1]; 1x128 [rows, kb]
// or, with mn_major, [kb, round_up(rows, 4)]; 2-D [ceil(rows/128), kb] (pad4: round_up(kb, 4)).
// A transient copy is read only by launches of the same call: it comes from the batch's one scratch
// allocation with the others and the amax scratch (returned from an op, it would keep that whole
// allocation alive).
struct QuantRequest {
  const Tensor* x;
  QuantSpec spec;
  bool want_row, want_col;
  bool row_transient = false, col_transient = false;
  // TENSORWISE: x's amax (float32 [1]) from the op that wrote x, or null: the amax pass is skipped.
  const Tensor* amax = nullptr;
};

// One or two quantizations (a GEMM's operands) in one pt_quantize_jobs call, which launches small
// FP8 ones together, amax included. Results in request order. kept_together: the copies that are not
// transient share one allocation too (views of it, each keeping all of it alive): for copies that
// are saved together and freed together, as a training forward's for its backward; an op that
// returns copies a caller may keep apart leaves it false.
std::vector<QuantPair> quantize_fp8_jobs(std::initializer_list<QuantRequest> requests, int32_t device, void* stream,
                                         const char* context, bool kept_together = false);

}  // namespace primus_turbo::torch_binding
