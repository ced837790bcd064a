// RMSNorm and LayerNorm over the last dimension of a contiguous [rows, hidden] tensor, forward and
// backward, optionally fused with the residual add that precedes the norm in a transformer block.
//
//   s        = x + residual (rounded to x's dtype, written out: the next residual stream), or x
//   forward  : y = (s - mu) * rstd * w + b      w = gamma or 1 + gamma (zero_centered)
//              RMSNorm:   mu = 0,        rstd = 1 / sqrt(mean(s^2) + eps),          b = 0
//              LayerNorm: mu = mean(s),  rstd = 1 / sqrt(mean((s - mu)^2) + eps)
//   backward : x_hat = (s - mu) * rstd, g = w * dy
//              ds = rstd * (g - mean(g) [LayerNorm only] - x_hat * mean(g * x_hat)) + dsum
//              dgamma = sum over rows of dy * x_hat, dbeta = sum over rows of dy
//              (dsum: the gradient arriving at the residual-stream output; dx = dresidual = ds)
//
// Memory bound, so the design is about bytes: statistics in fp32, the row read from HBM once (kept
// in registers between the reductions and the output) whenever it fits, 16-byte accesses when the
// host found the pointers and the row length allow them, and all of a thread's loads of a row in
// flight before the first use. Rows up to kWarpMaxHidden get one warp each (no barriers); wider
// rows get one block each. Rows are walked with a grid-stride loop. One row routine serves both
// mappings: a "team" (warp or block) supplies the thread's rank, the stride and the sums.
//
// dgamma/dbeta are deterministic: each backward block sums its rows into its own fp32 row of the
// workspace (no float atomics), then a second kernel adds those partial rows in a fixed order.
// The grid size (= number of partials) is chosen by the core and depends only on the problem.
//
// FP8 forward modules (kFp8, quantization/fused_fp8.cuh) also write y quantized to the format F:
// the rounded y of each vector is encoded from registers, one scale per row (the row's amax is a
// team max once the row is normalized) or per 128 elements (a shuffle max over the lanes holding
// the block). y itself is written only when p.y is set. Rows wider than the register cache
// normalize twice with a rowwise scale (the second pass re-reads s, mostly from L2).
#pragma once

#include <algorithm>
#include <atomic>

#include "primus_turbo/kernels/common/dependent_launch.cuh"
#include "primus_turbo/kernels/common/vec.cuh"
#include "primus_turbo/kernels/jit_abi.h"
#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/quantization/fused_fp8.cuh"

namespace primus_turbo::kernels::norm {

constexpr int kWarpMaxHidden = 1024;  // at or below: one warp per row
constexpr int kWarpsPerBlock = 4;     // rows per block on the warp path
constexpr int kMaxBlockThreads = 512;
constexpr int kBlockCacheIters = 4;   // vectors per thread held in registers on the block path
// The backward's block path with two rows in flight: vectors per thread (nvec: the row's vectors
// where the module is built for one hidden size, else 0). RMSNorm's 128-register budget holds two
// of each row's vectors (twice the threads of the forward). LayerNorm holds two as well for rows of
// up to 512 vectors, capped at 128 registers (2 blocks of 256 threads: 16 warps an SM, a few values
// spilled); wider rows hold four under 255 (207 used, 8 warps an SM). Measured on an H100 (8192
// rows, fraction of copy): LayerNorm 2048 / 4096 0.69 / 0.73 at four -> 0.74 / 0.77 at two, but
// 8192 0.72 -> 0.67.
constexpr bool bwd_ln_narrow(int nvec) { return nvec > 0 && nvec <= 512; }
constexpr int bwd_prefetch_iters(bool layernorm, int nvec = 0) { return layernorm && !bwd_ln_narrow(nvec) ? 4 : 2; }
constexpr int bwd_block_min_blocks(bool layernorm, int nvec) { return layernorm && bwd_ln_narrow(nvec) ? 2 : 1; }
// Whether the block path's backward keeps two rows in flight (else one, four vectors a thread).
// Measured on an H100 (8192 rows, fraction of copy): LayerNorm 4096 0.69 -> 0.73, RMSNorm + residual
// 2048 / 4096 / 7168 0.58 / 0.80 / 0.77 -> 0.75 / 0.82 / 0.81, RMSNorm 2048 0.70 -> 0.76; plain
// RMSNorm's wider rows lost (4096 0.84 -> 0.80): two vectors a thread there means blocks above
// 128 threads, and the 128-register budget then fits fewer blocks an SM than one row each.
__host__ __device__ constexpr bool bwd_prefetch(bool layernorm, bool residual, int nvec) {
  return layernorm || residual || nvec <= 128 * bwd_prefetch_iters(false);
}
constexpr int kFinalizeWarps = 32;    // partial rows are split over 32 warps, 32 columns a block:
                                      // few dependent L2 round trips per warp
// Register budgets of the backward, which holds x, dy and the per-column sums: RMSNorm fits 128
// registers (4 blocks of the warp path per SM); LayerNorm's second sum (dbeta) needs up to 255 (its
// block path's rows of up to 512 vectors are capped at 128: bwd_block_min_blocks), so its block
// path is capped at 256 threads (wider rows then stream).
constexpr int bwd_warp_min_blocks(bool layernorm) { return layernorm ? 2 : 4; }
constexpr int bwd_max_block_threads(bool layernorm) { return layernorm ? 256 : kMaxBlockThreads; }

struct WarpTeam {
  int rank;
  static constexpr int size = 32;
  __device__ __forceinline__ float2 sum2(float a, float b) const { return make_float2(warp_sum(a), warp_sum(b)); }
  __device__ __forceinline__ float max(float a) const { return quant::warp_max(a); }
};

struct BlockTeam {
  int rank, size;
  float* scratch;  // 66 floats of shared memory
  __device__ __forceinline__ float2 sum2(float a, float b) const { return block_sum2(a, b, scratch); }
  __device__ __forceinline__ float max(float a) const { return quant::block_max(a, scratch); }
};

template <class T, class W, int kVec, bool kLayerNorm, bool kResidual, int kFp8 = quant::kFp8None,
          class F = quant::E4M3>
struct Row {
  using TP = Pack<T, kVec>;
  using WP = Pack<W, kVec>;
  static constexpr int kBetaIters = kLayerNorm ? 1 : 0;

