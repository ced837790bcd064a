// Row movement of moe_permute / moe_unpermute over the compact map (see PtMoeRouteParams in
// permute_abi.h): a scatter (token -> its rows; padding and unused rows zero) and a gather
// (token <- the fp32 sum of its rows in map order), plus the count of the rows in use.
#pragma once

#include <cstdint>

#include "primus_turbo/kernels/moe/common.cuh"
#include "primus_turbo/kernels/moe/permute_abi.h"
#include "primus_turbo/kernels/moe/route_map.cuh"

namespace primus_turbo::kernels::moe {

// A group of G threads (a power of two, 32..256) moves one row at a time; the block's groups and
// the grid's blocks stride over the rows, so a block keeps several rows in flight, each thread
// issuing all its loads of a row before its stores.

template <class U>
__device__ __forceinline__ U zero_unit() {
  return U{};
}
template <>
__device__ __forceinline__ uint4 zero_unit<uint4>() {
  return make_uint4(0u, 0u, 0u, 0u);
}

constexpr int kScatterUnits = 4;  // units per thread and pass
constexpr int kGatherUnits = 2;
constexpr int kGatherRoutes = 4;  // routes loaded before they are summed (in order)

// Zeroes row r of dst (and its probability and scales).
template <class U>
__device__ __forceinline__ void zero_row(const PtMoeRouteParams& p, int64_t r, int g, int G) {
  if (r < 0 || r >= p.num_rows) return;
  U* dst = static_cast<U*>(p.dst) + r * p.row_units;
  const U z = zero_unit<U>();
  for (int64_t u = g; u < p.row_units; u += G) dst[u] = z;
  if (p.dst_probs != nullptr && g == 0) store_prob(p.dst_probs, p.probs_dtype, r, 0.f);
  if (p.dst_scales != nullptr) {
    for (int s = g; s < p.scales_per_row; s += G) p.dst_scales[r * p.scales_per_row + s] = 0.f;
  }
}

// dst[row] = src[t] for every route of token t (probabilities and scales alike); the padding rows
// the map lists and rows [*rows_in_use, M) become zero.
template <class U>
__global__ void __launch_bounds__(kThreads) rows_scatter_kernel(PtMoeRouteParams p, int G) {
  const int groups = kThreads / G, g = threadIdx.x % G, grp = threadIdx.x / G;
  const int E = p.num_experts;
  const int64_t stride = 2 * static_cast<int64_t>(E) + 1, T = p.num_tokens, P = p.pad_rows, M = p.num_rows;
  int64_t in_use = *p.rows_in_use;
  in_use = in_use < 0 ? 0 : (in_use > M ? M : in_use);
  const int64_t items = T + P + (M - in_use);
  const int64_t units = p.row_units;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * groups + grp; item < items;
       item += static_cast<int64_t>(gridDim.x) * groups) {
    if (item >= T + P) {
      zero_row<U>(p, in_use + (item - T - P), g, G);
      continue;
    }
    const int32_t* row = p.row_id_map + item * stride;
    const int n = row[2 * E];
    if (item >= T) {
      for (int i = 0; i < n; ++i) zero_row<U>(p, -static_cast<int64_t>(row[i]) - 1, g, G);
      continue;
    }
    if (n <= 0) continue;
    const U* src = static_cast<const U*>(p.src) + item * units;
    for (int64_t u0 = 0; u0 < units; u0 += kScatterUnits * G) {
      U x[kScatterUnits];
#pragma unroll
      for (int c = 0; c < kScatterUnits; ++c) {
        const int64_t u = u0 + c * G + g;
        if (u < units) x[c] = src[u];
      }
      for (int i = 0; i < n; ++i) {
        const int64_t r = static_cast<int64_t>(row[i]) - 1;
        if (r < 0 || r >= M) continue;
        U* dst = static_cast<U*>(p.dst) + r * units;
#pragma unroll
        for (int c = 0; c < kScatterUnits; ++c) {
          const int64_t u = u0 + c * G + g;
          if (u < units) dst[u] = x[c];
        }
      }
    }
    if (p.dst_probs != nullptr) {
      for (int i = g; i < n; i += G) {
        const int64_t r = static_cast<int64_t>(row[i]) - 1;
        const int col = row[E + i];
        if (r < 0 || r >= M) continue;
        const float v = col >= 0 && col < p.probs_width && p.src_probs != nullptr
                            ? load_prob(p.src_probs, p.probs_dtype, item * p.probs_width + col)
                            : 0.f;
        store_prob(p.dst_probs, p.probs_dtype, r, v);
      }
    }
    if (p.dst_scales != nullptr) {
      const int S = p.scales_per_row;
      for (int i = 0; i < n; ++i) {
        const int64_t r = static_cast<int64_t>(row[i]) - 1;
        if (r < 0 || r >= M) continue;
        for (int s = g; s < S; s += G) p.dst_scales[r * S + s] = p.src_scales[item * S + s];
      }
    }
  }
}

