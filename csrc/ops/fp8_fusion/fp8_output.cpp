#include "ops/fp8_fusion/fp8_output.h"

#include "core/error.h"
#include "core/tensor.h"
#include "primus_turbo/quantization.h"

namespace primus_turbo::fp8_fusion {

int checked_granularity(const char* op, int32_t granularity) {
  PT_CHECK_ARG(granularity == PT_QUANT_ROWWISE || granularity == PT_QUANT_BLOCKWISE, op,
               ": argument 'granularity' is ", granularity, "; expected ", PT_QUANT_ROWWISE, " (rowwise) or ",
               PT_QUANT_BLOCKWISE, " (1x128 blocks)");
  return granularity;
}

int64_t scales_per_row(int granularity, int64_t cols) {
  return granularity == PT_QUANT_ROWWISE ? 1 : (cols + kBlock - 1) / kBlock;
}

int32_t check_fp8_output(const char* op, const pt_tensor* q, const pt_tensor* scale_inv, int64_t rows, int64_t cols,
                         int granularity) {
  check_contiguous(q, "q");
  PT_CHECK_ARG(q->dtype == PT_FLOAT8_E4M3 || q->dtype == PT_FLOAT8_E5M2, op, ": argument 'q' has dtype ",
               dtype_name(q->dtype), "; expected float8_e4m3 or float8_e5m2");
  PT_CHECK_ARG(q->ndim >= 1 && q->shape[q->ndim - 1] == cols && numel(*q) == rows * cols, op,
               ": argument 'q' has shape ", shape_string(*q), "; expected ", rows, " rows of ", cols, " elements");
  PT_CHECK_ARG(rows == 0 || aligned16(q->data), op, ": argument 'q' must be 16-byte aligned");
  check_contiguous(scale_inv, "scale_inv");
  PT_CHECK_ARG(scale_inv->dtype == PT_FLOAT32, op, ": argument 'scale_inv' has dtype ", dtype_name(scale_inv->dtype),
               "; expected float32");
  const int64_t per_row = scales_per_row(granularity, cols);
  PT_CHECK_ARG(numel(*scale_inv) == rows * per_row, op, ": argument 'scale_inv' has shape ",
               shape_string(*scale_inv), "; expected ", rows, " x ", per_row, " elements (",
               granularity == PT_QUANT_ROWWISE ? "one per row" : "one per 128 elements of a row", ")");
  return q->dtype;
}

}  // namespace primus_turbo::fp8_fusion