  // s = x + residual in x's dtype (what an unfused x + residual produces), written to residual_out.
  __device__ static __forceinline__ TP load_input(const PtNormFwdParams& p, int64_t offset, int c) {
    TP v = load_stream(reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + offset) + c);
    if constexpr (kResidual) {
      const TP r = load_stream(reinterpret_cast<const TP*>(static_cast<const T*>(p.residual) + offset) + c);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v.v[j] = from_float<T>(to_float(v.v[j]) + to_float(r.v[j]));
      reinterpret_cast<TP*>(static_cast<T*>(p.residual_out) + offset)[c] = v;
    }
    return v;
  }

  __device__ static __forceinline__ float sum(const TP& v) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) s += to_float(v.v[j]);
    return s;
  }

  __device__ static __forceinline__ float centered_squares(const TP& v, float mu) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float d = to_float(v.v[j]) - mu;
      s += d * d;
    }
    return s;
  }

  __device__ static __forceinline__ TP normalize(const PtNormFwdParams& p, const TP& v, int c, float mu, float rstd,
                                                 float shift) {
    const WP g = static_cast<const WP*>(p.gamma)[c];
    WP b;
    if constexpr (kLayerNorm) b = static_cast<const WP*>(p.beta)[c];
    TP y;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float o = (to_float(v.v[j]) - mu) * rstd * (to_float(g.v[j]) + shift);
      if constexpr (kLayerNorm) o += to_float(b.v[j]);
      y.v[j] = from_float<T>(o);
    }
    return y;
  }

  // Statistics from the row's fp32 partial sums; thread rank 0 records them for the backward.
  template <class Team>
  __device__ static __forceinline__ void finish_stats(const PtNormFwdParams& p, const Team& team, int64_t row,
                                                      int hidden, float mu, float ss, float& rstd) {
    rstd = rsqrtf(team.sum2(ss, 0.f).x / hidden + p.eps);
    if (team.rank == 0) {
      p.rstd[row] = rstd;
      if constexpr (kLayerNorm) p.mean[row] = mu;
    }
  }

  // Forward of one row held in registers: kIters vectors per thread cover it.
  template <int kIters, class Team>
  __device__ static __forceinline__ void forward_cached(const PtNormFwdParams& p, const Team& team, int64_t row,
                                                        int hidden, int nvec) {
    const int64_t offset = row * hidden;
    const float shift = p.zero_centered ? 1.f : 0.f;
    TP v[kIters];
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int c = team.rank + i * team.size;
      if (c < nvec) v[i] = load_input(p, offset, c);
    }
    float mu = 0.f;
    if constexpr (kLayerNorm) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        if (team.rank + i * team.size < nvec) s += sum(v[i]);
      }
      mu = team.sum2(s, 0.f).x / hidden;
    }
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (team.rank + i * team.size < nvec) ss += centered_squares(v[i], mu);
    }
    float rstd;
    finish_stats(p, team, row, hidden, mu, ss, rstd);
    if constexpr (kFp8 == quant::kFp8None) {
      TP* yr = reinterpret_cast<TP*>(static_cast<T*>(p.y) + offset);
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int c = team.rank + i * team.size;
        if (c < nvec) store_stream(yr + c, normalize(p, v[i], c, mu, rstd, shift));
      }
    } else {
      TP* yr = p.y != nullptr ? reinterpret_cast<TP*>(static_cast<T*>(p.y) + offset) : nullptr;
      float amax = 0.f;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int c = team.rank + i * team.size;
        if (c < nvec) {
          v[i] = normalize(p, v[i], c, mu, rstd, shift);
          if (yr != nullptr) store_stream(yr + c, v[i]);
          if constexpr (kFp8 == quant::kFp8Rowwise) amax = fmaxf(amax, quant::pack_amax<T, kVec>(v[i]));
        }
      }
      const quant::Fp8Row out = quant::fp8_row(p.q, p.q_scale_inv, row, hidden, kFp8);
      if constexpr (kFp8 == quant::kFp8Rowwise) {
        const quant::Scale sc = quant::make_scale<F>(team.max(amax), false);
        if (team.rank == 0) out.scale[0] = sc.inv;
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          const int c = team.rank + i * team.size;
          if (c < nvec) quant::store_fp8<F, T, kVec>(out.q + static_cast<int64_t>(c) * kVec, v[i], sc.mult);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          const int c = team.rank + i * team.size;
          quant::quantize_block128<F, T, kVec>(out, v[i], c, c < nvec);
        }
      }
    }
  }

  // Forward of a row too wide for registers: the first pass reads x (and residual, writing s),
  // later passes re-read s (mostly from L2).
  __device__ static void forward_streaming(const PtNormFwdParams& p, const BlockTeam& team, int64_t row, int hidden,
                                           int nvec) {
    const int64_t offset = row * hidden;
    const float shift = p.zero_centered ? 1.f : 0.f;
    const TP* s_row = reinterpret_cast<const TP*>(static_cast<const T*>(kResidual ? p.residual_out : p.x) + offset);
    float s = 0.f, ss = 0.f;
#pragma unroll 4
    for (int c = team.rank; c < nvec; c += team.size) {
      const TP v = load_input(p, offset, c);
      s += sum(v);
      ss += centered_squares(v, 0.f);
    }
    float mu = 0.f;
    if constexpr (kLayerNorm) {
      mu = team.sum2(s, 0.f).x / hidden;
      ss = 0.f;  // two-pass variance: no cancellation when |mean| >> std
#pragma unroll 4
      for (int c = team.rank; c < nvec; c += team.size) ss += centered_squares(s_row[c], mu);
    }
    float rstd;
    finish_stats(p, team, row, hidden, mu, ss, rstd);
    if constexpr (kFp8 == quant::kFp8None) {
      TP* yr = reinterpret_cast<TP*>(static_cast<T*>(p.y) + offset);
#pragma unroll 4
      for (int c = team.rank; c < nvec; c += team.size) yr[c] = normalize(p, s_row[c], c, mu, rstd, shift);
    } else {
      TP* yr = p.y != nullptr ? reinterpret_cast<TP*>(static_cast<T*>(p.y) + offset) : nullptr;
      const quant::Fp8Row out = quant::fp8_row(p.q, p.q_scale_inv, row, hidden, kFp8);
      if constexpr (kFp8 == quant::kFp8Rowwise) {
        float amax = 0.f;
#pragma unroll 4
        for (int c = team.rank; c < nvec; c += team.size) {
          const TP y = normalize(p, s_row[c], c, mu, rstd, shift);
          if (yr != nullptr) yr[c] = y;
          amax = fmaxf(amax, quant::pack_amax<T, kVec>(y));
        }
        const quant::Scale sc = quant::make_scale<F>(team.max(amax), false);
        if (team.rank == 0) out.scale[0] = sc.inv;
#pragma unroll 4
        for (int c = team.rank; c < nvec; c += team.size) {
          quant::store_fp8<F, T, kVec>(out.q + static_cast<int64_t>(c) * kVec, normalize(p, s_row[c], c, mu, rstd, shift),
                                       sc.mult);
        }
      } else {
        // Uniform trip count: every lane joins each block's shuffle.
        for (int base = 0; base < nvec; base += team.size) {
          const int c = base + team.rank;
          TP y{};
          if (c < nvec) {
            y = normalize(p, s_row[c], c, mu, rstd, shift);
            if (yr != nullptr) yr[c] = y;
          }
          quant::quantize_block128<F, T, kVec>(out, y, c, c < nvec);
        }
      }
    }
  }

  // ---- backward ----

  struct Grad {  // per-thread fp32 column sums over the rows a thread visits
    float* dgamma;
    float* dbeta;
  };

  // First pass over one vector: contributions to sum(g) and sum(g * x_hat).
  __device__ static __forceinline__ void dots(const PtNormBwdParams& p, const TP& x, const TP& dy, int c, float mu,
                                              float rstd, float shift, float& a, float& b) {
    const WP g = static_cast<const WP*>(p.gamma)[c];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float gd = (to_float(g.v[j]) + shift) * to_float(dy.v[j]);
      a += gd;
      b += gd * ((to_float(x.v[j]) - mu) * rstd);
    }
  }

  // ds of one vector; adds dy * x_hat and dy into the column sums.
  __device__ static __forceinline__ TP input_grad(const PtNormBwdParams& p, const TP& x, const TP& dy, int64_t offset,
                                                  int c, float mu, float rstd, float shift, float ma, float mb,
                                                  float (&dg)[kVec], float (&db)[kVec]) {
    const WP g = static_cast<const WP*>(p.gamma)[c];
    TP add;
    if constexpr (kResidual) {
      if (p.dsum != nullptr) add = load_stream(reinterpret_cast<const TP*>(static_cast<const T*>(p.dsum) + offset) + c);
    }
    TP dx;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float x_hat = (to_float(x.v[j]) - mu) * rstd;
      const float d = to_float(dy.v[j]);
      float o = rstd * ((to_float(g.v[j]) + shift) * d - ma - x_hat * mb);
      if constexpr (kResidual) {
        if (p.dsum != nullptr) o += to_float(add.v[j]);
      }
      dx.v[j] = from_float<T>(o);
      dg[j] += d * x_hat;
      if constexpr (kLayerNorm) db[j] += d;
    }
    return dx;
  }

  // A row's x and dy held in registers with its statistics, loaded ahead of their use.
  template <int kIters>
  struct Loaded {
    TP x[kIters], dy[kIters];
    float rstd, mu;
  };

  // Issues the loads of row `row` (every vector of the thread's share in flight at once), its
  // statistics with them: loaded later, a row's rstd cost a memory round trip of its own before the
  // first product (each is read once, so it comes from DRAM).
  template <int kIters, class Team>
  __device__ static __forceinline__ void load_row(const PtNormBwdParams& p, const Team& team, int64_t row, int hidden,
                                                  int nvec, Loaded<kIters>& v) {
    const int64_t offset = row * hidden;
    const TP* xr = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + offset);
    const TP* dyr = reinterpret_cast<const TP*>(static_cast<const T*>(p.dy) + offset);
    v.rstd = p.rstd[row];
    v.mu = kLayerNorm ? p.mean[row] : 0.f;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int c = team.rank + i * team.size;
      if (c < nvec) {
        v.x[i] = load_stream(xr + c);
        v.dy[i] = load_stream(dyr + c);
      }
    }
  }

  template <int kIters, class Team>
  __device__ static __forceinline__ void backward_cached(const PtNormBwdParams& p, const Team& team, int64_t row,
                                                         int hidden, int nvec, const Loaded<kIters>& v,
                                                         float (&dg)[kIters][kVec], float (&db)[kIters][kVec]) {
    const int64_t offset = row * hidden;
    const float shift = p.zero_centered ? 1.f : 0.f;
    const float rstd = v.rstd, mu = v.mu;
    float a = 0.f, b = 0.f;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int c = team.rank + i * team.size;
      if (c < nvec) dots(p, v.x[i], v.dy[i], c, mu, rstd, shift, a, b);
    }
    const float2 s = team.sum2(a, b);
    const float ma = kLayerNorm ? s.x / hidden : 0.f, mb = s.y / hidden;
    TP* dxr = reinterpret_cast<TP*>(static_cast<T*>(p.dx) + offset);
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int c = team.rank + i * team.size;
      if (c < nvec)
        store_stream(dxr + c, input_grad(p, v.x[i], v.dy[i], offset, c, mu, rstd, shift, ma, mb, dg[i], db[i]));
    }
  }

  // The team's rows start, start + step, ... With kPrefetch each row's loads are issued while the
  // row before it is reduced and written: two rows in flight per team (a block holds one row of a
  // few KB, and the four blocks an SM runs left the memory system short of requests). It costs the
  // registers of a second row, so it is for teams whose share of a row is small.
  template <int kIters, bool kPrefetch, class Team>
  __device__ static __forceinline__ void backward_rows(const PtNormBwdParams& p, const Team& team, int64_t start,
                                                       int64_t step, int hidden, int nvec, float (&dg)[kIters][kVec],
                                                       float (&db)[kIters][kVec]) {
    Loaded<kIters> cur;
    if (kPrefetch && start < p.rows) load_row(p, team, start, hidden, nvec, cur);
    for (int64_t row = start; row < p.rows; row += step) {
      if constexpr (kPrefetch) {
        Loaded<kIters> next;
        if (row + step < p.rows) load_row(p, team, row + step, hidden, nvec, next);
        backward_cached(p, team, row, hidden, nvec, cur, dg, db);
        cur = next;
      } else {
        load_row(p, team, row, hidden, nvec, cur);
        backward_cached(p, team, row, hidden, nvec, cur, dg, db);
      }
    }
  }

  // Wide rows: the column sums live in the block's partial rows, each column owned by one thread,
  // so the read-modify-write needs neither atomics nor barriers.
  __device__ static void backward_streaming(const PtNormBwdParams& p, const BlockTeam& team, int64_t row, int hidden,
                                            int nvec, float* dgamma_row, float* dbeta_row) {
    using FP = Pack<float, kVec>;
    const int64_t offset = row * hidden;
    const float shift = p.zero_centered ? 1.f : 0.f;
    const float rstd = p.rstd[row];
    const float mu = kLayerNorm ? p.mean[row] : 0.f;
    const TP* xr = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + offset);
    const TP* dyr = reinterpret_cast<const TP*>(static_cast<const T*>(p.dy) + offset);
    TP* dxr = reinterpret_cast<TP*>(static_cast<T*>(p.dx) + offset);
    float a = 0.f, b = 0.f;
