// RMSNorm over the last dimension of a contiguous [rows, hidden] tensor, forward and backward.
//
//   forward:  y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps),  w = gamma or 1 + gamma
//   backward: dx = rstd * (w*dy - x_hat * mean(w*dy*x_hat)),  x_hat = x * rstd
//             dgamma = sum over rows of dy * x_hat
//
// Memory bound, so the design is about bytes: statistics in fp32, x read from HBM once (kept in
// registers between the reduction and the output) whenever the row fits, 16-byte accesses when the
// host found the pointers and the row length allow them, and several independent loads per thread
// in flight before the first use. Rows up to kWarpMaxHidden get one warp each (no barriers); wider
// rows get one block each. Rows are walked with a grid-stride loop.
//
// dgamma is deterministic: each backward block sums its rows' dy * x_hat into its own fp32 row of
// the workspace (no float atomics), then a second kernel adds those partial rows in a fixed order.
// The grid size (= number of partials) is chosen by the core and depends only on the problem.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/jit_abi.h"
#include "primus_turbo/kernels/jit_export.cuh"

namespace primus_turbo::kernels::rmsnorm {

constexpr int kWarpMaxHidden = 1024;  // at or below: one warp per row
constexpr int kWarpsPerBlock = 4;     // rows per block on the warp path
constexpr int kMaxBlockThreads = 512;
constexpr int kBlockCacheIters = 4;   // vectors per thread held in registers on the block path
constexpr int kFinalizeWarps = 8;     // partial rows are split over 8 warps, 32 columns a block

constexpr int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// N contiguous elements moved as one access (two 16-byte accesses for 8 floats).
template <class E, int N>
struct alignas(sizeof(E) * N >= 16 ? 16 : sizeof(E) * N) Pack {
  E v[N];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class E>
__device__ __forceinline__ E from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Butterfly: every lane ends with the same bits (each step adds the same two values).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over a block whose size is a multiple of 32; every thread gets the same value. scratch holds
// 33 floats. Two barriers make back-to-back calls safe: scratch[warp] is rewritten only after
// warp 0 has read it, scratch[32] only after every thread has read it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < num_warps ? scratch[lane] : 0.f;
    t = warp_sum(t);
    if (lane == 0) scratch[32] = t;
  }
  __syncthreads();
  return scratch[32];
}

template <class T, int N>
__device__ __forceinline__ float sum_squares(const Pack<T, N>& x) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float v = to_float(x.v[j]);
    s += v * v;
  }
  return s;
}

template <class T, class W, int N>
__device__ __forceinline__ Pack<T, N> normalize(const Pack<T, N>& x, const Pack<W, N>& g, float rstd,
                                                float shift) {
  Pack<T, N> y;
#pragma unroll
  for (int j = 0; j < N; ++j) y.v[j] = from_float<T>(to_float(x.v[j]) * rstd * (to_float(g.v[j]) + shift));
  return y;
}

// sum_j w_j * dy_j * x_hat_j over one pack.
template <class T, class W, int N>
__device__ __forceinline__ float weighted_dot(const Pack<T, N>& x, const Pack<T, N>& dy,
                                              const Pack<W, N>& g, float rstd, float shift) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j) s += (to_float(g.v[j]) + shift) * to_float(dy.v[j]) * (to_float(x.v[j]) * rstd);
  return s;
}

// dx of one pack; adds dy * x_hat into dgamma.
template <class T, class W, int N>
__device__ __forceinline__ Pack<T, N> input_grad(const Pack<T, N>& x, const Pack<T, N>& dy,
                                                 const Pack<W, N>& g, float rstd, float shift,
                                                 float mean_dot, float (&dgamma)[N]) {
  Pack<T, N> dx;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float x_hat = to_float(x.v[j]) * rstd;
    const float d = to_float(dy.v[j]);
    dx.v[j] = from_float<T>(rstd * ((to_float(g.v[j]) + shift) * d - x_hat * mean_dot));
    dgamma[j] += d * x_hat;
  }
  return dx;
}

// ---- forward ----------------------------------------------------------------------------------

