// Flash-attention backward without atomics, so every run gives the same bits:
//   1. delta = rowsum(dout * out) per query row (the softmax Jacobian's correction term);
//   2. dK, dV: one CTA per (block of 16 * kWarps keys, sequence, KV head) walks every query head
//      of its group and every query block that sees its keys, recomputing P^T = exp(K Q^T - lse)
//      and accumulating dV += P^T dO and dK += (P^T o (V dO^T - delta)) Q in registers;
//   3. dQ: one CTA per (block of query rows, sequence, query head) walks the key blocks its rows
//      see, recomputing P and dS and accumulating dQ += dS K;
//   4. dsink = -sum over rows of exp(sink - lse) * delta, one CTA per head, a fixed-order sum.
#pragma once

#include <cmath>

#include "primus_turbo/kernels/attention/attn_common.cuh"
#include "primus_turbo/kernels/attention/warp_mma.cuh"

namespace primus_turbo::kernels::attention {

constexpr int kDeltaRowsPerBlock = 8;  // one warp a row

template <class T, int kDV>
__global__ void __launch_bounds__(32 * kDeltaRowsPerBlock) attn_bwd_delta_kernel(const PtAttnParams p) {
  const int row = blockIdx.x * kDeltaRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y;
  const int h = blockIdx.z;
  const Sequence s = sequence(p, b);
  if (row >= s.len_q) return;
  const T* o = row_at<const T>(p.out, p.o_sb, p.o_ss, p.o_sh, b, s.start_q + row, h);
  const T* d = row_at<const T>(p.dout, p.do_sb, p.do_ss, p.do_sh, b, s.start_q + row, h);
  float acc = 0.f;
#pragma unroll
  for (int c = lane; c < kDV; c += 32) acc += static_cast<float>(o[c]) * static_cast<float>(d[c]);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) p.delta[lse_offset(p, b, h, s.start_q + row)] = acc;
}

template <class T, int kD, int kDV, int kWarps, int kBM>
struct DkdvTile {
  static constexpr int kBN = 16 * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr size_t kSmem = (kBN * (pitch<kD>() + pitch<kDV>()) + 2 * kBM * (pitch<kD>() + pitch<kDV>())) * sizeof(T) +
                                  2 * 2 * kBM * sizeof(float);
};

