#include "ops/grouped_gemm/grouped_gemm_problem.h"

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace primus_turbo::grouped_gemm {

namespace {

bool has_zero_dim(const pt_tensor& t) {
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) return true;
  }
  return false;
}

void check_tensor(const pt_tensor* t, const char* name, int ndim) {
  PT_CHECK_ARG(t != nullptr, "argument '", name, "' is null");
  PT_CHECK_ARG(t->ndim == ndim, "argument '", name, "' must be ", ndim, "-D, got ", t->ndim,
               "-D with shape ", shape_string(*t));
  dtype_bits(t->dtype);  // validates the code
  for (int i = 0; i < t->ndim; ++i) {
    PT_CHECK_ARG(t->shape[i] >= 0, "argument '", name, "' has a negative dimension ",
                 shape_string(*t));
  }
  PT_CHECK_ARG(has_zero_dim(*t) || is_packed(*t), "argument '", name,
               "' must be contiguous (row-major, no padding); got shape ", shape_string(*t));
}

}  // namespace

std::string Problem::layout_code() const {
  if (wgrad) return "AmBn";
  return trans_b ? "AkBk" : "AkBn";
}

Problem make_problem(const pt_grouped_gemm_args* args) {
  PT_CHECK_ARG(args != nullptr, "grouped GEMM arguments are null");
  Problem p;
  p.wgrad = args->wgrad != 0;
  p.trans_b = args->trans_b != 0;
  p.num_sms = args->num_sms;
  PT_CHECK_ARG(p.num_sms >= 0, "grouped_gemm: num_sms must be >= 0 (0: all SMs), got ", p.num_sms);
  check_tensor(args->group_lens, "group_lens", 1);
  PT_CHECK_ARG(args->group_lens->dtype == PT_INT64, "argument 'group_lens' has dtype ",
               dtype_name(args->group_lens->dtype), "; expected int64");
  p.groups = args->group_lens->shape[0];
  PT_CHECK_ARG(p.groups >= 1, "argument 'group_lens' must hold at least one group, got shape ",
               shape_string(*args->group_lens));
  if (args->group_offs) {
    check_tensor(args->group_offs, "group_offs", 1);
    PT_CHECK_ARG(args->group_offs->dtype == PT_INT64, "argument 'group_offs' has dtype ",
                 dtype_name(args->group_offs->dtype), "; expected int64");
    check_shape(args->group_offs, "group_offs", {p.groups + 1});
  }

  check_tensor(args->a, "a", 2);
  p.dtype = args->a->dtype;
  PT_CHECK_ARG(p.dtype == PT_BFLOAT16 || p.dtype == PT_FLOAT16, "argument 'a' has dtype ",
               dtype_name(p.dtype), "; expected bfloat16 or float16");
  p.rows = args->a->shape[0];
  p.k = args->a->shape[1];
  const char* b_name = p.wgrad ? "grad_out" : "b";
  check_tensor(args->b, b_name, p.wgrad ? 2 : 3);
  PT_CHECK_ARG(args->b->dtype == p.dtype, "argument '", b_name, "' has dtype ",
               dtype_name(args->b->dtype), "; expected the dtype of 'a' (", dtype_name(p.dtype),
               ")");
  check_tensor(args->d, "out", p.wgrad ? 3 : 2);
  PT_CHECK_ARG(args->d->dtype == p.dtype, "argument 'out' has dtype ", dtype_name(args->d->dtype),
               "; expected the dtype of 'a' (", dtype_name(p.dtype), ")");
  if (!p.wgrad) {
    const pt_tensor& b = *args->b;
    PT_CHECK_ARG(b.shape[0] == p.groups, "argument 'b' has ", b.shape[0],
                 " groups (shape ", shape_string(b), ") but group_lens has ", p.groups);
    const int64_t kb = p.trans_b ? b.shape[2] : b.shape[1];
    p.n = p.trans_b ? b.shape[1] : b.shape[2];
    PT_CHECK_ARG(kb == p.k, "inner dimensions do not match: 'a' is [", p.rows, ", ", p.k,
                 "] but 'b' ", shape_string(b), " has K = ", kb, " (trans_b=", p.trans_b, ")");
    check_shape(args->d, "out", {p.rows, p.n});
  } else {
    PT_CHECK_ARG(args->b->shape[0] == p.rows, "argument 'grad_out' has shape ",
                 shape_string(*args->b), "; expected ", p.rows, " rows like 'a'");
    p.n = args->b->shape[1];
    if (p.trans_b) {
      check_shape(args->d, "out", {p.groups, p.n, p.k});
    } else {
      check_shape(args->d, "out", {p.groups, p.k, p.n});
    }
  }
  p.group_lens = static_cast<const int64_t*>(args->group_lens->data);
  p.group_offs = args->group_offs ? static_cast<const int64_t*>(args->group_offs->data) : nullptr;
  p.a = args->a->data;
  p.b = args->b->data;
  p.d = args->d->data;
  p.aligned16 = aligned16(p.a) && aligned16(p.b) && aligned16(p.d);
  return p;
}

}  // namespace primus_turbo::grouped_gemm