// One warp per row; lane l owns vectors l, l + 32, ... (kIters of them cover the row).
template <class T, class W, int kVec, int kHidden, int kIters>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) fwd_warp_per_row(PtRmsNormFwdParams p) {
  using TP = Pack<T, kVec>;
  using WP = Pack<W, kVec>;
  const int hidden = kHidden > 0 ? kHidden : static_cast<int>(p.hidden);
  const int nvec = hidden / kVec;
  const int lane = threadIdx.x & 31;
  const float shift = p.zero_centered ? 1.f : 0.f;

  WP g[kIters];  // the same for every row: loaded once
  const WP* gp = static_cast<const WP*>(p.gamma);
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    if (lane + i * 32 < nvec) g[i] = gp[lane + i * 32];
  }

  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
       row < p.rows; row += step) {
    const TP* xr = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + row * hidden);
    TP* yr = reinterpret_cast<TP*>(static_cast<T*>(p.y) + row * hidden);
    TP xv[kIters];
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (lane + i * 32 < nvec) xv[i] = xr[lane + i * 32];
    }
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (lane + i * 32 < nvec) ss += sum_squares(xv[i]);
    }
    const float rstd = rsqrtf(warp_sum(ss) / hidden + p.eps);
    if (lane == 0) p.rstd[row] = rstd;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (lane + i * 32 < nvec) yr[lane + i * 32] = normalize(xv[i], g[i], rstd, shift);
    }
  }
}

// One block per row. Thread t owns vectors t, t + blockDim, ...; when the row fits in
// kBlockCacheIters vectors per thread (the host sizes the block so), x stays in registers between
// the reduction and the output; otherwise x is read twice (the second read mostly hits L2).
template <class T, class W, int kVec, int kHidden>
__global__ void __launch_bounds__(kMaxBlockThreads) fwd_block_per_row(PtRmsNormFwdParams p) {
  using TP = Pack<T, kVec>;
  using WP = Pack<W, kVec>;
  __shared__ float scratch[33];
  const int hidden = kHidden > 0 ? kHidden : static_cast<int>(p.hidden);
  const int nvec = hidden / kVec;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const float shift = p.zero_centered ? 1.f : 0.f;
  const WP* gp = static_cast<const WP*>(p.gamma);

  if (nvec <= kMaxBlockThreads * kBlockCacheIters) {
    WP g[kBlockCacheIters];
#pragma unroll
    for (int i = 0; i < kBlockCacheIters; ++i) {
      if (tid + i * nthreads < nvec) g[i] = gp[tid + i * nthreads];
    }
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      const TP* xr = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + row * hidden);
      TP* yr = reinterpret_cast<TP*>(static_cast<T*>(p.y) + row * hidden);
      TP xv[kBlockCacheIters];
#pragma unroll
      for (int i = 0; i < kBlockCacheIters; ++i) {
        if (tid + i * nthreads < nvec) xv[i] = xr[tid + i * nthreads];
      }
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < kBlockCacheIters; ++i) {
        if (tid + i * nthreads < nvec) ss += sum_squares(xv[i]);
      }
      const float rstd = rsqrtf(block_sum(ss, scratch) / hidden + p.eps);
      if (tid == 0) p.rstd[row] = rstd;
#pragma unroll
      for (int i = 0; i < kBlockCacheIters; ++i) {
        if (tid + i * nthreads < nvec) yr[tid + i * nthreads] = normalize(xv[i], g[i], rstd, shift);
      }
    }
  } else {
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      const TP* xr = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + row * hidden);
      TP* yr = reinterpret_cast<TP*>(static_cast<T*>(p.y) + row * hidden);
      float ss = 0.f;
#pragma unroll 4
      for (int v = tid; v < nvec; v += nthreads) ss += sum_squares(xr[v]);
      const float rstd = rsqrtf(block_sum(ss, scratch) / hidden + p.eps);
      if (tid == 0) p.rstd[row] = rstd;
#pragma unroll 4
      for (int v = tid; v < nvec; v += nthreads) yr[v] = normalize(xr[v], gp[v], rstd, shift);
    }
  }
}

