// RoPE problems: argument checks of the entry point, and the facts the module choice depends on.
#pragma once

#include <cstdint>

#include "primus_turbo/kernels/rope/rope_abi.h"
#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::rope {

constexpr int64_t kMaxHeadDim = 4096;

struct Problem {
  PtRopeParams params{};  // everything but stream
  int32_t dtype = PT_BFLOAT16;
  bool vectorized = false;  // 16-byte accesses: sizes, strides and pointers allow them
  bool interleaved = false;
  bool table = false;  // cos / sin given
};

// Checks every argument (messages name it) and fills the launch parameters. Optional tensors are
// null pointers; rotary_dim 0 means head_dim.
Problem make_problem(const pt_tensor* q, const pt_tensor* k, const pt_tensor* cos, const pt_tensor* sin,
                     const pt_tensor* positions, const pt_tensor* cu_seqlens, const pt_tensor* q_out,
                     const pt_tensor* k_out, int32_t rotary_dim, double theta, int32_t interleaved,
                     int32_t layout, int32_t backward);

// Elements per 16-byte access of a dtype.
int vector_width(int32_t dtype);

// Tokens per thread block for a token of `heads` heads of `items_per_head` work items.
int tokens_per_block(int64_t heads, int64_t items_per_head);

}  // namespace primus_turbo::rope
