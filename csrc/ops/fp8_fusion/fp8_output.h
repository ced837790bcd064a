// The FP8 output of the fused memory-bound ops (RMSNorm, gated activations): argument checks
// shared by their entry points. The kernels' side is kernels/quantization/fused_fp8.cuh.
#pragma once

#include <cstdint>

#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::fp8_fusion {

constexpr int64_t kBlock = 128;

// granularity: PT_QUANT_ROWWISE or PT_QUANT_BLOCKWISE (1x128), checked; op names the caller.
int checked_granularity(const char* op, int32_t granularity);

// Scale entries per row: 1 (rowwise) or ceil(cols / 128).
int64_t scales_per_row(int granularity, int64_t cols);

// q: contiguous FP8 (E4M3 / E5M2), [rows, cols] as a 2-D view of any shape whose last dimension is
// cols; scale_inv: contiguous float32 with rows * scales_per_row elements. 16-byte aligned q.
// Returns q's dtype.
int32_t check_fp8_output(const char* op, const pt_tensor* q, const pt_tensor* scale_inv, int64_t rows, int64_t cols,
                         int granularity);

}  // namespace primus_turbo::fp8_fusion