#pragma unroll 4
    for (int c = team.rank; c < nvec; c += team.size) dots(p, xr[c], dyr[c], c, mu, rstd, shift, a, b);
    const float2 s = team.sum2(a, b);
    const float ma = kLayerNorm ? s.x / hidden : 0.f, mb = s.y / hidden;
    FP* dgp = reinterpret_cast<FP*>(dgamma_row);
    FP* dbp = reinterpret_cast<FP*>(dbeta_row);
#pragma unroll 2
    for (int c = team.rank; c < nvec; c += team.size) {
      FP dg = dgp[c], db;
      if constexpr (kLayerNorm) db = dbp[c];
      dxr[c] = input_grad(p, xr[c], dyr[c], offset, c, mu, rstd, shift, ma, mb, dg.v, db.v);
      dgp[c] = dg;
      if constexpr (kLayerNorm) dbp[c] = db;
    }
  }
};

// ---- forward kernels --------------------------------------------------------------------------

template <class T, class W, int kVec, int kHidden, int kIters, bool kLN, bool kRes, int kFp8, class F>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) fwd_warp_per_row(PtNormFwdParams p) {
  const int hidden = kHidden > 0 ? kHidden : static_cast<int>(p.hidden);
  const WarpTeam team{static_cast<int>(threadIdx.x & 31)};
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); row < p.rows;
       row += step) {
    Row<T, W, kVec, kLN, kRes, kFp8, F>::template forward_cached<kIters>(p, team, row, hidden, hidden / kVec);
  }
}

