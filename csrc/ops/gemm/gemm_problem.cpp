#include "ops/gemm/gemm_problem.h"

#include "core/error.h"
#include "core/tensor.h"

namespace primus_turbo::gemm {

std::string Problem::layout_code() const {
  return str_cat("A", a.k_major ? "k" : "m", "B", b.k_major ? "k" : "n");
}

Problem make_problem(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d, bool trans_a,
                     bool trans_b, float alpha, float beta) {
  const Matrix2D ma = as_matrix(a, "a");
  const Matrix2D mb = as_matrix(b, "b");
  const Matrix2D md = as_matrix(d, "out");
  PT_CHECK_ARG(is_float_dtype(a->dtype), "argument 'a' has dtype ", dtype_name(a->dtype),
               "; expected float32, float16 or bfloat16");
  PT_CHECK_ARG(b->dtype == a->dtype, "argument 'b' has dtype ", dtype_name(b->dtype),
               "; expected the same dtype as 'a' (", dtype_name(a->dtype), ")");
  PT_CHECK_ARG(is_float_dtype(d->dtype), "output dtype ", dtype_name(d->dtype),
               " is not supported; expected float32, float16 or bfloat16");
  PT_CHECK_ARG(a->dtype != PT_FLOAT32 || d->dtype == PT_FLOAT32,
               "output dtype ", dtype_name(d->dtype),
               " is not supported for float32 inputs; expected float32");

  Problem p;
  p.ab_dtype = a->dtype;
  p.d_dtype = d->dtype;
  p.alpha = alpha;
  p.beta = beta;
  p.m = trans_a ? ma.cols : ma.rows;
  p.k = trans_a ? ma.rows : ma.cols;
  const int64_t kb = trans_b ? mb.cols : mb.rows;
  p.n = trans_b ? mb.rows : mb.cols;
  PT_CHECK_ARG(p.k == kb, "inner dimensions do not match: op(a) is [", p.m, ", ", p.k,
               "] (a ", shape_string(*a), ", trans_a=", trans_a, ") but op(b) is [", kb, ", ",
               p.n, "] (b ", shape_string(*b), ", trans_b=", trans_b, ")");
  PT_CHECK_ARG(md.rows == p.m && md.cols == p.n, "argument 'out' has shape ", shape_string(*d),
               "; expected [", p.m, ", ", p.n, "]");
  PT_CHECK_ARG(md.row_major, "argument 'out' must be row-major (unit stride on its last "
               "dimension)");

  p.a = Operand{ma.t->data, ma.ld, ma.row_major != trans_a, is_aligned16(ma)};
  p.b = Operand{mb.t->data, mb.ld, mb.row_major == trans_b, is_aligned16(mb)};
  p.d = d->data;
  p.ldd = md.ld;
  p.d_aligned16 = is_aligned16(md);
  return p;
}

}  // namespace primus_turbo::gemm
