// RMSNorm problems: argument checks shared by the forward and backward entry points, and the
// facts the kernel choice depends on (sizes, dtypes, whether 16-byte accesses are allowed).
#pragma once

#include <cstddef>
#include <cstdint>

#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::rmsnorm {

constexpr int64_t kMaxHidden = 65536;

struct Problem {
  int64_t rows = 0;    // product of x's leading dimensions
  int64_t hidden = 0;  // x's last dimension
  int32_t x_dtype = PT_BFLOAT16;
  int32_t gamma_dtype = PT_BFLOAT16;
  bool vectorized = false;  // hidden and every row pointer allow 16-byte accesses
};

// Elements per 16-byte access for an x dtype.
int vector_width(int32_t x_dtype);

// Checks x, gamma (dtypes, sizes, contiguity) and returns the problem without pointers checked.
Problem make_problem(const pt_tensor* x, const pt_tensor* gamma);

// Forward: y like x; rstd float32 with `rows` elements. Also decides vectorization.
Problem make_fwd_problem(const pt_tensor* x, const pt_tensor* gamma, const pt_tensor* y,
                         const pt_tensor* rstd, float eps);

// Backward: dy and dx like x, dgamma like gamma, rstd as in the forward.
Problem make_bwd_problem(const pt_tensor* dy, const pt_tensor* x, const pt_tensor* gamma,
                         const pt_tensor* rstd, const pt_tensor* dx, const pt_tensor* dgamma);

// Number of partial dgamma rows (= blocks of the backward kernel); depends only on the sizes.
int64_t num_partials(int64_t rows, int64_t hidden);
size_t bwd_workspace_bytes(int64_t rows, int64_t hidden);

// The hidden size a module is specialized for, or 0 for the runtime-hidden kernel: only common
// power-of-two-ish sizes (2^k times 1, 3, 5 or 7, 128 to 16384) with 16-byte accesses, so that
// odd sizes share one module instead of compiling one each.
int specialized_hidden(int64_t hidden, bool vectorized);

}  // namespace primus_turbo::rmsnorm
