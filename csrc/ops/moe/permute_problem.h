// MoE token permutation problems: argument checks of the entry points and the facts the module
// choice depends on.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "primus_turbo/kernels/moe/permute_abi.h"
#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::moe {

constexpr int kMaxExperts = 1024;

// A tensor argument and the name its messages use.
struct Operand {
  const pt_tensor* t;
  const char* name;
};

// [rows, hidden] token rows of `dtype` (rows < 0: any number).
void check_rows(const Operand& t, int64_t rows, int64_t hidden, int32_t dtype);
// [rows, cols] of `dtype`; `what` explains the expected shape.
void check_matrix(const Operand& t, int64_t rows, int64_t cols, int32_t dtype, const char* what);
void check_vector(const Operand& t, int64_t n, int32_t dtype, const char* what);
// A float dtype of probabilities; returns it.
int32_t check_probs_dtype(const pt_tensor* t, const char* name);
// A contiguous 2-D float32/float16/bfloat16 tensor.
void check_token_tensor(const pt_tensor* t, const char* name);
// Rows move as 16-byte vectors: hidden is a multiple of the vector and every pointer is aligned.
bool rows_vectorizable(int32_t dtype, int64_t hidden, std::initializer_list<const pt_tensor*> tensors);

}  // namespace primus_turbo::moe
