// Gated activation problems (SwiGLU, GeGLU, optionally with MoE routing probabilities and a row
// mask): argument checks shared by the forward and backward entry points, and the facts the
// kernel choice depends on.
#pragma once

#include <cstdint>

#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::gated {

enum class Act { kSilu = 0, kGelu = 1 };

const char* act_name(Act act);  // "silu", "gelu"

struct Problem {
  Act act = Act::kSilu;
  int64_t rows = 0;  // product of x's leading dimensions
  int64_t cols = 0;  // half of x's last dimension: the output's last dimension
  int32_t dtype = PT_BFLOAT16;
  bool vectorized = false;  // cols and every row pointer allow 16-byte accesses
  // FP8 forward modules: 0 none, PT_QUANT_ROWWISE or PT_QUANT_BLOCKWISE (1x128); the FP8 dtype.
  int fp8 = 0;
  int32_t fp8_dtype = PT_FLOAT8_E4M3;
};

// act is the C API's int (0 silu, 1 gelu), checked here.
Act checked_act(int32_t act);

// x [..., 2 * cols]; out [..., cols] of x's dtype; probs (float32) and row_mask (int64) with one
// element per row, each optional (null).
Problem make_fwd_problem(Act act, const pt_tensor* x, const pt_tensor* probs, const pt_tensor* row_mask,
                         const pt_tensor* out);

// FP8 forward: as make_fwd_problem with out optional (null: no high-precision output) and the FP8
// output q / scale_inv (ops/fp8_fusion/fp8_output.h) of the given granularity.
Problem make_fp8_fwd_problem(Act act, const pt_tensor* x, const pt_tensor* probs, const pt_tensor* row_mask,
                             const pt_tensor* out, const pt_tensor* q, const pt_tensor* scale_inv, int32_t granularity);

// dy like out; dx like x; dprobs (float32, one per row) optional.
Problem make_bwd_problem(Act act, const pt_tensor* dy, const pt_tensor* x, const pt_tensor* probs,
                         const pt_tensor* row_mask, const pt_tensor* dx, const pt_tensor* dprobs);

}  // namespace primus_turbo::gated
