#include "ops/moe/permute_problem.h"

#include "core/error.h"
#include "core/tensor.h"

namespace primus_turbo::moe {

namespace {

void check_basic(const pt_tensor* t, const char* name) {
  check_descriptor(t, name);
  const int bits = dtype_bits(t->dtype);
  PT_CHECK_ARG(is_contiguous(*t), "argument '", name, "' with shape ", shape_string(*t), " must be contiguous");
  if (numel(*t) == 0) return;
  PT_CHECK_ARG(t->data != nullptr, "argument '", name, "' has a null data pointer");
  PT_CHECK_ARG(reinterpret_cast<uintptr_t>(t->data) % ((bits + 7) / 8) == 0, "argument '", name,
               "' is not aligned to its element size");
}

}  // namespace

void check_token_tensor(const pt_tensor* t, const char* name) {
  check_basic(t, name);
  PT_CHECK_ARG(t->ndim == 2, "argument '", name, "' has shape ", shape_string(*t), "; expected [rows, hidden]");
  PT_CHECK_ARG(is_float_dtype(t->dtype), "argument '", name,
               "' has dtype ", dtype_name(t->dtype), "; expected float32, float16 or bfloat16");
}

void check_rows(const Operand& o, int64_t rows, int64_t hidden, int32_t dtype) {
  check_token_tensor(o.t, o.name);
  PT_CHECK_ARG(o.t->shape[0] == rows || rows < 0, "argument '", o.name, "' has shape ", shape_string(*o.t),
               "; expected ", rows, " rows");
  PT_CHECK_ARG(o.t->shape[1] == hidden, "argument '", o.name, "' has shape ", shape_string(*o.t), "; expected hidden ",
               hidden);
  PT_CHECK_ARG(o.t->dtype == dtype, "argument '", o.name, "' has dtype ", dtype_name(o.t->dtype), "; expected ",
               dtype_name(dtype));
}

void check_matrix(const Operand& o, int64_t rows, int64_t cols, int32_t dtype, const char* what) {
  check_basic(o.t, o.name);
  PT_CHECK_ARG(o.t->ndim == 2 && o.t->shape[0] == rows && o.t->shape[1] == cols, "argument '", o.name, "' has shape ",
               shape_string(*o.t), "; expected [", rows, ", ", cols, "] (", what, ")");
  PT_CHECK_ARG(o.t->dtype == dtype, "argument '", o.name, "' has dtype ", dtype_name(o.t->dtype), "; expected ",
               dtype_name(dtype));
}

void check_vector(const Operand& o, int64_t n, int32_t dtype, const char* what) {
  check_basic(o.t, o.name);
  PT_CHECK_ARG(o.t->ndim == 1 && o.t->shape[0] == n, "argument '", o.name, "' has shape ", shape_string(*o.t),
               "; expected [", n, "] (", what, ")");
  PT_CHECK_ARG(o.t->dtype == dtype, "argument '", o.name, "' has dtype ", dtype_name(o.t->dtype), "; expected ",
               dtype_name(dtype));
}

int32_t check_probs_dtype(const pt_tensor* t, const char* name) {
  PT_CHECK_ARG(is_float_dtype(t->dtype), "argument '", name,
               "' has dtype ", dtype_name(t->dtype), "; expected float32, float16 or bfloat16");
  return t->dtype;
}

bool rows_vectorizable(int32_t dtype, int64_t hidden, std::initializer_list<const pt_tensor*> tensors) {
  const int vec = 16 / (dtype_bits(dtype) / 8);
  if (hidden % vec) return false;
  for (const pt_tensor* t : tensors) {
    if (t != nullptr && reinterpret_cast<uintptr_t>(t->data) % 16) return false;
  }
  return true;
}

}  // namespace primus_turbo::moe
