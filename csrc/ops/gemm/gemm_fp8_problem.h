// An FP8 GEMM call reduced to what a backend needs: d[M, N] = (a*sa)[M, K] @ (b*sb)[N, K]^T.
// Both operands are K-major (Hopper's FP8 tensor cores read only that layout); the scales'
// layouts are the pt_fp8_scaling ones.
#pragma once

#include <cstdint>
#include <string>

#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::gemm {

struct Fp8Operand {
  const void* ptr = nullptr;
  int64_t ld = 0;  // row stride in elements (= bytes)
  int32_t dtype = PT_FLOAT8_E4M3;
  const float* scale = nullptr;
  int32_t scaling = PT_FP8_SCALING_TENSOR;
};

struct Fp8Problem {
  int64_t m = 0, n = 0, k = 0;
  Fp8Operand a, b;
  int32_t d_dtype = PT_BFLOAT16;
  void* d = nullptr;
  int64_t ldd = 0;
  float beta = 0.0f;
  bool fast_accum = false;  // PT_GEMM_FP8_FAST_ACCUM: fast accumulation allowed

  bool accumulate() const { return beta != 0.0f; }
  std::string key() const;
};

const char* fp8_scaling_name(int32_t scaling);

// Validates every tensor (dtype, shape, strides, scale shapes for the scaling) and canonicalizes.
// Failures are PT_ERROR_INVALID_ARGUMENT naming the argument and what was expected.
Fp8Problem make_fp8_problem(const pt_tensor* a, const pt_tensor* a_scale, int32_t a_scaling,
                            const pt_tensor* b, const pt_tensor* b_scale, int32_t b_scaling,
                            const pt_tensor* d, float beta, int32_t flags);

}  // namespace primus_turbo::gemm