template <class T, class W, int kVec, int kHidden, bool kLN, bool kRes, int kFp8, class F>
__global__ void __launch_bounds__(kMaxBlockThreads) fwd_block_per_row(PtNormFwdParams p) {
  __shared__ float scratch[66];
  const int hidden = kHidden > 0 ? kHidden : static_cast<int>(p.hidden);
  const int nvec = hidden / kVec;
  const BlockTeam team{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), scratch};
  using R = Row<T, W, kVec, kLN, kRes, kFp8, F>;
  const bool cached = nvec <= team.size * kBlockCacheIters;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    if (cached) {
      R::template forward_cached<kBlockCacheIters>(p, team, row, hidden, nvec);
    } else {
      R::forward_streaming(p, team, row, hidden, nvec);
    }
  }
}

// ---- backward kernels -------------------------------------------------------------------------

// Partial rows: dgamma's at partials[block], dbeta's (LayerNorm) at partials[num_partials + block].
__device__ __forceinline__ float* partial_row(const PtNormBwdParams& p, int which) {
  return p.partials + (static_cast<int64_t>(which) * p.num_partials + blockIdx.x) * p.hidden;
}

template <class T, class W, int kVec, int kHidden, int kIters, bool kLN, bool kRes>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, bwd_warp_min_blocks(kLN)) bwd_warp_per_row(PtNormBwdParams p) {
  __shared__ float warp_partials[kWarpsPerBlock][kWarpMaxHidden];
  allow_dependent_launch();  // the dgamma reduction's blocks wait for this grid (column_sums_finalize)
  const int hidden = kHidden > 0 ? kHidden : static_cast<int>(p.hidden);
  const int nvec = hidden / kVec;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const WarpTeam team{lane};
  float dg[kIters][kVec], db[kIters][kVec];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) dg[i][j] = db[i][j] = 0.f;
  }
  // Prefetch where the registers allow it: LayerNorm's budget (2 blocks an SM), or short rows (not
  // measured: the benchmarks' rows take the block path).
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  Row<T, W, kVec, kLN, kRes>::template backward_rows<kIters, kLN || kIters <= 2>(
      p, team, first, static_cast<int64_t>(gridDim.x) * kWarpsPerBlock, hidden, nvec, dg, db);
  // The block's warps are added in a fixed order into its partial row(s).
  for (int which = 0; which < (kLN ? 2 : 1); ++which) {
    if (which) __syncthreads();  // the dgamma pass has read warp_partials
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int c = lane + i * 32;
      if (c < nvec) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) warp_partials[warp][c * kVec + j] = which ? db[i][j] : dg[i][j];
      }
    }
    __syncthreads();
    float* out = partial_row(p, which);
    for (int col = threadIdx.x; col < hidden; col += kWarpsPerBlock * 32) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarpsPerBlock; ++w) s += warp_partials[w][col];
      out[col] = s;
    }
  }
}

