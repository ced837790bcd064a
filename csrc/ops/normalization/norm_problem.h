// Normalization problems (RMSNorm, RMSNorm fused with the residual add, LayerNorm): argument checks
// shared by the forward and backward entry points, and the facts the kernel choice depends on
// (kind, sizes, dtypes, whether 16-byte accesses are allowed).
#pragma once

#include <cstddef>
#include <cstdint>

#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::norm {

constexpr int64_t kMaxHidden = 65536;

enum class Kind { kRmsNorm = 0, kRmsNormResidual = 1, kLayerNorm = 2 };

const char* kind_name(Kind kind);  // "rmsnorm", "rmsnorm_residual", "layernorm"

struct Problem {
  Kind kind = Kind::kRmsNorm;
  int64_t rows = 0;    // product of x's leading dimensions
  int64_t hidden = 0;  // x's last dimension
  int32_t x_dtype = PT_BFLOAT16;
  int32_t gamma_dtype = PT_BFLOAT16;
  bool vectorized = false;  // hidden and every row pointer allow 16-byte accesses
  // FP8 forward modules: 0 none, PT_QUANT_ROWWISE or PT_QUANT_BLOCKWISE (1x128); the FP8 dtype.
  int fp8 = 0;
  int32_t fp8_dtype = PT_FLOAT8_E4M3;

  bool layernorm() const { return kind == Kind::kLayerNorm; }
  bool residual() const { return kind == Kind::kRmsNormResidual; }
};

// Elements per 16-byte access for an x dtype.
int vector_width(int32_t x_dtype);

// Forward: residual and residual_out (x's shape and dtype) only for kRmsNormResidual, beta (like
// gamma) and mean (float32, one per row) only for kLayerNorm; unused ones may be null. y like x;
// rstd float32 with one element per row. Also decides vectorization.
Problem make_fwd_problem(Kind kind, const pt_tensor* x, const pt_tensor* residual, const pt_tensor* gamma,
                         const pt_tensor* beta, const pt_tensor* y, const pt_tensor* residual_out,
                         const pt_tensor* rstd, const pt_tensor* mean, float eps);

// Backward: x is the normalized input (x + residual for kRmsNormResidual); dy and dx like x, dgamma
// (and dbeta for kLayerNorm) like gamma; dsum (kRmsNormResidual, optional) like x.
Problem make_bwd_problem(Kind kind, const pt_tensor* dy, const pt_tensor* x, const pt_tensor* gamma,
                         const pt_tensor* rstd, const pt_tensor* mean, const pt_tensor* dsum, const pt_tensor* dx,
                         const pt_tensor* dgamma, const pt_tensor* dbeta);

// Number of partial dgamma rows (= blocks of the backward kernel); depends only on the sizes.
int64_t num_partials(int64_t rows, int64_t hidden);
// fp32 partial rows: one set for dgamma, a second for dbeta (LayerNorm).
size_t bwd_workspace_bytes(int64_t rows, int64_t hidden, bool layernorm);

// The hidden size a module is specialized for, or 0 for the runtime-hidden kernel: only common
// power-of-two-ish sizes (2^k times 1, 3, 5 or 7, 128 to 16384) with 16-byte accesses, so that
// odd sizes share one module instead of compiling one each.
int specialized_hidden(int64_t hidden, bool vectorized);

}  // namespace primus_turbo::norm
