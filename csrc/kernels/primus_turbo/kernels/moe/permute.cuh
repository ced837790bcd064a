// MoE token permutation modules: token_permute's kernels (by a routing mask, forward and
// backward; see permute_abi.h for the math) and the entry points of moe_permute's (route_map.cuh,
// rows.cuh), one module per token dtype and access width.
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
#include "primus_turbo/kernels/moe/common.cuh"
#include "primus_turbo/kernels/moe/route_map.cuh"
#include "primus_turbo/kernels/moe/rows.cuh"

namespace primus_turbo::kernels::moe {

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

// For a scatter on a given map: the rows it references are 0 .. total - 1 (rows are numbered
// consecutively, dropped routes are -1), so total = the largest row + 1, into the workspace slot
// zero_tail_kernel reads (zeroed before the launch).
__global__ void __launch_bounds__(kThreads) rows_used_kernel(PtMoePermuteParams p) {
  const int64_t n = p.num_tokens * p.num_experts;
  int top = -1;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    top = max(top, p.row_id_map[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
  if ((threadIdx.x & 31) == 0 && top >= 0)
    atomicMax(&p.workspace[route::layout(p.num_tokens, p.num_experts).scalars], top + 1);
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

  // A given map's referenced row count into the workspace slot zero_tail_kernel reads.
  static void count_rows_used(const PtMoePermuteParams* p, cudaStream_t s) {
    int32_t* total = p->workspace + route::layout(p->num_tokens, p->num_experts).scalars;
    cudaMemsetAsync(total, 0, sizeof(int32_t), s);
    const int64_t entries = p->num_tokens * p->num_experts;
    if (entries > 0) rows_used_kernel<<<grid(p, (entries + kThreads * 8 - 1) / (kThreads * 8)), kThreads, 0, s>>>(*p);
  }

  static int permute(const PtMoePermuteParams* p, char* err, size_t err_len) {
    if (!check(p, err, err_len)) return 1;
    auto s = static_cast<cudaStream_t>(p->stream);
    if (p->routing_map == nullptr && p->num_out > 0) count_rows_used(p, s);  // a given map
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

  // With a workspace, the rows of grad_input the map does not reference are zeroed too.
  static int unpermute_bwd(const PtMoePermuteParams* p, char* err, size_t err_len) {
    if (!check(p, err, err_len)) return 1;
    auto s = static_cast<cudaStream_t>(p->stream);
    const bool zero_rest = p->workspace != nullptr && p->num_out > 0;
    if (zero_rest) count_rows_used(p, s);
    if (p->num_tokens > 0) gather_bwd_kernel<T, V><<<grid(p, p->num_tokens), kThreads, 0, s>>>(*p);
    if (zero_rest) zero_tail_kernel<T, V><<<grid(p, p->num_out), kThreads, 0, s>>>(*p);
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
