// The C ABI between the core and an attention JIT module (kernels/attention/attention.cuh). Kept
// beside the kernel so that only attention modules hash it; the ABI version is jit_abi.h's.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// One attention problem, forward and backward. Row r of sequence b of a [rows, heads, dim]-like
// operand X with head h lives at X + b * x_sb + (start_b + r) * x_ss + h * x_sh (unit stride along
// dim), where start_b is 0 for fixed-length batches and cu_seqlens[b] for packed ones (then x_sb
// is 0). lse and delta use the same scheme with a unit row stride: fixed [B, Hq, Sq], packed
// [Hq, Tq]. Key j is visible from query i iff j < len_k and
//   i + (len_k - len_q) - window_left <= j <= i + (len_k - len_q) + window_right
// (a negative window side is unbounded; causal is window_right = 0, aligned bottom-right).
typedef struct PtAttnParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // natural log of the softmax denominator (sink included); +inf where a row sees nothing
  // backward only
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* delta;  // workspace in lse's layout: rowsum(dout * out)
  const float* sink;  // [heads_q] logits joining every row's softmax, or null
  float* dsink;       // [heads_q], backward with a sink
  const int32_t* cu_seqlens_q;  // [batch + 1], or null for fixed length
  const int32_t* cu_seqlens_k;
  int64_t batch;
  int64_t seqlen_q, seqlen_k;  // fixed: the lengths; packed: upper bounds of the lengths (the grid)
  int64_t total_q, total_k;    // packed: tokens of q and k (rows the kernels zero beyond the sequences)
  int32_t heads_q, heads_kv, head_dim, head_dim_v;
  int64_t q_sb, q_ss, q_sh;
  int64_t k_sb, k_ss, k_sh;
  int64_t v_sb, v_ss, v_sh;
  int64_t o_sb, o_ss, o_sh;     // out
  int64_t do_sb, do_ss, do_sh;  // dout
  int64_t dq_sb, dq_ss, dq_sh;
  int64_t dk_sb, dk_ss, dk_sh;
  int64_t dv_sb, dv_ss, dv_sh;
  int64_t lse_sb, lse_sh;       // lse and delta
  float softmax_scale;
  int32_t window_left, window_right;
  void* stream;  // cudaStream_t
  // Backward, optional: a float32 workspace of [rows, heads_q, head_dim] (rows: total_q packed,
  // batch * seqlen_q fixed) for modules that fuse dQ into the dK/dV kernel (run-to-run order of
  // additions: not bitwise reproducible). Null: separate dQ kernel, deterministic.
  float* dq_accum;
} PtAttnParams;

typedef int (*PtAttnFn)(const PtAttnParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