// The block path's rows held in registers (kIters vectors a thread), then the block's column sums
// (one column vector per thread) into its partial rows.
template <int kIters, bool kPrefetch, class T, class W, int kVec, bool kLN, bool kRes>
__device__ __forceinline__ void cached_block_backward(const PtNormBwdParams& p, const BlockTeam& team, int hidden,
                                                      int nvec, float* dgamma_row, float* dbeta_row) {
  using FP = Pack<float, kVec>;
  float dg[kIters][kVec], db[kIters][kVec];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) dg[i][j] = db[i][j] = 0.f;
  }
  Row<T, W, kVec, kLN, kRes>::template backward_rows<kIters, kPrefetch>(p, team, blockIdx.x, gridDim.x, hidden, nvec,
                                                                         dg, db);
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int c = team.rank + i * team.size;
    if (c < nvec) {
      FP g, b;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        g.v[j] = dg[i][j];
        b.v[j] = db[i][j];
      }
      reinterpret_cast<FP*>(dgamma_row)[c] = g;
      if constexpr (kLN) reinterpret_cast<FP*>(dbeta_row)[c] = b;
    }
  }
}

template <class T, class W, int kVec, int kHidden, bool kLN, bool kRes>
__global__ void __launch_bounds__(bwd_max_block_threads(kLN), bwd_block_min_blocks(kLN, kHidden / kVec))
    bwd_block_per_row(PtNormBwdParams p) {
  using FP = Pack<float, kVec>;
  using R = Row<T, W, kVec, kLN, kRes>;
  __shared__ float scratch[66];
  allow_dependent_launch();  // the dgamma reduction's blocks wait for this grid (column_sums_finalize)
  const int hidden = kHidden > 0 ? kHidden : static_cast<int>(p.hidden);
  const int nvec = hidden / kVec;
  const BlockTeam team{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), scratch};
  float* dgamma_row = partial_row(p, 0);
  float* dbeta_row = kLN ? partial_row(p, 1) : nullptr;

  constexpr int kPrefetchIters = bwd_prefetch_iters(kLN, kHidden / kVec);
  if (bwd_prefetch(kLN, kRes, nvec) && nvec <= team.size * kPrefetchIters) {
    cached_block_backward<kPrefetchIters, true, T, W, kVec, kLN, kRes>(p, team, hidden, nvec, dgamma_row, dbeta_row);
  } else if (nvec <= team.size * kBlockCacheIters) {
    cached_block_backward<kBlockCacheIters, false, T, W, kVec, kLN, kRes>(p, team, hidden, nvec, dgamma_row,
                                                                          dbeta_row);
  } else {
    for (int c = team.rank * kVec; c < hidden; c += team.size * kVec) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        dgamma_row[c + j] = 0.f;
        if constexpr (kLN) dbeta_row[c + j] = 0.f;
      }
    }
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      R::backward_streaming(p, team, row, hidden, nvec, dgamma_row, dbeta_row);
    }
  }
}

