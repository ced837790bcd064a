// What every attention kernel of a CTA needs first: where its sequence lives, and which keys a
// query sees (the visibility rule of attention_abi.h).
#pragma once

#include <cstdint>

#include "primus_turbo/kernels/attention/attention_abi.h"
#include "primus_turbo/kernels/attention/warp_mma.cuh"

namespace primus_turbo::kernels::attention {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x in one MUFU instruction: exp2f adds a range fix-up around it (compare, scale, select) that
// costs more than the exponent in a softmax loop. Subnormal results flush to zero, and -inf gives
// 0, which is what a probability wants.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Power-of-two scale arithmetic (the FP8 forward's block scales are powers of two, or 0): exact
// and without a division, whose IEEE sequence (with its slow-path call) sat in every block's
// softmax.
// The unbiased exponent of a power of two (-127 for 0).
__device__ __forceinline__ int pow2_exponent(float pow2) {
  return static_cast<int>((__float_as_uint(pow2) >> 23) & 0xff) - 127;
}
// 2^e for an integer e: 0 below 2^-126, +inf above 2^127.
__device__ __forceinline__ float exp2i(int e) {
  return e < -126 ? 0.f : (e > 127 ? INFINITY : __uint_as_float(static_cast<uint32_t>(e + 127) << 23));
}
// a / b for powers of two a >= 0 and b > 0 (0 for a = 0).
__device__ __forceinline__ float pow2_ratio(float a, float b) {
  return a == 0.f ? 0.f : exp2i(pow2_exponent(a) - pow2_exponent(b));
}

struct Sequence {
  int64_t start_q, start_k;  // row of the sequence's first token (0 for fixed length)
  int len_q, len_k;
};

__device__ __forceinline__ int64_t clamp_offset(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

__device__ __forceinline__ Sequence sequence(const PtAttnParams& p, int64_t b) {
  Sequence s;
  if (p.cu_seqlens_q != nullptr) {
    // Offsets are the caller's data, read on the device: clamped so that bad ones (negative,
    // decreasing, past the packed rows, longer than max_seqlen, the grid's bound) give meaningless
    // rows but never an access outside q, k, v or out (PRIMUS_TURBO_CHECK_CU_SEQLENS=1 reports them).
    s.start_q = clamp_offset(p.cu_seqlens_q[b], 0, p.total_q);
    s.start_k = clamp_offset(p.cu_seqlens_k[b], 0, p.total_k);
    const int64_t end_q = clamp_offset(p.cu_seqlens_q[b + 1], s.start_q, p.total_q);
    const int64_t end_k = clamp_offset(p.cu_seqlens_k[b + 1], s.start_k, p.total_k);
    s.len_q = static_cast<int>(min(end_q - s.start_q, p.seqlen_q));
    s.len_k = static_cast<int>(min(end_k - s.start_k, p.seqlen_k));
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

  // Without short-circuits: per element in unrolled loops this is predicates and a select, not a
  // branch (and a reconvergence point) around every element.
  __device__ __forceinline__ bool visible(int i, int j) const {
    return (i < len_q) & (j < len_k) & ((right < 0) | (j <= i + diag + right)) & ((left < 0) | (j >= i + diag - left));
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

// Row `row` (counted from the operand's first row) of head h of batch entry b, for an operand with
// strides (sb, ss, sh) as attention_abi.h lays them out.
template <class T, class Base>
__device__ __forceinline__ T* row_at(Base* base, int64_t sb, int64_t ss, int64_t sh, int64_t b, int64_t row,
                                     int64_t h) {
  return static_cast<T*>(base) + b * sb + row * ss + h * sh;
}

// Offset of (b, h, row) in lse and delta.
__device__ __forceinline__ int64_t lse_offset(const PtAttnParams& p, int64_t b, int h, int64_t row) {
  return b * p.lse_sb + h * p.lse_sh + row;
}

// The backward's per-row inputs of query `row` of head h: lse in log2 units and delta; +inf and 0
// past the sequence, so such rows give P = 0 and dS = 0.
__device__ __forceinline__ void lse_delta_at(const PtAttnParams& p, int64_t b, int h, const Sequence& s, int row,
                                             float& lse2, float& delta) {
  const int64_t off = lse_offset(p, b, h, s.start_q + row);
  const bool in = row < s.len_q;
  lse2 = in ? p.lse[off] * kLog2e : INFINITY;
  delta = in ? p.delta[off] : 0.f;
}

// The same for the kRows rows from m0, into shared memory (the dK/dV kernels' query blocks).
template <int kRows, int kThreads>
__device__ __forceinline__ void stage_lse_delta(const PtAttnParams& p, int64_t b, int h, const Sequence& s, int m0,
                                                float* lse2, float* delta) {
  for (int r = threadIdx.x; r < kRows; r += kThreads) lse_delta_at(p, b, h, s, m0 + r, lse2[r], delta[r]);
}

// The CTA of a query-block kernel (forward, dQ): kBM rows of one query head of one sequence,
// taken in reverse so that under a causal mask the longest rows start first, and the blocks of
// kBN keys [nb_lo, nb_hi) those rows see.
template <int kBM, int kBN>
struct QueryBlock {
  int64_t b;
  int h, hk;  // query head, and the KV head it reads
  Sequence s;
  Mask mask;
  int m0;       // first row in the sequence
  int valid_q;  // rows of the block inside the sequence (<= 0: nothing to do)
  int nb_lo, nb_hi;

  __device__ __forceinline__ explicit QueryBlock(const PtAttnParams& p)
      : b(blockIdx.y),
        h(blockIdx.z),
        hk(blockIdx.z / (p.heads_q / p.heads_kv)),
        s(sequence(p, blockIdx.y)),
        mask(p, s),
        m0((gridDim.x - 1 - blockIdx.x) * kBM) {
    valid_q = min(kBM, s.len_q - m0);
    const int key_lo = mask.first_key(m0), key_hi = mask.end_key(m0 + valid_q);
    nb_lo = key_lo / kBN;
    nb_hi = key_hi > key_lo ? (key_hi + kBN - 1) / kBN : nb_lo;
  }

  // Rows of this block's query head in an operand shaped like q (q, out, dout, dq).
  template <class T, class Base>
  __device__ __forceinline__ T* rows(Base* base, int64_t sb, int64_t ss, int64_t sh) const {
    return row_at<T>(base, sb, ss, sh, b, s.start_q + m0, h);
  }

  // Copies key block nb (K and V of head hk) into buffer buf of the two-buffer tiles sk, sv.
  template <class T, int kD, int kDV, int kThreads>
  __device__ __forceinline__ void load_kv(const PtAttnParams& p, T* sk, T* sv, int nb, int buf) const {
    const int n0 = nb * kBN, rows = min(kBN, s.len_k - n0);
    load_tile<T, kBN, kD, kThreads>(sk + buf * kBN * pitch<kD>(),
                                    row_at<const T>(p.k, p.k_sb, p.k_ss, p.k_sh, b, s.start_k + n0, hk), p.k_ss, rows);
    load_tile<T, kBN, kDV, kThreads>(sv + buf * kBN * pitch<kDV>(),
                                     row_at<const T>(p.v, p.v_sb, p.v_ss, p.v_sh, b, s.start_k + n0, hk), p.v_ss, rows);
  }
};

// The CTA of a key-block kernel (dK/dV): kBN keys from n0 of one KV head of one sequence, and the
// kBM-row query blocks [mb_lo, mb_lo + n_mb) that see them, for each query head of the GQA group:
// iteration `it` of `iters` covers query head head_of(it), the block starting at row_of(it).
template <int kBN, int kBM>
struct KeyBlock {
  int64_t b;
  int hk, group;  // KV head, and query heads per KV head
  Sequence s;
  Mask mask;
  int n0;       // first key in the sequence
  int valid_k;  // keys of the block inside the sequence (<= 0: nothing to do)
  int mb_lo, n_mb, iters;

  __device__ __forceinline__ explicit KeyBlock(const PtAttnParams& p)
      : b(blockIdx.y),
        hk(blockIdx.z),
        group(p.heads_q / p.heads_kv),
        s(sequence(p, blockIdx.y)),
        mask(p, s),
        n0(blockIdx.x * kBN) {
    valid_k = min(kBN, s.len_k - n0);
    const int q_lo = mask.first_query(n0), q_hi = mask.end_query(n0 + valid_k);
    mb_lo = q_lo / kBM;
    n_mb = q_hi > q_lo ? (q_hi + kBM - 1) / kBM - mb_lo : 0;
    iters = group * n_mb;
  }

  __device__ __forceinline__ int head_of(int it) const { return hk * group + it / n_mb; }
  __device__ __forceinline__ int row_of(int it) const { return (mb_lo + it % n_mb) * kBM; }
};

}  // namespace primus_turbo::kernels::attention
