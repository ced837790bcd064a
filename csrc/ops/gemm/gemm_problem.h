// A GEMM call reduced to what every backend needs: sizes, dtypes and, per operand, whether the
// reduction dimension K is the contiguous one ("K-major") and the leading dimension.
#pragma once

#include <cstdint>
#include <string>

#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::gemm {

struct Operand {
  const void* ptr = nullptr;
  int64_t ld = 0;
  bool k_major = true;  // A: element (m, k) at m*ld + k;  B: element (k, n) at n*ld + k
  bool aligned16 = false;
};

struct Problem {
  int64_t m = 0, n = 0, k = 0;
  int32_t ab_dtype = PT_BFLOAT16;
  int32_t d_dtype = PT_BFLOAT16;
  Operand a, b;
  void* d = nullptr;
  int64_t ldd = 0;
  bool d_aligned16 = false;
  float alpha = 1.0f;
  float beta = 0.0f;

  bool accumulate() const { return beta != 0.0f; }
  // "AkBn": which dimension is contiguous in A and B; names kernels and autotune keys.
  std::string layout_code() const;
};

// Validates the tensors (dtype, rank, strides, matching inner dimensions, output shape) and
// canonicalizes them. Every failure names the argument and what was expected.
Problem make_problem(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d, bool trans_a,
                     bool trans_b, float alpha, float beta);

}  // namespace primus_turbo::gemm