// out[col] = sum over k of partials[k, col], always in the same order: warp w adds the rows
// k = w, w + kFinalizeWarps, ... in turn, then the warp sums are added in warp order. blockIdx.y picks
// dgamma (0) or dbeta (1).
// Launched as the backward kernel's programmatic dependent: its blocks may start while that kernel
// runs and wait here for its partial rows (no launch gap between the two).
template <class W>
__global__ void __launch_bounds__(kFinalizeWarps * 32)
    column_sums_finalize(const float* partials, int64_t num_partials, int hidden, W* dgamma, W* dbeta) {
  constexpr int kBatch = 16;  // loads in flight a thread: ~17 partial rows each at 528 partials
  __shared__ float sums[kFinalizeWarps][32];
  grid_dependency_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = blockIdx.x * 32 + lane;
  const float* src = partials + static_cast<int64_t>(blockIdx.y) * num_partials * hidden;
  float s = 0.f;
  if (col < hidden) {
    int64_t k = warp;
    for (; k + (kBatch - 1) * kFinalizeWarps < num_partials; k += kBatch * kFinalizeWarps) {
      float v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) v[u] = src[(k + u * kFinalizeWarps) * hidden + col];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) s += v[u];  // the same order as one row at a time
    }
    for (; k < num_partials; k += kFinalizeWarps) s += src[k * hidden + col];
  }
  sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && col < hidden) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kFinalizeWarps; ++w) t += sums[w][lane];
    (blockIdx.y ? dbeta : dgamma)[col] = from_float<W>(t);
  }
}

