// Attention problems: argument checks of the entry points, and the launch parameters.
#pragma once

#include <cstdint>

#include "primus_turbo/kernels/attention/attention_abi.h"
#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::attention {

// Whether the kernels take this (head dim of q/k, head dim of v) pair.
bool supported_head_dims(int64_t d, int64_t dv);

struct Problem {
  PtAttnParams params{};  // everything but stream and the backward's tensors
  int32_t dtype = PT_BFLOAT16;
  bool empty = false;  // no query and no key: nothing to launch
};

// The operands shared by both directions. Messages name the argument.
Problem make_problem(const pt_tensor* q, const pt_tensor* k, const pt_tensor* v, const pt_tensor* sink,
                     const pt_tensor* cu_seqlens_q, const pt_tensor* cu_seqlens_k, const pt_tensor* out,
                     const pt_tensor* lse, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                     int32_t window_left, int32_t window_right);

// Adds the backward's tensors to a forward problem.
void add_backward(Problem& p, const pt_tensor* dout, const pt_tensor* dq, const pt_tensor* dk, const pt_tensor* dv,
                  const pt_tensor* dsink, const pt_tensor* delta);

// True when a backward has nothing to write: no element of dq or dk, and no dsink.
bool no_gradients(const pt_tensor* dq, const pt_tensor* dk, const pt_tensor* dsink);

// With the backend unset, whether a backward runs on our kernel without asking cuDNN: when
// deterministic (cuDNN's deterministic backward needs a B*H*Sq*Sk*2-byte workspace on Hopper), and
// at head dim 64 with sinks (GPT-OSS: cuDNN's backward took 2.5x ours on H100, window 128: 2.81
// vs 1.12 ms; at head dim 128 with sinks the two were within 5%).
bool unset_backward_on_ours(const Problem& p, bool deterministic);

}  // namespace primus_turbo::attention