template <class T, int kD, int kDV, int kWarps, int kBM>
__global__ void __launch_bounds__(32 * kWarps) attn_bwd_dkdv_kernel(const PtAttnParams p) {
  using Tile = DkdvTile<T, kD, kDV, kWarps, kBM>;
  constexpr int kBN = Tile::kBN, kThreads = Tile::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sk = reinterpret_cast<T*>(smem);
  T* sv = sk + kBN * pitch<kD>();
  T* sq = sv + kBN * pitch<kDV>();     // two buffers
  T* sdo = sq + 2 * kBM * pitch<kD>();  // two buffers
  float* slse = reinterpret_cast<float*>(sdo + 2 * kBM * pitch<kDV>());  // two buffers, log2 units
  float* sdelta = slse + 2 * kBM;                                        // two buffers

  const KeyBlock<kBN, kBM> blk(p);
  if (blk.valid_k <= 0) return;
  const int n0 = blk.n0, hk = blk.hk, valid_k = blk.valid_k, iters = blk.iters;
  const int64_t b = blk.b;
  const Sequence& s = blk.s;
  const Mask& mask = blk.mask;
  load_tile<T, kBN, kD, kThreads>(sk, row_at<const T>(p.k, p.k_sb, p.k_ss, p.k_sh, b, s.start_k + n0, hk), p.k_ss,
                                  valid_k);
  load_tile<T, kBN, kDV, kThreads>(sv, row_at<const T>(p.v, p.v_sb, p.v_ss, p.v_sh, b, s.start_k + n0, hk), p.v_ss,
                                   valid_k);
  auto issue = [&](int it, int buf) {
    const int h = blk.head_of(it), m0 = blk.row_of(it);
    const int valid = min(kBM, s.len_q - m0);
    load_tile<T, kBM, kD, kThreads>(sq + buf * kBM * pitch<kD>(),
                                    row_at<const T>(p.q, p.q_sb, p.q_ss, p.q_sh, b, s.start_q + m0, h), p.q_ss, valid);
    load_tile<T, kBM, kDV, kThreads>(sdo + buf * kBM * pitch<kDV>(),
                                     row_at<const T>(p.dout, p.do_sb, p.do_ss, p.do_sh, b, s.start_q + m0, h), p.do_ss,
                                     valid);
    stage_lse_delta<kBM, kThreads>(p, b, h, s, m0, slse + buf * kBM, sdelta + buf * kBM);
  };
  if (iters > 0) issue(0, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key0 = n0 + warp * 16;  // the warp's first key
  const float scale_log2 = p.softmax_scale * kLog2e;
  float dk[kD / 8][4], dv[kDV / 8][4];
  zero(dk);
  zero(dv);
  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    cp_async_wait_all();
    __syncthreads();
    if (it + 1 < iters) issue(it + 1, buf ^ 1);
    cp_async_commit();
    const int m0 = blk.row_of(it);
    const T* q_tile = sq + buf * kBM * pitch<kD>();
    const T* do_tile = sdo + buf * kBM * pitch<kDV>();
    const float* lse2 = slse + buf * kBM;
    const float* delta = sdelta + buf * kBM;

    // P^T: rows are this warp's 16 keys, columns the kBM queries.
    float pt[kBM / 8][4];
    zero(pt);
    gemm_ss<T, kBM / 8, kD>(pt, sk + warp * 16 * pitch<kD>(), pitch<kD>(), q_tile, pitch<kD>(), lane);
    const bool full = mask.all_visible(m0, m0 + kBM, key0, key0 + 16);
#pragma unroll
    for (int t = 0; t < kBM / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = frag_col(lane, t, e);
        const bool vis = full || mask.visible(m0 + i, key0 + frag_row(lane, e));
        pt[t][e] = vis ? ex2(fmaf(pt[t][e], scale_log2, -lse2[i])) : 0.f;
      }
    uint32_t a[kBM / 16][4];
    acc_to_a<T>(pt, a);
    gemm_rs<T, kDV / 8, kBM>(dv, a, do_tile, pitch<kDV>(), lane);

    float dst[kBM / 8][4];  // dP^T = V dO^T, then dS^T = P^T o (dP^T - delta)
    zero(dst);
    gemm_ss<T, kBM / 8, kDV>(dst, sv + warp * 16 * pitch<kDV>(), pitch<kDV>(), do_tile, pitch<kDV>(), lane);
#pragma unroll
    for (int t = 0; t < kBM / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[t][e] = pt[t][e] * (dst[t][e] - delta[frag_col(lane, t, e)]);
    acc_to_a<T>(dst, a);
    gemm_rs<T, kD / 8, kBM>(dk, a, q_tile, pitch<kD>(), lane);
  }
  cp_async_wait_all();

  T* dk_out = row_at<T>(p.dk, p.dk_sb, p.dk_ss, p.dk_sh, b, s.start_k + n0, hk);
  T* dv_out = row_at<T>(p.dv, p.dv_sb, p.dv_ss, p.dv_sh, b, s.start_k + n0, hk);
  store_rows<T, kD / 8>(dk, dk_out, p.dk_ss, warp * 16, valid_k, p.softmax_scale, lane);
  store_rows<T, kDV / 8>(dv, dv_out, p.dv_ss, warp * 16, valid_k, 1.f, lane);
}

template <class T, int kD, int kDV, int kWarps, int kMT, int kBN>
struct DqTile {
  static constexpr int kBM = 16 * kMT * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr size_t kSmem = (kBM * (pitch<kD>() + pitch<kDV>()) + 2 * kBN * (pitch<kD>() + pitch<kDV>())) * sizeof(T);
};

template <class T, int kD, int kDV, int kWarps, int kMT, int kBN>
__global__ void __launch_bounds__(32 * kWarps) attn_bwd_dq_kernel(const PtAttnParams p) {
  using Tile = DqTile<T, kD, kDV, kWarps, kMT, kBN>;
  constexpr int kBM = Tile::kBM, kThreads = Tile::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);
  T* sdo = sq + kBM * pitch<kD>();
  T* sk = sdo + kBM * pitch<kDV>();    // two buffers
  T* sv = sk + 2 * kBN * pitch<kD>();  // two buffers

  const QueryBlock<kBM, kBN> blk(p);
  if (blk.valid_q <= 0) return;
  const Mask& mask = blk.mask;
  const int m0 = blk.m0, valid_q = blk.valid_q, nb_lo = blk.nb_lo, nb_hi = blk.nb_hi;
  load_tile<T, kBM, kD, kThreads>(sq, blk.template rows<const T>(p.q, p.q_sb, p.q_ss, p.q_sh), p.q_ss, valid_q);
  load_tile<T, kBM, kDV, kThreads>(sdo, blk.template rows<const T>(p.dout, p.do_sb, p.do_ss, p.do_sh), p.do_ss,
                                   valid_q);
  if (nb_lo < nb_hi) blk.template load_kv<T, kD, kDV, kThreads>(p, sk, sv, nb_lo, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kWarpRows = 16 * kMT;
  const int row0 = m0 + warp * kWarpRows;
  const float scale_log2 = p.softmax_scale * kLog2e;
  float lse2[kMT][2], delta[kMT][2];
  float dq[kMT][kD / 8][4];
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    zero(dq[m]);
    for (int i = 0; i < 2; ++i) lse_delta_at(p, blk.b, blk.h, blk.s, row0 + m * 16 + lane / 4 + i * 8, lse2[m][i], delta[m][i]);
  }
  for (int nb = nb_lo; nb < nb_hi; ++nb) {
    const int buf = (nb - nb_lo) & 1;
    cp_async_wait_all();
    __syncthreads();
    if (nb + 1 < nb_hi) blk.template load_kv<T, kD, kDV, kThreads>(p, sk, sv, nb + 1, buf ^ 1);
    cp_async_commit();
    const int n0 = nb * kBN;
    const T* k_tile = sk + buf * kBN * pitch<kD>();
    float pr[kMT][kBN / 8][4];
#pragma unroll
    for (int m = 0; m < kMT; ++m) zero(pr[m]);
    gemm_ss<T, kMT, kBN / 8, kD>(pr, sq + warp * kWarpRows * pitch<kD>(), pitch<kD>(), k_tile, pitch<kD>(), lane);
    const bool full = mask.all_visible(row0, row0 + kWarpRows, n0, n0 + kBN);
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int t = 0; t < kBN / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool vis = full || mask.visible(row0 + m * 16 + frag_row(lane, e), n0 + frag_col(lane, t, e));
          pr[m][t][e] = vis ? ex2(fmaf(pr[m][t][e], scale_log2, -lse2[m][e >> 1])) : 0.f;
        }
    float ds[kMT][kBN / 8][4];  // dP = dO V^T, then dS = P o (dP - delta)
#pragma unroll
    for (int m = 0; m < kMT; ++m) zero(ds[m]);
    gemm_ss<T, kMT, kBN / 8, kDV>(ds, sdo + warp * kWarpRows * pitch<kDV>(), pitch<kDV>(),
                                  sv + buf * kBN * pitch<kDV>(), pitch<kDV>(), lane);
    uint32_t a[kMT][kBN / 16][4];
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
#pragma unroll
      for (int t = 0; t < kBN / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[m][t][e] = pr[m][t][e] * (ds[m][t][e] - delta[m][e >> 1]);
      acc_to_a<T>(ds[m], a[m]);
    }
    gemm_rs<T, kMT, kD / 8, kBN>(dq, a, k_tile, pitch<kD>(), lane);
  }
  cp_async_wait_all();
  T* dq_out = blk.template rows<T>(p.dq, p.dq_sb, p.dq_ss, p.dq_sh);
