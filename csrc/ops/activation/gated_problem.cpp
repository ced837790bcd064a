#include "ops/activation/gated_problem.h"

#include "core/error.h"
#include "core/tensor.h"
#include "ops/fp8_fusion/fp8_output.h"

namespace primus_turbo::gated {

namespace {

// One element per row, contiguous, of the given dtype.
void check_per_row(const pt_tensor* t, const char* name, int32_t dtype, int64_t rows) {
  check_contiguous(t, name);
  PT_CHECK_ARG(t->dtype == dtype, "argument '", name, "' has dtype ", dtype_name(t->dtype), "; expected ",
               dtype_name(dtype));
  PT_CHECK_ARG(numel(*t) == rows, "argument '", name, "' has shape ", shape_string(*t), " (", numel(*t),
               " elements); expected ", rows, " elements, one per row of 'x'");
}

// out's shape: x's with the last dimension halved.
void check_half_shape(const pt_tensor* t, const char* name, const pt_tensor& x, int64_t cols) {
  bool same = t->ndim == x.ndim && t->shape[t->ndim - 1] == cols;
  for (int i = 0; same && i + 1 < x.ndim; ++i) same = t->shape[i] == x.shape[i];
  PT_CHECK_ARG(same, "argument '", name, "' has shape ", shape_string(*t), "; expected the shape of 'x' ",
               shape_string(x), " with the last dimension halved (", cols, ")");
  PT_CHECK_ARG(t->dtype == x.dtype, "argument '", name, "' has dtype ", dtype_name(t->dtype),
               "; expected the dtype of 'x' (", dtype_name(x.dtype), ")");
}

Problem make_problem(Act act, const pt_tensor* x, const pt_tensor* probs, const pt_tensor* row_mask) {
  check_contiguous(x, "x");
  PT_CHECK_ARG(x->ndim >= 1, "argument 'x' must have at least 1 dimension, got a scalar");
  PT_CHECK_ARG(is_float_dtype(x->dtype), "argument 'x' has dtype ",
               dtype_name(x->dtype), "; expected float32, float16 or bfloat16");
  const int64_t last = x->shape[x->ndim - 1];
  PT_CHECK_ARG(last >= 2 && last % 2 == 0, "argument 'x' has shape ", shape_string(*x),
               "; its last dimension must be even and at least 2 ([gate | up])");
  PT_CHECK_SUPPORTED(last / 2 <= INT32_MAX / 2, "gated activations support rows up to ", INT32_MAX / 2,
                     " output elements, got ", last / 2);
  Problem p;
  p.act = act;
  p.dtype = x->dtype;
  p.cols = last / 2;
  p.rows = 1;
  for (int i = 0; i + 1 < x->ndim; ++i) p.rows *= x->shape[i];
  if (probs != nullptr) check_per_row(probs, "probs", PT_FLOAT32, p.rows);
  if (row_mask != nullptr) check_per_row(row_mask, "row_mask", PT_INT64, p.rows);
  p.vectorized = p.cols % (16 / (dtype_bits(p.dtype) / 8)) == 0 && aligned16(x->data);
  return p;
}

}  // namespace

const char* act_name(Act act) { return act == Act::kSilu ? "silu" : "gelu"; }

Act checked_act(int32_t act) {
  PT_CHECK_ARG(act == 0 || act == 1, "argument 'act' is ", act, "; expected 0 (silu) or 1 (gelu)");
  return static_cast<Act>(act);
}

Problem make_fwd_problem(Act act, const pt_tensor* x, const pt_tensor* probs, const pt_tensor* row_mask,
                         const pt_tensor* out) {
  Problem p = make_problem(act, x, probs, row_mask);
  check_contiguous(out, "out");
  check_half_shape(out, "out", *x, p.cols);
  p.vectorized = p.vectorized && aligned16(out->data);
  return p;
}

Problem make_fp8_fwd_problem(Act act, const pt_tensor* x, const pt_tensor* probs, const pt_tensor* row_mask,
                             const pt_tensor* out, const pt_tensor* q, const pt_tensor* scale_inv, int32_t granularity) {
  constexpr const char* op = "gated activation FP8 forward";
  Problem p = make_problem(act, x, probs, row_mask);
  if (out != nullptr) {
    check_contiguous(out, "out");
    check_half_shape(out, "out", *x, p.cols);
    p.vectorized = p.vectorized && aligned16(out->data);
  }
  p.fp8 = fp8_fusion::checked_granularity(op, granularity);
  p.fp8_dtype = fp8_fusion::check_fp8_output(op, q, scale_inv, p.rows, p.cols, p.fp8);
  PT_CHECK_SUPPORTED(p.vectorized, op, " needs 16-byte accesses: the last dimension of 'x' halved (", p.cols,
                     ") must be a multiple of ", 16 / (dtype_bits(p.dtype) / 8), " and 'x' and 'out' 16-byte aligned");
  return p;
}

Problem make_bwd_problem(Act act, const pt_tensor* dy, const pt_tensor* x, const pt_tensor* probs,
                         const pt_tensor* row_mask, const pt_tensor* dx, const pt_tensor* dprobs) {
  Problem p = make_problem(act, x, probs, row_mask);
  check_contiguous(dy, "dy");
  check_half_shape(dy, "dy", *x, p.cols);
  check_like(dx, "dx", *x, "x");
  if (dprobs != nullptr) check_per_row(dprobs, "dprobs", PT_FLOAT32, p.rows);
  p.vectorized = p.vectorized && aligned16(dy->data) && aligned16(dx->data);
  return p;
}

}  // namespace primus_turbo::gated