// ---- host side of the module ------------------------------------------------------------------

// T: x / residual / y / dy / dx element type; W: gamma / beta / their gradients' element type.
// kVectorized: 16-byte accesses (the host checked pointers and hidden allow them). kHidden: the
// row length, or 0 for any. kLayerNorm: LayerNorm (else RMSNorm). kResidual: fused residual add.
// kFp8: quant::kFp8None, or an FP8 forward module writing y quantized to F (quant::E4M3 / E5M2)
// with a rowwise (kFp8Rowwise) or 1x128 (kFp8Block128) scale; those need 16-byte accesses and
// export only the forward (the backward is the plain module's).
template <class T, class W, bool kVectorized, int kHidden, bool kLayerNorm, bool kResidual,
          int kFp8 = quant::kFp8None, class F = quant::E4M3>
struct Norm {
  static constexpr int kVec = kVectorized ? static_cast<int>(16 / sizeof(T)) : 1;
  static_assert(kHidden >= 0 && kHidden % kVec == 0, "kHidden must be a multiple of the vector width");
  static_assert(kFp8 == quant::kFp8None || (kVectorized && quant::kBlockLanes<kVec> <= 32),
                "FP8 norm modules need 16-byte accesses");
  static constexpr bool kHasWarpPath = kHidden == 0 || kHidden <= kWarpMaxHidden;
  static constexpr bool kHasBlockPath = kHidden == 0 || kHidden > kWarpMaxHidden;
  // Vectors per lane that cover the widest row of the warp path.
  static constexpr int kWarpIters =
      ceil_div(kHidden > 0 && kHidden < kWarpMaxHidden ? kHidden : kWarpMaxHidden, kVec * 32);

  // Threads of the block path: just enough for `iters` vectors each, else the maximum.
  static int block_threads(int nvec, int max_threads = kMaxBlockThreads, int iters = kBlockCacheIters) {
    if (nvec > max_threads * iters) return max_threads;
    const int t = ceil_div(ceil_div(nvec, iters), 32) * 32;
    return t < 64 ? 64 : t;
  }

  // Threads of the backward's block path: bwd_prefetch_iters vectors each (two rows in flight) where
  // bwd_prefetch says so and the row fits, else as the forward's.
  static int bwd_block_threads(int nvec) {
    const int max_threads = bwd_max_block_threads(kLayerNorm), iters = bwd_prefetch_iters(kLayerNorm, kHidden / kVec);
    const bool prefetch = bwd_prefetch(kLayerNorm, kResidual, nvec) && nvec <= max_threads * iters;
    return block_threads(nvec, max_threads, prefetch ? iters : kBlockCacheIters);
  }

  static bool check_hidden(int64_t hidden, char* err, size_t err_len) {
    if (hidden < 1 || hidden > INT32_MAX || hidden % kVec != 0 || (kHidden > 0 && hidden != kHidden)) {
      snprintf(err, err_len, "norm module (vector width %d, hidden %d) cannot take hidden %lld", kVec, kHidden,
               static_cast<long long>(hidden));
      return false;
    }
    return true;
  }