// ---- backward ---------------------------------------------------------------------------------

// One warp per row. Each lane sums dy * x_hat for its columns over the warp's rows; the block's
// warps are then added in a fixed order into the block's partial row.
template <class T, class W, int kVec, int kHidden, int kIters>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) bwd_warp_per_row(PtRmsNormBwdParams p) {
  using TP = Pack<T, kVec>;
  using WP = Pack<W, kVec>;
  __shared__ float warp_partials[kWarpsPerBlock][kWarpMaxHidden];
  const int hidden = kHidden > 0 ? kHidden : static_cast<int>(p.hidden);
  const int nvec = hidden / kVec;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float shift = p.zero_centered ? 1.f : 0.f;

  WP g[kIters];
  const WP* gp = static_cast<const WP*>(p.gamma);
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    if (lane + i * 32 < nvec) g[i] = gp[lane + i * 32];
  }
  float dgamma[kIters][kVec];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) dgamma[i][j] = 0.f;
  }

  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < p.rows;
       row += step) {
    const float rstd = p.rstd[row];
    const int64_t offset = row * hidden;
    const TP* xr = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + offset);
    const TP* dyr = reinterpret_cast<const TP*>(static_cast<const T*>(p.dy) + offset);
    TP* dxr = reinterpret_cast<TP*>(static_cast<T*>(p.dx) + offset);
    TP xv[kIters], dyv[kIters];
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (lane + i * 32 < nvec) {
        xv[i] = xr[lane + i * 32];
        dyv[i] = dyr[lane + i * 32];
      }
    }
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (lane + i * 32 < nvec) dot += weighted_dot(xv[i], dyv[i], g[i], rstd, shift);
    }
    const float mean_dot = warp_sum(dot) / hidden;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (lane + i * 32 < nvec) {
        dxr[lane + i * 32] = input_grad(xv[i], dyv[i], g[i], rstd, shift, mean_dot, dgamma[i]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    if (lane + i * 32 < nvec) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) warp_partials[warp][(lane + i * 32) * kVec + j] = dgamma[i][j];
    }
  }
  __syncthreads();
  float* out = p.partials + static_cast<int64_t>(blockIdx.x) * hidden;
  for (int col = threadIdx.x; col < hidden; col += kWarpsPerBlock * 32) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpsPerBlock; ++w) s += warp_partials[w][col];
    out[col] = s;
  }
}

// One block per row; the block's partial row is partials[blockIdx.x]. Cached rows keep x, dy and
// the dgamma sums in registers; wider rows accumulate dgamma in the partial row itself, where each
// column has exactly one owning thread, so the read-modify-write needs neither atomics nor barriers.
template <class T, class W, int kVec, int kHidden>
__global__ void __launch_bounds__(kMaxBlockThreads) bwd_block_per_row(PtRmsNormBwdParams p) {
  using TP = Pack<T, kVec>;
  using WP = Pack<W, kVec>;
  using FP = Pack<float, kVec>;
  __shared__ float scratch[33];
  const int hidden = kHidden > 0 ? kHidden : static_cast<int>(p.hidden);
  const int nvec = hidden / kVec;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const float shift = p.zero_centered ? 1.f : 0.f;
  const WP* gp = static_cast<const WP*>(p.gamma);
  FP* partial = reinterpret_cast<FP*>(p.partials + static_cast<int64_t>(blockIdx.x) * hidden);

  if (nvec <= kMaxBlockThreads * kBlockCacheIters) {
    WP g[kBlockCacheIters];
    float dgamma[kBlockCacheIters][kVec];
#pragma unroll
    for (int i = 0; i < kBlockCacheIters; ++i) {
      if (tid + i * nthreads < nvec) g[i] = gp[tid + i * nthreads];
#pragma unroll
      for (int j = 0; j < kVec; ++j) dgamma[i][j] = 0.f;
    }
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      const float rstd = p.rstd[row];
      const int64_t offset = row * hidden;
      const TP* xr = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + offset);
      const TP* dyr = reinterpret_cast<const TP*>(static_cast<const T*>(p.dy) + offset);
      TP* dxr = reinterpret_cast<TP*>(static_cast<T*>(p.dx) + offset);
      TP xv[kBlockCacheIters], dyv[kBlockCacheIters];
#pragma unroll
      for (int i = 0; i < kBlockCacheIters; ++i) {
        if (tid + i * nthreads < nvec) {
          xv[i] = xr[tid + i * nthreads];
          dyv[i] = dyr[tid + i * nthreads];
        }
      }
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < kBlockCacheIters; ++i) {
        if (tid + i * nthreads < nvec) dot += weighted_dot(xv[i], dyv[i], g[i], rstd, shift);
      }
      const float mean_dot = block_sum(dot, scratch) / hidden;
