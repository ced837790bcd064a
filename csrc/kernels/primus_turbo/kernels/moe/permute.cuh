// MoE token permutation by a routing mask, forward and backward (see permute_abi.h for the math).
//
// The map is built without host synchronization by the routing-map builder that moe_permute
// shares (route_map.cuh: tile counts, a scan, ranks in token order), written token-major so that
// the data kernels read a token's E entries coalesced.
// The data kernels take one token per block: the token's routes are compacted in expert order
// into shared memory (a ballot scan again, so sums run in a fixed order), then every thread moves
// 16-byte vectors of the row (scalar elements when the host found the rows unaligned).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/moe/permute_abi.h"
#include "primus_turbo/kernels/moe/route_map.cuh"

namespace primus_turbo::kernels::moe {

constexpr int kMaxExperts = 1024;
constexpr int kThreads = 256;

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
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// pt_dtype codes of the probabilities: 0 float32, 1 float16, 2 bfloat16.
__device__ __forceinline__ float load_prob(const void* p, int dtype, int64_t i) {
  if (dtype == 1) return __half2float(static_cast<const __half*>(p)[i]);
  if (dtype == 2) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_prob(void* p, int dtype, int64_t i, float v) {
  if (dtype == 1) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else if (dtype == 2) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<float*>(p)[i] = v;
}

// Exclusive count of `flag` over the block in thread order; *total gets the block's count.
// scratch: 33 ints. Safe to call back to back (the trailing barrier protects scratch).
__device__ __forceinline__ int block_exclusive_count(bool flag, int* scratch, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1));
  if (lane == 0) scratch[warp] = __popc(ballot);
  __syncthreads();
  if (warp == 0) {
    const int v = lane < warps ? scratch[lane] : 0;
    int inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += n;
    }
    if (lane < warps) scratch[lane] = inc - v;
    if (lane == warps - 1) scratch[32] = inc;
  }
  __syncthreads();
  const int r = scratch[warp] + in_warp;
  *total = scratch[32];
  __syncthreads();
  return r;
}

// ---- data ----------------------------------------------------------------------------------

// The routes of token t in expert order: rows[i], experts[i] for i < count. Every thread returns
// the count.
__device__ __forceinline__ int collect_routes(const PtMoePermuteParams& p, int64_t t, int* rows, int* experts,
                                              int* scratch) {
  int count = 0;
  for (int base = 0; base < p.num_experts; base += blockDim.x) {
    const int e = base + threadIdx.x;
    const int row = e < p.num_experts ? p.row_id_map[t * p.num_experts + e] : -1;
    int n;
    const int i = block_exclusive_count(row >= 0, scratch, &n);
    if (row >= 0) rows[count + i] = row, experts[count + i] = e;
    count += n;
  }
  __syncthreads();
  return count;
}

// output[row] = input[t] for every route; permuted_probs[row] = probs[t, e].
template <class T, int V>
__global__ void __launch_bounds__(kThreads) scatter_kernel(PtMoePermuteParams p) {
  using P = Pack<T, V>;
  __shared__ int rows[kMaxExperts], experts[kMaxExperts], scratch[33];
  const int64_t nvec = p.hidden / V;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int n = collect_routes(p, t, rows, experts, scratch);
    if (p.probs != nullptr && p.permuted_probs != nullptr) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        store_prob(p.permuted_probs, p.probs_dtype, rows[i], load_prob(p.probs, p.probs_dtype, t * p.num_experts + experts[i]));
      }
    }
    const P* src = static_cast<const P*>(p.input) + t * nvec;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      const P x = src[v];
      for (int i = 0; i < n; ++i) static_cast<P*>(p.output)[rows[i] * nvec + v] = x;
    }
    __syncthreads();  // rows / experts are rewritten for the next token
  }
}

// Rows [total, num_out) of the permuted tensor (and its probs) are zero.
template <class T, int V>
__global__ void __launch_bounds__(kThreads) zero_tail_kernel(PtMoePermuteParams p) {
  using P = Pack<T, V>;
  const int64_t nvec = p.hidden / V;
  const int64_t total = p.workspace[route::layout(p.num_tokens, p.num_experts).scalars];
  P zero;
#pragma unroll
  for (int j = 0; j < V; ++j) zero.v[j] = from_float<T>(0.f);
  for (int64_t r = total + blockIdx.x; r < p.num_out; r += gridDim.x) {
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) static_cast<P*>(p.output)[r * nvec + v] = zero;
    if (threadIdx.x == 0 && p.permuted_probs != nullptr) store_prob(p.permuted_probs, p.probs_dtype, r, 0.f);
  }
}