  static int forward(const PtNormFwdParams* p, char* err, size_t err_len) {
    if (!check_hidden(p->hidden, err, err_len)) return 1;
    if (kFp8 != quant::kFp8None && (p->q == nullptr || p->q_scale_inv == nullptr)) {
      snprintf(err, err_len, "FP8 norm module: q and q_scale_inv are required");
      return 1;
    }
    if (p->rows <= 0) return 0;
    auto stream = static_cast<cudaStream_t>(p->stream);
    const int64_t sms = p->num_sms > 0 ? p->num_sms : 132;
    const int nvec = static_cast<int>(p->hidden / kVec);
    if (p->hidden <= kWarpMaxHidden) {
      if constexpr (kHasWarpPath) {
        const int64_t grid = std::min<int64_t>(ceil_div(p->rows, kWarpsPerBlock), sms * 16);
        fwd_warp_per_row<T, W, kVec, kHidden, kWarpIters, kLayerNorm, kResidual, kFp8, F>
            <<<static_cast<unsigned>(grid), kWarpsPerBlock * 32, 0, stream>>>(*p);
      }
    } else {
      if constexpr (kHasBlockPath) {
        const int threads = block_threads(nvec);
        const int64_t grid = std::min<int64_t>(p->rows, sms * std::max(1, 2048 / threads));
        fwd_block_per_row<T, W, kVec, kHidden, kLayerNorm, kResidual, kFp8, F>
            <<<static_cast<unsigned>(grid), threads, 0, stream>>>(*p);
      }
    }
    return report_launch("norm forward", err, err_len);
  }

  static int backward(const PtNormBwdParams* p, char* err, size_t err_len) {
    if (!check_hidden(p->hidden, err, err_len)) return 1;
    if (p->rows <= 0) return 0;
    if (p->num_partials < 1 || p->num_partials > INT32_MAX) {
      snprintf(err, err_len, "norm backward: num_partials %lld is out of range",
               static_cast<long long>(p->num_partials));
      return 1;
    }
    auto stream = static_cast<cudaStream_t>(p->stream);
    const int nvec = static_cast<int>(p->hidden / kVec);
    // The grid (= partial rows) is the core's count, capped at the blocks the SMs hold at once.
    PtNormBwdParams q = *p;
    if (p->hidden <= kWarpMaxHidden) {
      if constexpr (kHasWarpPath) {
        constexpr auto kernel = bwd_warp_per_row<T, W, kVec, kHidden, kWarpIters, kLayerNorm, kResidual>;
        q.num_partials = resident_grid(kernel, 0, kWarpsPerBlock * 32, p->num_partials, p->num_sms);
        kernel<<<static_cast<unsigned>(q.num_partials), kWarpsPerBlock * 32, 0, stream>>>(q);
      }
    } else {
      if constexpr (kHasBlockPath) {
        constexpr auto kernel = bwd_block_per_row<T, W, kVec, kHidden, kLayerNorm, kResidual>;
        const int threads = bwd_block_threads(nvec);
        q.num_partials = resident_grid(kernel, 1, threads, p->num_partials, p->num_sms);
        kernel<<<static_cast<unsigned>(q.num_partials), threads, 0, stream>>>(q);
      }
    }
    if (report_launch("norm backward", err, err_len)) return 1;
    const int hidden = static_cast<int>(p->hidden);
    const dim3 fgrid(static_cast<unsigned>(ceil_div(hidden, 32)), kLayerNorm ? 2 : 1);
    const cudaError_t e = launch_dependent(column_sums_finalize<W>, fgrid, dim3(kFinalizeWarps * 32), 0, stream,
                                           q.partials, q.num_partials, hidden, static_cast<W*>(p->dgamma),
                                           static_cast<W*>(p->dbeta));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // not left for the next op's launch check to report
      snprintf(err, err_len, "norm dgamma reduction launch failed: %s", cudaGetErrorString(e));
      return 1;
    }
    return report_launch("norm dgamma reduction", err, err_len);
  }

  // min(want, the blocks of `kernel` the SMs hold at once): blocks beyond that run as a second wave
  // and only add partial rows to write and sum back. The occupancy is asked once per kernel (path 0:
  // warp, 1: block) and block size (one architecture in a process).
  static int64_t resident_grid(void (*kernel)(PtNormBwdParams), int path, int threads, int64_t want, int num_sms) {
    static std::atomic<int> per_sm[2][kMaxBlockThreads / 32 + 1];  // by path, threads / 32; 0: not asked yet
    std::atomic<int>& slot = per_sm[path][std::min(threads / 32, kMaxBlockThreads / 32)];
    int n = slot.load(std::memory_order_relaxed);
    if (n == 0) {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        n = 1;
      }
      slot.store(n, std::memory_order_relaxed);
    }
    const int64_t sms = num_sms > 0 ? num_sms : 132;
    return std::max<int64_t>(1, std::min<int64_t>(want, int64_t{n} * sms));
  }
};

}  // namespace primus_turbo::kernels::norm