#pragma unroll
  for (int m = 0; m < kMT; ++m)
    store_rows<T, kD / 8>(dq[m], dq_out, p.dq_ss, warp * kWarpRows + m * 16, valid_q, p.softmax_scale, lane);
}

constexpr int kSinkThreads = 256;

// dsink[h] = -sum over the rows of head h of exp(sink[h] - lse) * delta; rows are
// [batches, rows_per_batch] in lse's layout (fixed: [B, Sq]; packed: [1, Tq]).
__global__ void __launch_bounds__(kSinkThreads) attn_bwd_sink_kernel(const PtAttnParams p, int64_t batches,
                                                                      int64_t rows_per_batch) {
  const int h = blockIdx.x;
  const float sink = p.sink[h];
  float acc = 0.f;
  for (int64_t r = threadIdx.x; r < batches * rows_per_batch; r += kSinkThreads) {
    const int64_t off = lse_offset(p, r / rows_per_batch, h, r % rows_per_batch);
    const float delta = p.delta[off];
    if (delta != 0.f) acc += expf(sink - p.lse[off]) * delta;
  }
  __shared__ float partial[kSinkThreads / 32];
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int w = 0; w < kSinkThreads / 32; ++w) sum += partial[w];
    p.dsink[h] = -sum;
  }
}

}  // namespace primus_turbo::kernels::attention