// output[t] = sum over routes of (probs[t, e] *) input[row], in expert order, fp32.
template <class T, int V>
__global__ void __launch_bounds__(kThreads) gather_kernel(PtMoePermuteParams p) {
  using P = Pack<T, V>;
  __shared__ int rows[kMaxExperts], experts[kMaxExperts], scratch[33];
  __shared__ float weights[kMaxExperts];
  const int64_t nvec = p.hidden / V;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int n = collect_routes(p, t, rows, experts, scratch);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      weights[i] = p.probs != nullptr ? load_prob(p.probs, p.probs_dtype, t * p.num_experts + experts[i]) : 1.f;
    }
    if (p.grad_probs != nullptr) {  // the permute's probs gradient: gathered, zero where not routed
      for (int e = threadIdx.x; e < p.num_experts; e += blockDim.x) {
        const int row = p.row_id_map[t * p.num_experts + e];
        store_prob(p.grad_probs, p.probs_dtype, t * p.num_experts + e,
                   row >= 0 ? load_prob(p.permuted_probs, p.probs_dtype, row) : 0.f);
      }
    }
    __syncthreads();
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      float acc[V];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = 0.f;
      for (int i = 0; i < n; ++i) {
        const P x = static_cast<const P*>(p.input)[rows[i] * nvec + v];
        const float w = weights[i];
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += w * to_float(x.v[j]);
      }
      P y;
#pragma unroll
      for (int j = 0; j < V; ++j) y.v[j] = from_float<T>(acc[j]);
      static_cast<P*>(p.output)[t * nvec + v] = y;
    }
    __syncthreads();
  }
}

// Backward of the merging gather: output[row] = grad_output[t] * probs[t, e];
// grad_probs[t, e] = <grad_output[t], fwd_input[row]> (fp32, fixed-order block sums), 0 where not routed.
template <class T, int V>
__global__ void __launch_bounds__(kThreads) gather_bwd_kernel(PtMoePermuteParams p) {
  using P = Pack<T, V>;
  __shared__ int rows[kMaxExperts], experts[kMaxExperts], scratch[33];
  __shared__ float partial[kThreads / 32];
  const int64_t nvec = p.hidden / V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int n = collect_routes(p, t, rows, experts, scratch);
    for (int e = threadIdx.x; e < p.num_experts; e += blockDim.x) {
      if (p.row_id_map[t * p.num_experts + e] < 0) store_prob(p.grad_probs, p.probs_dtype, t * p.num_experts + e, 0.f);
    }
    const P* g = static_cast<const P*>(p.grad_output) + t * nvec;
    for (int i = 0; i < n; ++i) {
      const int64_t row = rows[i];
      const float w = load_prob(p.probs, p.probs_dtype, t * p.num_experts + experts[i]);
      float dot = 0.f;
      for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        const P gv = g[v];
        const P x = static_cast<const P*>(p.fwd_input)[row * nvec + v];
        P y;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float gf = to_float(gv.v[j]);
          dot += gf * to_float(x.v[j]);
          y.v[j] = from_float<T>(gf * w);
        }
        static_cast<P*>(p.output)[row * nvec + v] = y;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (lane == 0) partial[warp] = dot;
      __syncthreads();
      if (threadIdx.x == 0) {
        float s = 0.f;
        for (int w2 = 0; w2 < (int)(blockDim.x >> 5); ++w2) s += partial[w2];
        store_prob(p.grad_probs, p.probs_dtype, t * p.num_experts + experts[i], s);
      }
      __syncthreads();
    }
    __syncthreads();
  }
}

// ---- index-based rows (moe_permute / moe_unpermute) over a compact map ----------------------
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

inline int report_launch(const char* what, char* err, size_t err_len) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  snprintf(err, err_len, "%s launch failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return 1;
}

// T: the token dtype; kVectorized: rows move as 16-byte vectors (the host checked H and pointers).
template <class T, bool kVectorized>
struct MoePermute {
  static constexpr int V = kVectorized ? static_cast<int>(16 / sizeof(T)) : 1;

  static bool check(const PtMoePermuteParams* p, char* err, size_t err_len) {
    if (p->num_experts < 1 || p->num_experts > kMaxExperts || p->hidden % V || p->num_tokens > INT32_MAX ||
        p->num_out > INT32_MAX) {
      snprintf(err, err_len, "MoE permute module (vector %d) cannot take %d experts, hidden %lld", V, p->num_experts,
               static_cast<long long>(p->hidden));
      return false;
    }
    return true;
  }

  static unsigned grid(const PtMoePermuteParams* p, int64_t rows) {
    const int64_t cap = static_cast<int64_t>(p->num_sms > 0 ? p->num_sms : 132) * 8;
    return static_cast<unsigned>(rows < cap ? (rows > 0 ? rows : 1) : cap);
  }

  static int build_map(const PtMoePermuteParams* p, char* err, size_t err_len) {
    if (!check(p, err, err_len)) return 1;
    PtMoeRouteParams r{};
    r.num_tokens = p->num_tokens, r.num_experts = p->num_experts;
    r.routing_kind = p->routing_map_bytes == 4 ? 1 : 0;
    r.routing = p->routing_map;
    r.align = 1, r.capacity = p->num_out, r.compact = 0;
    r.row_id_map = p->row_id_map, r.workspace = p->workspace;
    r.stream = p->stream;
    route::build(r);
    return report_launch("MoE permute map", err, err_len);
  }

