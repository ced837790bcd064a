// Flash-attention forward: one CTA per (block of kBM query rows, sequence, query head); each warp
// owns 16 * kMT rows (more rows a warp: each K/V fragment read from shared memory feeds more
// products). K/V blocks of kBN keys stream through two shared-memory buffers (the next block's
// copy overlaps this block's math); scores stay in registers, the softmax is online (running max
// and sum per row, in the log2 domain), and P feeds the P*V product straight from the score
// accumulators. A sink logit starts every row's max/sum at (sink, 1).
#pragma once

#include <cmath>

#include "primus_turbo/kernels/attention/attn_common.cuh"
#include "primus_turbo/kernels/attention/warp_mma.cuh"

namespace primus_turbo::kernels::attention {

template <class T, int kD, int kDV, int kWarps, int kMT, int kBN>
struct FwdTile {
  static constexpr int kBM = 16 * kMT * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr size_t kSmem = (kBM * pitch<kD>() + 2 * kBN * (pitch<kD>() + pitch<kDV>())) * sizeof(T);
};

template <class T, int kD, int kDV, int kWarps, int kMT, int kBN>
__global__ void __launch_bounds__(32 * kWarps) attn_fwd_kernel(const PtAttnParams p) {
  using Tile = FwdTile<T, kD, kDV, kWarps, kMT, kBN>;
  constexpr int kBM = Tile::kBM, kThreads = Tile::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);
  T* sk = sq + kBM * pitch<kD>();      // two buffers
  T* sv = sk + 2 * kBN * pitch<kD>();  // two buffers

  const QueryBlock<kBM, kBN> blk(p);
  if (blk.valid_q <= 0) return;
  const Mask& mask = blk.mask;
  const int m0 = blk.m0, valid_q = blk.valid_q, nb_lo = blk.nb_lo, nb_hi = blk.nb_hi;
  load_tile<T, kBM, kD, kThreads>(sq, blk.template rows<const T>(p.q, p.q_sb, p.q_ss, p.q_sh), p.q_ss, valid_q);
  if (nb_lo < nb_hi) blk.template load_kv<T, kD, kDV, kThreads>(p, sk, sv, nb_lo, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kWarpRows = 16 * kMT;
  const int row0 = m0 + warp * kWarpRows;  // the warp's first row in the sequence
  const float scale_log2 = p.softmax_scale * kLog2e;
  float o[kMT][kDV / 8][4];
  // Running max (log2 units) and this thread's part of the running sum, rows g and g + 8 of each
  // row tile.
  float row_max[kMT][2], row_sum[kMT][2];
  const float sink2 = p.sink != nullptr ? p.sink[blk.h] * kLog2e : -INFINITY;
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    zero(o[m]);
    for (int i = 0; i < 2; ++i) row_max[m][i] = sink2, row_sum[m][i] = (p.sink != nullptr && lane % 4 == 0) ? 1.f : 0.f;
  }

  for (int nb = nb_lo; nb < nb_hi; ++nb) {
    const int buf = (nb - nb_lo) & 1;
    cp_async_wait_all();
    __syncthreads();  // the block has landed, and every warp is done with the other buffer
    if (nb + 1 < nb_hi) blk.template load_kv<T, kD, kDV, kThreads>(p, sk, sv, nb + 1, buf ^ 1);
    cp_async_commit();

    float sc[kMT][kBN / 8][4];
#pragma unroll
    for (int m = 0; m < kMT; ++m) zero(sc[m]);
    gemm_ss<T, kMT, kBN / 8, kD>(sc, sq + warp * kWarpRows * pitch<kD>(), pitch<kD>(), sk + buf * kBN * pitch<kD>(),
                                 pitch<kD>(), lane);
    const int n0 = nb * kBN;
    const bool full = mask.all_visible(row0, row0 + kWarpRows, n0, n0 + kBN);
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
      float mx[2] = {row_max[m][0], row_max[m][1]};
#pragma unroll
      for (int t = 0; t < kBN / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sc[m][t][e] * scale_log2;
          if (!full && !mask.visible(row0 + m * 16 + frag_row(lane, e), n0 + frag_col(lane, t, e))) x = -INFINITY;
          sc[m][t][e] = x;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
      float base[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = quad_max(mx[i]);
        base[i] = mx[i] == -INFINITY ? 0.f : mx[i];  // a row that sees nothing yet stays all-zero
        const float corr = ex2(row_max[m][i] - base[i]);
        row_max[m][i] = mx[i];
        row_sum[m][i] *= corr;
#pragma unroll
        for (int t = 0; t < kDV / 8; ++t) o[m][t][2 * i] *= corr, o[m][t][2 * i + 1] *= corr;
      }
#pragma unroll
      for (int t = 0; t < kBN / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sc[m][t][e] = ex2(sc[m][t][e] - base[e >> 1]);
          row_sum[m][e >> 1] += sc[m][t][e];
        }
    }
    uint32_t pa[kMT][kBN / 16][4];
#pragma unroll
    for (int m = 0; m < kMT; ++m) acc_to_a<T>(sc[m], pa[m]);
    gemm_rs<T, kMT, kDV / 8, kBN>(o, pa, sv + buf * kBN * pitch<kDV>(), pitch<kDV>(), lane);
  }
  cp_async_wait_all();

  T* out = blk.template rows<T>(p.out, p.o_sb, p.o_ss, p.o_sh);
  float* lse_row = p.lse + lse_offset(p, blk.b, blk.h, blk.s.start_q + m0);
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    float lse[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float sum = quad_sum(row_sum[m][i]);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      lse[i] = sum > 0.f ? (row_max[m][i] + log2f(sum)) * kLn2 : INFINITY;
#pragma unroll
      for (int t = 0; t < kDV / 8; ++t) o[m][t][2 * i] *= inv, o[m][t][2 * i + 1] *= inv;
    }
    const int tile_row = warp * kWarpRows + m * 16;
    store_rows<T, kDV / 8>(o[m], out, p.o_ss, tile_row, valid_q, 1.f, lane);
    if (lane % 4 == 0) {
      for (int i = 0; i < 2; ++i) {
        const int r = tile_row + lane / 4 + i * 8;
        if (r < valid_q) lse_row[r] = lse[i];
      }
    }
  }
}

}  // namespace primus_turbo::kernels::attention
