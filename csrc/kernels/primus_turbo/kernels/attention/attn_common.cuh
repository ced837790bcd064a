// What every attention kernel of a CTA needs first: where its sequence lives, and which keys a
// query sees (the visibility rule of attention_abi.h).
#pragma once

#include <cstdint>

#include "primus_turbo/kernels/attention/attention_abi.h"

namespace primus_turbo::kernels::attention {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Sequence {
  int64_t start_q, start_k;  // row of the sequence's first token (0 for fixed length)
  int len_q, len_k;
};

__device__ __forceinline__ Sequence sequence(const PtAttnParams& p, int64_t b) {
  Sequence s;
  if (p.cu_seqlens_q != nullptr) {
    s.start_q = p.cu_seqlens_q[b];
    s.start_k = p.cu_seqlens_k[b];
    // Clamped to the grid's bound: a length above max_seqlen is the caller's error, never a read
    // past the grid's rows.
    const int64_t len_q = p.cu_seqlens_q[b + 1] - s.start_q, len_k = p.cu_seqlens_k[b + 1] - s.start_k;
    s.len_q = static_cast<int>(len_q < 0 ? 0 : (len_q > p.seqlen_q ? p.seqlen_q : len_q));
    s.len_k = static_cast<int>(len_k < 0 ? 0 : (len_k > p.seqlen_k ? p.seqlen_k : len_k));
  } else {
    s.start_q = s.start_k = 0;
    s.len_q = static_cast<int>(p.seqlen_q);
    s.len_k = static_cast<int>(p.seqlen_k);
  }
  return s;
}

// The visibility rule for one sequence.
struct Mask {
  int len_q, len_k, diag, left, right;

  __device__ __forceinline__ Mask(const PtAttnParams& p, const Sequence& s)
      : len_q(s.len_q), len_k(s.len_k), diag(s.len_k - s.len_q), left(p.window_left), right(p.window_right) {}

  __device__ __forceinline__ bool visible(int i, int j) const {
    return i < len_q && j < len_k && (right < 0 || j <= i + diag + right) && (left < 0 || j >= i + diag - left);
  }
  // Keys [first, last) that some query of rows [i0, i1) sees.
  __device__ __forceinline__ int first_key(int i0) const { return left < 0 ? 0 : max(0, i0 + diag - left); }
  __device__ __forceinline__ int end_key(int i1) const {
    return right < 0 ? len_k : max(0, min(len_k, i1 - 1 + diag + right + 1));
  }
  // Queries [first, end) that see some key of [j0, j1).
  __device__ __forceinline__ int first_query(int j0) const { return right < 0 ? 0 : max(0, j0 - diag - right); }
  __device__ __forceinline__ int end_query(int j1) const {
    return left < 0 ? len_q : max(0, min(len_q, j1 - 1 - diag + left + 1));
  }
  // True when every (query of [i0, i1), key of [j0, j1)) pair is visible: the tile needs no mask.
  __device__ __forceinline__ bool all_visible(int i0, int i1, int j0, int j1) const {
    return i1 <= len_q && j1 <= len_k && (right < 0 || j1 - 1 <= i0 + diag + right) &&
           (left < 0 || j0 >= i1 - 1 + diag - left);
  }
};

}  // namespace primus_turbo::kernels::attention