  static int permute(const PtMoePermuteParams* p, char* err, size_t err_len) {
    if (!check(p, err, err_len)) return 1;
    auto s = static_cast<cudaStream_t>(p->stream);
    if (p->num_tokens > 0) scatter_kernel<T, V><<<grid(p, p->num_tokens), kThreads, 0, s>>>(*p);
    if (p->num_out > 0) zero_tail_kernel<T, V><<<grid(p, p->num_out), kThreads, 0, s>>>(*p);
    return report_launch("MoE permute", err, err_len);
  }

  static int unpermute(const PtMoePermuteParams* p, char* err, size_t err_len) {
    if (!check(p, err, err_len)) return 1;
    if (p->num_tokens > 0) {
      gather_kernel<T, V><<<grid(p, p->num_tokens), kThreads, 0, static_cast<cudaStream_t>(p->stream)>>>(*p);
    }
    return report_launch("MoE unpermute", err, err_len);
  }

  // ---- index-based (compact map) ----
  using Unit = std::conditional_t<kVectorized, uint4, std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>>;

  static bool check_route(const PtMoeRouteParams* p, char* err, size_t err_len) {
    if (p->num_experts < 1 || p->num_experts > kMaxExperts || p->num_tokens > INT32_MAX || p->num_rows > INT32_MAX) {
      snprintf(err, err_len, "MoE route module cannot take %d experts, %lld tokens", p->num_experts,
               static_cast<long long>(p->num_tokens));
      return false;
    }
    return true;
  }

  static int route_build(const PtMoeRouteParams* p, char* err, size_t err_len) {
    if (!check_route(p, err, err_len)) return 1;
    route::build(*p);
    return report_launch("MoE route map", err, err_len);
  }

  // Moves whole rows as Unit (16 bytes, or the element): any token dtype of the unit's size.
  static int rows_scatter(const PtMoeRouteParams* p, char* err, size_t err_len) {
    if (!check_route(p, err, err_len)) return 1;
    auto s = static_cast<cudaStream_t>(p->stream);
    if (p->count_rows) count_rows_kernel<<<1, 1024, 0, s>>>(*p);
    const int G = group_threads(p->row_units, kScatterUnits);
    const int64_t items = p->num_tokens + p->pad_rows + p->num_rows;
    if (items > 0) rows_scatter_kernel<Unit><<<rows_grid(p->num_sms, items, kThreads / G), kThreads, 0, s>>>(*p, G);
    return report_launch("MoE rows scatter", err, err_len);
  }

  static int rows_gather(const PtMoeRouteParams* p, char* err, size_t err_len) {
    if (!check_route(p, err, err_len)) return 1;
    const int G = group_threads(p->row_units, kGatherUnits);
    if (p->num_out_tokens > 0) {
      rows_gather_kernel<T, V><<<rows_grid(p->num_sms, p->num_out_tokens, kThreads / G), kThreads, 0,
                                 static_cast<cudaStream_t>(p->stream)>>>(*p, G);
    }
    return report_launch("MoE rows gather", err, err_len);
  }

  static int unpermute_bwd(const PtMoePermuteParams* p, char* err, size_t err_len) {
    if (!check(p, err, err_len)) return 1;
    if (p->num_tokens > 0) {
      gather_bwd_kernel<T, V><<<grid(p, p->num_tokens), kThreads, 0, static_cast<cudaStream_t>(p->stream)>>>(*p);
    }
    return report_launch("MoE unpermute backward", err, err_len);
  }
};

}  // namespace primus_turbo::kernels::moe

#define PT_JIT_EXPORT_MOE_PERMUTE(Kernel)                                                                   \
  PT_JIT_EXPORT_ABI_VERSION                                                                                 \
  extern "C" __attribute__((visibility("default"))) int pt_moe_build_map_run(const PtMoePermuteParams* p,   \
                                                                             char* err, size_t n) {         \
    return Kernel::build_map(p, err, n);                                                                    \
  }                                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_moe_permute_run(const PtMoePermuteParams* p,     \
                                                                           char* err, size_t n) {           \
    return Kernel::permute(p, err, n);                                                                      \
  }                                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_moe_unpermute_run(const PtMoePermuteParams* p,   \
                                                                             char* err, size_t n) {         \
    return Kernel::unpermute(p, err, n);                                                                    \
  }                                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_moe_unpermute_bwd_run(                           \
      const PtMoePermuteParams* p, char* err, size_t n) {                                                   \
    return Kernel::unpermute_bwd(p, err, n);                                                                \
  }                                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_moe_route_build_run(const PtMoeRouteParams* p,   \
                                                                               char* err, size_t n) {       \
    return Kernel::route_build(p, err, n);                                                                  \
  }                                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_moe_rows_scatter_run(const PtMoeRouteParams* p,  \
                                                                                char* err, size_t n) {      \
    return Kernel::rows_scatter(p, err, n);                                                                 \
  }                                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_moe_rows_gather_run(const PtMoeRouteParams* p,   \
                                                                               char* err, size_t n) {       \
    return Kernel::rows_gather(p, err, n);                                                                  \
  }