// dst[t] = sum of src[row] over token t's routes, fp32 in expert order; dst_probs[t, col] =
// src_probs[row] for each route, zero elsewhere.
template <class T, int V>
__global__ void __launch_bounds__(kThreads) rows_gather_kernel(PtMoeRouteParams p, int G) {
  using P = Pack<T, V>;
  const int groups = kThreads / G, g = threadIdx.x % G, grp = threadIdx.x / G;
  const int E = p.num_experts;
  const int64_t stride = 2 * static_cast<int64_t>(E) + 1, M = p.num_rows, units = p.row_units;
  const P* src = static_cast<const P*>(p.src);
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * groups + grp; t < p.num_out_tokens;
       t += static_cast<int64_t>(gridDim.x) * groups) {
    const int32_t* row = p.row_id_map + t * stride;
    const int n = row[2 * E];
    for (int64_t u0 = 0; u0 < units; u0 += kGatherUnits * G) {
      float acc[kGatherUnits][V];
#pragma unroll
      for (int c = 0; c < kGatherUnits; ++c) {
#pragma unroll
        for (int j = 0; j < V; ++j) acc[c][j] = 0.f;
      }
      for (int i0 = 0; i0 < n; i0 += kGatherRoutes) {
        P x[kGatherRoutes][kGatherUnits];
#pragma unroll
        for (int k = 0; k < kGatherRoutes; ++k) {
          const int64_t r = i0 + k < n ? static_cast<int64_t>(row[i0 + k]) - 1 : -1;
          const bool ok = r >= 0 && r < M;
#pragma unroll
          for (int c = 0; c < kGatherUnits; ++c) {
            const int64_t u = u0 + c * G + g;
            if (ok && u < units) {
              x[k][c] = src[r * units + u];
            } else {
#pragma unroll
              for (int j = 0; j < V; ++j) x[k][c].v[j] = from_float<T>(0.f);
            }
          }
        }
#pragma unroll
        for (int k = 0; k < kGatherRoutes; ++k) {
          if (i0 + k >= n) break;
#pragma unroll
          for (int c = 0; c < kGatherUnits; ++c) {
#pragma unroll
            for (int j = 0; j < V; ++j) acc[c][j] += to_float(x[k][c].v[j]);
          }
        }
      }
#pragma unroll
      for (int c = 0; c < kGatherUnits; ++c) {
        const int64_t u = u0 + c * G + g;
        if (u >= units) continue;
        P y;
#pragma unroll
        for (int j = 0; j < V; ++j) y.v[j] = from_float<T>(acc[c][j]);
        static_cast<P*>(p.dst)[t * units + u] = y;
      }
    }
    if (p.dst_probs != nullptr) {
      for (int col = g; col < p.probs_width; col += G) {
        float v = 0.f;
        for (int i = 0; i < n; ++i) {
          if (row[E + i] != col) continue;
          const int64_t r = static_cast<int64_t>(row[i]) - 1;
          if (r >= 0 && r < M && p.src_probs != nullptr) v = load_prob(p.src_probs, p.probs_dtype, r);
          break;
        }
        store_prob(p.dst_probs, p.probs_dtype, t * p.probs_width + col, v);
      }
    }
  }
}

// *rows_in_use = the number of slots the compact map lists (token and padding rows).
__global__ void __launch_bounds__(1024) count_rows_kernel(PtMoeRouteParams p) {
  __shared__ int scratch[33];
  const int64_t stride = 2 * static_cast<int64_t>(p.num_experts) + 1;
  int n = 0;
  for (int64_t r = threadIdx.x; r < p.num_tokens + p.pad_rows; r += blockDim.x) {
    n += p.row_id_map[r * stride + 2 * p.num_experts];
  }
  int total;
  route::block_exclusive_sum(n, scratch, &total);
  if (threadIdx.x == 0) *p.rows_in_use = total;
}

// Threads per row group: the smallest power of two in [32, 256] covering the row in one pass of
// `per_thread` units each.
inline int group_threads(int64_t units, int per_thread) {
  int g = 32;
  while (g < kThreads && static_cast<int64_t>(g) * per_thread < units) g <<= 1;
  return g;
}

inline unsigned rows_grid(int num_sms, int64_t items, int groups) {
  const int64_t blocks = (items + groups - 1) / groups;
  const int64_t cap = static_cast<int64_t>(num_sms > 0 ? num_sms : 132) * 8;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

}  // namespace primus_turbo::kernels::moe