#pragma unroll
      for (int i = 0; i < kBlockCacheIters; ++i) {
        if (tid + i * nthreads < nvec) {
          dxr[tid + i * nthreads] = input_grad(xv[i], dyv[i], g[i], rstd, shift, mean_dot, dgamma[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBlockCacheIters; ++i) {
      if (tid + i * nthreads < nvec) {
        FP out;
#pragma unroll
        for (int j = 0; j < kVec; ++j) out.v[j] = dgamma[i][j];
        partial[tid + i * nthreads] = out;
      }
    }
  } else {
    for (int v = tid; v < nvec; v += nthreads) {
      FP zero;
#pragma unroll
      for (int j = 0; j < kVec; ++j) zero.v[j] = 0.f;
      partial[v] = zero;
    }
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      const float rstd = p.rstd[row];
      const int64_t offset = row * hidden;
      const TP* xr = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + offset);
      const TP* dyr = reinterpret_cast<const TP*>(static_cast<const T*>(p.dy) + offset);
      TP* dxr = reinterpret_cast<TP*>(static_cast<T*>(p.dx) + offset);
      float dot = 0.f;
#pragma unroll 4
      for (int v = tid; v < nvec; v += nthreads) dot += weighted_dot(xr[v], dyr[v], gp[v], rstd, shift);
      const float mean_dot = block_sum(dot, scratch) / hidden;
#pragma unroll 2
      for (int v = tid; v < nvec; v += nthreads) {
        FP acc = partial[v];
        dxr[v] = input_grad(xr[v], dyr[v], gp[v], rstd, shift, mean_dot, acc.v);
        partial[v] = acc;
      }
    }
  }
}

// dgamma[c] = sum over k of partials[k, c], always in the same order: warp w adds the rows
// k = w, w + 8, ... in turn, then the 8 warp sums are added in warp order.
template <class W>
__global__ void __launch_bounds__(kFinalizeWarps * 32)
    dgamma_finalize(const float* partials, int64_t num_partials, int hidden, W* dgamma) {
  __shared__ float sums[kFinalizeWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = blockIdx.x * 32 + lane;
  float s = 0.f;
  if (col < hidden) {
#pragma unroll 4
    for (int64_t k = warp; k < num_partials; k += kFinalizeWarps) s += partials[k * hidden + col];
  }
  sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && col < hidden) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kFinalizeWarps; ++w) t += sums[w][lane];
    dgamma[col] = from_float<W>(t);
  }
}

// ---- host side of the module ------------------------------------------------------------------

inline int report_launch(const char* what, char* err, size_t err_len) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  snprintf(err, err_len, "%s launch failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return 1;
}

// T: x / y / dy / dx element type; W: gamma / dgamma element type. kVectorized: 16-byte accesses
// (the host checked pointers and hidden allow them). kHidden: the row length, or 0 for any.
template <class T, class W, bool kVectorized, int kHidden>
struct RmsNorm {
  static constexpr int kVec = kVectorized ? static_cast<int>(16 / sizeof(T)) : 1;
  static_assert(kHidden >= 0 && kHidden % kVec == 0, "kHidden must be a multiple of the vector width");
  static constexpr bool kHasWarpPath = kHidden == 0 || kHidden <= kWarpMaxHidden;
  static constexpr bool kHasBlockPath = kHidden == 0 || kHidden > kWarpMaxHidden;
  // Vectors per lane that cover the widest row of the warp path.
  static constexpr int kWarpIters = ceil_div(kHidden > 0 && kHidden < kWarpMaxHidden ? kHidden : kWarpMaxHidden,
                                             kVec * 32);

