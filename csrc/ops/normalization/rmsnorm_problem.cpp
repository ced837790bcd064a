#include "ops/normalization/rmsnorm_problem.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/tensor.h"

namespace primus_turbo::rmsnorm {

namespace {

bool is_float_dtype(int32_t dt) { return dt == PT_FLOAT32 || dt == PT_FLOAT16 || dt == PT_BFLOAT16; }

int64_t numel(const pt_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// Row-major contiguous; a dimension of size 1 may have any stride, and an empty tensor any strides.
bool is_contiguous(const pt_tensor& t) {
  if (numel(t) == 0) return true;
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

std::string strides_string(const pt_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += str_cat(i ? ", " : "", t.strides[i]);
  return s + "]";
}

// Non-null descriptor, sane rank and sizes, a known dtype, contiguous, data present and aligned
// to its element (the scalar kernels' minimum).
void check_tensor(const pt_tensor* t, const char* name) {
  PT_CHECK_ARG(t != nullptr, "argument '", name, "' is null");
  PT_CHECK_ARG(t->ndim >= 0 && t->ndim <= PT_MAX_DIMS, "argument '", name, "' has ", t->ndim,
               " dimensions; expected 0 to ", PT_MAX_DIMS);
  for (int i = 0; i < t->ndim; ++i) {
    PT_CHECK_ARG(t->shape[i] >= 0, "argument '", name, "' has a negative dimension ",
                 shape_string(*t));
  }
  const int bits = dtype_bits(t->dtype);  // validates the code
  PT_CHECK_ARG(is_contiguous(*t), "argument '", name, "' with shape ", shape_string(*t),
               " and strides ", strides_string(*t), " must be contiguous (make it contiguous first)");
  if (numel(*t) == 0) return;
  PT_CHECK_ARG(t->data != nullptr, "argument '", name, "' has a null data pointer");
  PT_CHECK_ARG(reinterpret_cast<uintptr_t>(t->data) % (bits / 8) == 0, "argument '", name,
               "' is not aligned to its element size (", bits / 8, " bytes)");
}

void check_same_shape(const pt_tensor* t, const char* name, const pt_tensor& like, const char* like_name) {
  bool same = t->ndim == like.ndim;
  for (int i = 0; same && i < t->ndim; ++i) same = t->shape[i] == like.shape[i];
  PT_CHECK_ARG(same, "argument '", name, "' has shape ", shape_string(*t), "; expected the shape of '",
               like_name, "' ", shape_string(like));
}

void check_like(const pt_tensor* t, const char* name, const pt_tensor& like, const char* like_name) {
  check_tensor(t, name);
  check_same_shape(t, name, like, like_name);
  PT_CHECK_ARG(t->dtype == like.dtype, "argument '", name, "' has dtype ", dtype_name(t->dtype),
               "; expected the dtype of '", like_name, "' (", dtype_name(like.dtype), ")");
}

void check_rstd(const pt_tensor* rstd, int64_t rows) {
  check_tensor(rstd, "rstd");
  PT_CHECK_ARG(rstd->dtype == PT_FLOAT32, "argument 'rstd' has dtype ", dtype_name(rstd->dtype),
               "; expected float32");
  PT_CHECK_ARG(numel(*rstd) == rows, "argument 'rstd' has shape ", shape_string(*rstd), " (",
               numel(*rstd), " elements); expected ", rows, " elements, one per row of 'x'");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int vector_width(int32_t x_dtype) { return 16 / (dtype_bits(x_dtype) / 8); }

Problem make_problem(const pt_tensor* x, const pt_tensor* gamma) {
  check_tensor(x, "x");
  PT_CHECK_ARG(x->ndim >= 1, "argument 'x' must have at least 1 dimension, got a scalar");
  PT_CHECK_ARG(is_float_dtype(x->dtype), "argument 'x' has dtype ", dtype_name(x->dtype),
               "; expected float32, float16 or bfloat16");
  Problem p;
  p.x_dtype = x->dtype;
  p.hidden = x->shape[x->ndim - 1];
  p.rows = 1;
  for (int i = 0; i < x->ndim - 1; ++i) p.rows *= x->shape[i];
  PT_CHECK_ARG(p.hidden >= 1, "argument 'x' has shape ", shape_string(*x),
               "; its last dimension (the normalized one) must be at least 1");
  PT_CHECK_SUPPORTED(p.hidden <= kMaxHidden, "RMSNorm supports a last dimension up to ", kMaxHidden,
                     ", got ", p.hidden, " (x ", shape_string(*x), ")");

  check_tensor(gamma, "gamma");
  PT_CHECK_ARG(gamma->ndim == 1 && gamma->shape[0] == p.hidden, "argument 'gamma' has shape ",
               shape_string(*gamma), "; expected [", p.hidden, "] (the last dimension of 'x')");
  PT_CHECK_ARG(gamma->dtype == x->dtype || gamma->dtype == PT_FLOAT32, "argument 'gamma' has dtype ",
               dtype_name(gamma->dtype), "; expected the dtype of 'x' (", dtype_name(x->dtype),
               ") or float32");
  p.gamma_dtype = gamma->dtype;
  return p;
}

Problem make_fwd_problem(const pt_tensor* x, const pt_tensor* gamma, const pt_tensor* y,
                         const pt_tensor* rstd, float eps) {
  Problem p = make_problem(x, gamma);
  check_like(y, "y", *x, "x");
  check_rstd(rstd, p.rows);
  PT_CHECK_ARG(std::isfinite(eps) && eps >= 0.0f, "argument 'eps' must be finite and non-negative, got ",
               eps);
  p.vectorized = p.hidden % vector_width(p.x_dtype) == 0 && aligned16(x->data) &&
                 aligned16(gamma->data) && aligned16(y->data);
  return p;
}

Problem make_bwd_problem(const pt_tensor* dy, const pt_tensor* x, const pt_tensor* gamma,
                         const pt_tensor* rstd, const pt_tensor* dx, const pt_tensor* dgamma) {
  Problem p = make_problem(x, gamma);
  check_like(dy, "dy", *x, "x");
  check_like(dx, "dx", *x, "x");
  check_like(dgamma, "dgamma", *gamma, "gamma");
  check_rstd(rstd, p.rows);
  p.vectorized = p.hidden % vector_width(p.x_dtype) == 0 && aligned16(x->data) &&
                 aligned16(gamma->data) && aligned16(dy->data) && aligned16(dx->data);
  return p;
}

int64_t num_partials(int64_t rows, int64_t hidden) {
  if (rows <= 0 || hidden <= 0) return 0;
  // Enough blocks to keep every SM of a large Hopper part busy (132 SMs), few enough that the
  // partial rows stay small next to the tensors: a warp-path block takes >= 16 rows (4 warps x 4),
  // and wide rows cap the workspace near 32 MiB.
  constexpr int64_t kMaxBlocks = 4 * 132, kMinBlocks = 132;
  if (hidden <= 1024) return std::min<int64_t>((rows + 15) / 16, kMaxBlocks);
  const int64_t cap = std::clamp<int64_t>((int64_t{32} << 20) / (hidden * 4), kMinBlocks, kMaxBlocks);
  return std::min<int64_t>(rows, cap);
}

size_t bwd_workspace_bytes(int64_t rows, int64_t hidden) {
  return static_cast<size_t>(num_partials(rows, hidden)) * static_cast<size_t>(std::max<int64_t>(hidden, 0)) *
         sizeof(float);
}

int specialized_hidden(int64_t hidden, bool vectorized) {
  if (!vectorized || hidden < 128 || hidden > 16384) return 0;
  int64_t odd = hidden;
  while (odd % 2 == 0) odd /= 2;
  return (odd == 1 || odd == 3 || odd == 5 || odd == 7) ? static_cast<int>(hidden) : 0;
}

}  // namespace primus_turbo::rmsnorm
