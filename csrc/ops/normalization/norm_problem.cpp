#include "ops/normalization/norm_problem.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/tensor.h"

namespace primus_turbo::norm {

namespace {


// rstd / mean: float32 statistics, one per row.
void check_stat(const pt_tensor* t, const char* name, int64_t rows) {
  check_contiguous(t, name);
  PT_CHECK_ARG(t->dtype == PT_FLOAT32, "argument '", name, "' has dtype ", dtype_name(t->dtype),
               "; expected float32");
  PT_CHECK_ARG(numel(*t) == rows, "argument '", name, "' has shape ", shape_string(*t), " (", numel(*t),
               " elements); expected ", rows, " elements, one per row of 'x'");
}

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kRmsNorm: return "rmsnorm";
    case Kind::kRmsNormResidual: return "rmsnorm_residual";
    case Kind::kLayerNorm: return "layernorm";
  }
  return "norm";
}

int vector_width(int32_t x_dtype) { return 16 / (dtype_bits(x_dtype) / 8); }

namespace {

Problem make_problem(Kind kind, const pt_tensor* x, const pt_tensor* gamma) {
  check_contiguous(x, "x");
  PT_CHECK_ARG(x->ndim >= 1, "argument 'x' must have at least 1 dimension, got a scalar");
  PT_CHECK_ARG(is_float_dtype(x->dtype), "argument 'x' has dtype ", dtype_name(x->dtype),
               "; expected float32, float16 or bfloat16");
  Problem p;
  p.kind = kind;
  p.x_dtype = x->dtype;
  p.hidden = x->shape[x->ndim - 1];
  p.rows = 1;
  for (int i = 0; i < x->ndim - 1; ++i) p.rows *= x->shape[i];
  PT_CHECK_ARG(p.hidden >= 1, "argument 'x' has shape ", shape_string(*x),
               "; its last dimension (the normalized one) must be at least 1");
  PT_CHECK_SUPPORTED(p.hidden <= kMaxHidden, kind_name(kind), " supports a last dimension up to ", kMaxHidden,
                     ", got ", p.hidden, " (x ", shape_string(*x), ")");

  check_contiguous(gamma, "gamma");
  PT_CHECK_ARG(gamma->ndim == 1 && gamma->shape[0] == p.hidden, "argument 'gamma' has shape ",
               shape_string(*gamma), "; expected [", p.hidden, "] (the last dimension of 'x')");
  PT_CHECK_ARG(gamma->dtype == x->dtype || gamma->dtype == PT_FLOAT32, "argument 'gamma' has dtype ",
               dtype_name(gamma->dtype), "; expected the dtype of 'x' (", dtype_name(x->dtype),
               ") or float32");
  p.gamma_dtype = gamma->dtype;
  return p;
}

}  // namespace

Problem make_fwd_problem(Kind kind, const pt_tensor* x, const pt_tensor* residual, const pt_tensor* gamma,
                         const pt_tensor* beta, const pt_tensor* y, const pt_tensor* residual_out,
                         const pt_tensor* rstd, const pt_tensor* mean, float eps) {
  Problem p = make_problem(kind, x, gamma);
  check_like(y, "y", *x, "x");
  check_stat(rstd, "rstd", p.rows);
  PT_CHECK_ARG(std::isfinite(eps) && eps >= 0.0f, "argument 'eps' must be finite and non-negative, got ",
               eps);
  p.vectorized = p.hidden % vector_width(p.x_dtype) == 0 && aligned16(x->data) && aligned16(gamma->data) &&
                 aligned16(y->data);
  if (p.residual()) {
    check_like(residual, "residual", *x, "x");
    check_like(residual_out, "residual_out", *x, "x");
    p.vectorized = p.vectorized && aligned16(residual->data) && aligned16(residual_out->data);
  }
  if (p.layernorm()) {
    check_like(beta, "beta", *gamma, "gamma");
    check_stat(mean, "mean", p.rows);
    p.vectorized = p.vectorized && aligned16(beta->data);
  }
  return p;
}

Problem make_bwd_problem(Kind kind, const pt_tensor* dy, const pt_tensor* x, const pt_tensor* gamma,
                         const pt_tensor* rstd, const pt_tensor* mean, const pt_tensor* dsum, const pt_tensor* dx,
                         const pt_tensor* dgamma, const pt_tensor* dbeta) {
  Problem p = make_problem(kind, x, gamma);
  check_like(dy, "dy", *x, "x");
  check_like(dx, "dx", *x, "x");
  check_like(dgamma, "dgamma", *gamma, "gamma");
  check_stat(rstd, "rstd", p.rows);
  p.vectorized = p.hidden % vector_width(p.x_dtype) == 0 && aligned16(x->data) && aligned16(gamma->data) &&
                 aligned16(dy->data) && aligned16(dx->data);
  if (p.residual() && dsum != nullptr) {
    check_like(dsum, "dsum", *x, "x");
    p.vectorized = p.vectorized && aligned16(dsum->data);
  }
  if (p.layernorm()) {
    check_like(dbeta, "dbeta", *gamma, "gamma");
    check_stat(mean, "mean", p.rows);
  }
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

size_t bwd_workspace_bytes(int64_t rows, int64_t hidden, bool layernorm) {
  return (layernorm ? 2 : 1) * static_cast<size_t>(num_partials(rows, hidden)) * static_cast<size_t>(std::max<int64_t>(hidden, 0)) *
         sizeof(float);
}

int specialized_hidden(int64_t hidden, bool vectorized) {
  if (!vectorized || hidden < 128 || hidden > 16384) return 0;
  int64_t odd = hidden;
  while (odd % 2 == 0) odd /= 2;
  return (odd == 1 || odd == 3 || odd == 5 || odd == 7) ? static_cast<int>(hidden) : 0;
}

}  // namespace primus_turbo::norm