  // Threads of the block path: just enough for kBlockCacheIters vectors each, else the maximum.
  static int block_threads(int nvec) {
    if (nvec > kMaxBlockThreads * kBlockCacheIters) return kMaxBlockThreads;
    const int t = ceil_div(ceil_div(nvec, kBlockCacheIters), 32) * 32;
    return t < 64 ? 64 : t;
  }

  static bool check_hidden(int64_t hidden, char* err, size_t err_len) {
    if (hidden < 1 || hidden > INT32_MAX || hidden % kVec != 0 || (kHidden > 0 && hidden != kHidden)) {
      snprintf(err, err_len, "RMSNorm module (vector width %d, hidden %d) cannot take hidden %lld", kVec,
               kHidden, static_cast<long long>(hidden));
      return false;
    }
    return true;
  }

  static int forward(const PtRmsNormFwdParams* p, char* err, size_t err_len) {
    if (!check_hidden(p->hidden, err, err_len)) return 1;
    if (p->rows <= 0) return 0;
    auto stream = static_cast<cudaStream_t>(p->stream);
    const int64_t sms = p->num_sms > 0 ? p->num_sms : 132;
    const int nvec = static_cast<int>(p->hidden / kVec);
    if (p->hidden <= kWarpMaxHidden) {
      if constexpr (kHasWarpPath) {
        const int64_t grid = std::min<int64_t>(ceil_div(p->rows, kWarpsPerBlock), sms * 16);
        fwd_warp_per_row<T, W, kVec, kHidden, kWarpIters>
            <<<static_cast<unsigned>(grid), kWarpsPerBlock * 32, 0, stream>>>(*p);
      }
    } else {
      if constexpr (kHasBlockPath) {
        const int threads = block_threads(nvec);
        const int64_t grid = std::min<int64_t>(p->rows, sms * std::max(1, 2048 / threads));
        fwd_block_per_row<T, W, kVec, kHidden><<<static_cast<unsigned>(grid), threads, 0, stream>>>(*p);
      }
    }
    return report_launch("RMSNorm forward", err, err_len);
  }

  static int backward(const PtRmsNormBwdParams* p, char* err, size_t err_len) {
    if (!check_hidden(p->hidden, err, err_len)) return 1;
    if (p->rows <= 0) return 0;
    if (p->num_partials < 1 || p->num_partials > INT32_MAX) {
      snprintf(err, err_len, "RMSNorm backward: num_partials %lld is out of range",
               static_cast<long long>(p->num_partials));
      return 1;
    }
    auto stream = static_cast<cudaStream_t>(p->stream);
    const auto grid = static_cast<unsigned>(p->num_partials);
    const int nvec = static_cast<int>(p->hidden / kVec);
    if (p->hidden <= kWarpMaxHidden) {
      if constexpr (kHasWarpPath) {
        bwd_warp_per_row<T, W, kVec, kHidden, kWarpIters><<<grid, kWarpsPerBlock * 32, 0, stream>>>(*p);
      }
    } else {
      if constexpr (kHasBlockPath) {
        bwd_block_per_row<T, W, kVec, kHidden><<<grid, block_threads(nvec), 0, stream>>>(*p);
      }
    }
    if (report_launch("RMSNorm backward", err, err_len)) return 1;
    const int hidden = static_cast<int>(p->hidden);
    dgamma_finalize<W><<<static_cast<unsigned>(ceil_div(hidden, 32)), kFinalizeWarps * 32, 0, stream>>>(
        p->partials, p->num_partials, hidden, static_cast<W*>(p->dgamma));
    return report_launch("RMSNorm dgamma reduction", err, err_len);
  }
};

}  // namespace primus_turbo::kernels::rmsnorm
