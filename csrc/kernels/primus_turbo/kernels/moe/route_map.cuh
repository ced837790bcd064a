// The routing-map builder of the MoE permutations (token_permute's dense map, moe_permute's compact
// map; see PtMoeRouteParams in permute_abi.h), three launches and no host synchronization:
//   1. tile_count: a block per tile of 256 tokens turns the tile's routing into one 32-bit word
//      per (warp, expert) (bit j: the warp's token j is routed to the expert) and writes per-expert
//      counts of the tile and its routed-token count;
//   2. scan (one block): per expert, an exclusive scan of the tile counts (the rank base of each
//      tile), the expert's padded size, an exclusive scan over experts (the block offsets), the
//      used rows, tokens_per_expert, the overflow flag, and the compact map's padding rows;
//   3. rank: a block per tile rebuilds the words and writes each route's row: block offset + tile
//      base + the counts of earlier warps + the popcount of earlier lanes in the word.
// Ranks therefore follow token order exactly, whatever the launch order of the blocks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "primus_turbo/kernels/moe/permute_abi.h"

namespace primus_turbo::kernels::moe::route {

constexpr int kTileTokens = PT_MOE_ROUTE_TILE;
constexpr int kTileWarps = kTileTokens / 32;
constexpr int kScanThreads = 1024;  // >= the largest expert count

struct Layout {
  int64_t tile_counts, tile_dispatched, offsets, real, padded, scalars;
};

__host__ __device__ inline Layout layout(int64_t tokens, int32_t experts) {
  Layout l;
  l.tile_counts = 0;
  l.tile_dispatched = pt_moe_route_ws_tile_dispatched(tokens, experts);
  l.offsets = pt_moe_route_ws_offsets(tokens, experts);
  l.real = l.offsets + experts;
  l.padded = l.real + experts;
  l.scalars = pt_moe_route_ws_scalars(tokens, experts);
  return l;
}

__device__ __forceinline__ int64_t capacity_of(const PtMoeRouteParams& p) {
  return p.capacity < 0 ? INT64_MAX : p.capacity;
}

__device__ __forceinline__ int64_t load_index(const PtMoeRouteParams& p, int64_t i) {
  return p.routing_kind == 3 ? static_cast<const int64_t*>(p.routing)[i]
                             : static_cast<int64_t>(static_cast<const int32_t*>(p.routing)[i]);
}

// Bit j: mask column col[j * stride] is non-zero, for the `valid` first of 32 rows. All 32 loads are
// issued before any is used: one after the other, the warp waited for each (32 round trips a pass;
// token_permute's map build took 40-80 us at 8192 tokens).
template <class M>
__device__ __forceinline__ uint32_t mask_word(const M* col, int stride, int64_t valid) {
  M v[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) v[j] = j < valid ? col[j * stride] : 0;
  uint32_t word = 0u;
#pragma unroll
  for (int j = 0; j < 32; ++j) word |= static_cast<uint32_t>(v[j] != 0) << j;
  return word;
}

// bits[w * E + e]: bit j set when token (tile * 256 + w * 32 + j) is routed to expert e.
// Ends with a barrier.
__device__ inline void build_words(const PtMoeRouteParams& p, int64_t tile, uint32_t* bits) {
  const int E = p.num_experts, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < kTileWarps * E; i += blockDim.x) bits[i] = 0u;
  __syncthreads();
  const int64_t t0 = tile * kTileTokens + warp * 32;
  uint32_t* words = bits + warp * E;
  if (p.routing_kind <= 1) {  // a mask: lanes over experts, the warp's 32 tokens in turn
    const int64_t valid = p.num_tokens - t0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      if (e >= E) continue;
      uint32_t word;
      if (p.routing_kind == 0)
        word = mask_word(static_cast<const uint8_t*>(p.routing) + t0 * E + e, E, valid);
      else
        word = mask_word(static_cast<const int32_t*>(p.routing) + t0 * E + e, E, valid);
      words[e] = word;
    }
  } else {  // indices: a lane per token
    const int64_t t = t0 + lane;
    if (t < p.num_tokens) {
      for (int k = 0; k < p.topk; ++k) {
        const int64_t e = load_index(p, t * p.topk + k);
        if (e >= 0 && e < E) atomicOr(&words[e], 1u << lane);
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kTileTokens) tile_count_kernel(PtMoeRouteParams p) {
  extern __shared__ uint32_t route_smem[];
  __shared__ uint32_t any_routed[kTileWarps];
  const int E = p.num_experts;
  const int64_t tile = blockIdx.x;
  if (threadIdx.x < kTileWarps) any_routed[threadIdx.x] = 0u;
  build_words(p, tile, route_smem);
  const Layout l = layout(p.num_tokens, E);
  uint32_t any[kTileWarps];
#pragma unroll
  for (int w = 0; w < kTileWarps; ++w) any[w] = 0u;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int count = 0;
#pragma unroll
    for (int w = 0; w < kTileWarps; ++w) {
      const uint32_t b = route_smem[w * E + e];
      count += __popc(b);
      any[w] |= b;
    }
    p.workspace[l.tile_counts + tile * E + e] = count;
  }
#pragma unroll
  for (int w = 0; w < kTileWarps; ++w) {
    if (any[w]) atomicOr(&any_routed[w], any[w]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int d = 0;
#pragma unroll
    for (int w = 0; w < kTileWarps; ++w) d += __popc(any_routed[w]);
    p.workspace[l.tile_dispatched + tile] = d;
  }
}

// Exclusive sum of v over the block in thread order; *total gets the block's sum. scratch: 33 ints.
__device__ inline int block_exclusive_sum(int v, int* scratch, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) scratch[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < warps ? scratch[lane] : 0;
    int winc = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, winc, o);
      if (lane >= o) winc += n;
    }
    if (lane < warps) scratch[lane] = winc - w;
    if (lane == 31) scratch[32] = winc;
  }
  __syncthreads();
  const int r = scratch[warp] + inc - v;
  *total = scratch[32];
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kScanThreads) scan_kernel(PtMoeRouteParams p) {
  __shared__ int scratch[33];
  __shared__ int s_offset[kScanThreads], s_real[kScanThreads], s_padded[kScanThreads];
  const int E = p.num_experts, e = threadIdx.x;
  const int64_t tiles = pt_moe_route_tiles(p.num_tokens);
  const Layout l = layout(p.num_tokens, E);
  int32_t* ws = p.workspace;
  int real = 0;
  if (e < E) {  // the tile counts of expert e become exclusive prefixes (loads batched by 8)
    int64_t tl = 0;
    for (; tl + 8 <= tiles; tl += 8) {
      int c[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) c[j] = ws[l.tile_counts + (tl + j) * E + e];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        ws[l.tile_counts + (tl + j) * E + e] = real;
        real += c[j];
      }
    }
    for (; tl < tiles; ++tl) {
      const int c = ws[l.tile_counts + tl * E + e];
      ws[l.tile_counts + tl * E + e] = real;
      real += c;
    }
  }
  const int padded = e < E ? (p.align > 1 ? (real + p.align - 1) / p.align * p.align : real) : 0;
  int total;
  const int offset = block_exclusive_sum(padded, scratch, &total);
  const int64_t cap = capacity_of(p);
  if (e < E) {
    ws[l.offsets + e] = offset;
    ws[l.real + e] = real;
    ws[l.padded + e] = padded;
    s_offset[e] = offset, s_real[e] = real, s_padded[e] = padded;
    if (p.tokens_per_expert != nullptr) {
      const int64_t avail = cap - offset;
      p.tokens_per_expert[e] = avail <= 0 ? 0 : (avail < padded ? avail : padded);
    }
  }
  int d = 0;
  for (int64_t tl = threadIdx.x; tl < tiles; tl += blockDim.x) d += ws[l.tile_dispatched + tl];
  int dispatched;
  block_exclusive_sum(d, scratch, &dispatched);  // (ends with a barrier: s_* are visible)
  if (threadIdx.x == 0) {
    ws[l.scalars + 0] = static_cast<int>(total < cap ? total : cap);
    ws[l.scalars + 1] = total;
    ws[l.scalars + 2] = dispatched;
    if (p.overflow_flag != nullptr) *p.overflow_flag = total > cap ? 1 : 0;
    if (p.num_dispatched != nullptr) *p.num_dispatched = dispatched;
  }
  if (!p.compact || p.pad_rows <= 0) return;
  // Padding rows of the compact map: a warp per row i, experts compacted in order by ballots.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t stride = 2 * static_cast<int64_t>(E) + 1;
  for (int i = warp; i < p.pad_rows; i += warps) {
    int32_t* row = p.row_id_map + (p.num_tokens + i) * stride;
    int n = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int x = e0 + lane;
      bool has = false;
      int64_t slot = 0;
      if (x < E && i < s_padded[x] - s_real[x]) {
        slot = static_cast<int64_t>(s_offset[x]) + s_real[x] + i;
        has = slot < cap;
      }
      const unsigned b = __ballot_sync(0xffffffffu, has);
      if (has) {
        const int pos = n + __popc(b & ((1u << lane) - 1u));
        row[pos] = -static_cast<int32_t>(slot + 1);
        row[E + pos] = x;
      }
      n += __popc(b);
    }
    if (lane == 0) row[2 * E] = n;
  }
}

__device__ __forceinline__ int probs_column(const PtMoeRouteParams& p, int64_t t, int e) {
  if (p.probs_topk && p.routing_kind >= 2) {
    for (int k = 0; k < p.topk; ++k) {
      if (load_index(p, t * p.topk + k) == e) return k;
    }
  }
  return e;
}

__global__ void __launch_bounds__(kTileTokens) rank_kernel(PtMoeRouteParams p) {
  extern __shared__ uint32_t route_smem[];
  const int E = p.num_experts, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t* bits = route_smem;                                                  // [8][E]
  uint16_t* before = reinterpret_cast<uint16_t*>(bits + kTileWarps * E);        // [8][E]
  int32_t* base = reinterpret_cast<int32_t*>(before + kTileWarps * E);          // [E]
  const int64_t tile = blockIdx.x;
  build_words(p, tile, bits);
  const Layout l = layout(p.num_tokens, E);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = 0;
#pragma unroll
    for (int w = 0; w < kTileWarps; ++w) {
      before[w * E + e] = static_cast<uint16_t>(run);
      run += __popc(bits[w * E + e]);
    }
    base[e] = p.workspace[l.offsets + e] + p.workspace[l.tile_counts + tile * E + e];
  }
  __syncthreads();
  const int64_t cap = capacity_of(p);
  const int64_t t0 = tile * kTileTokens + warp * 32;
  if (!p.compact) {  // dense [T, E]: lanes over experts (coalesced rows of the map)
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      if (e >= E) continue;
      const uint32_t b = bits[warp * E + e];
      const int64_t b0 = static_cast<int64_t>(base[e]) + before[warp * E + e];
      for (int j = 0; j < 32; ++j) {
        const int64_t t = t0 + j;
        if (t >= p.num_tokens) break;
        const int64_t row = b0 + __popc(b & ((1u << j) - 1u));
        p.row_id_map[t * E + e] = ((b >> j) & 1u) && row < cap ? static_cast<int32_t>(row) : -1;
      }
    }
    return;
  }
  const int64_t t = t0 + lane;  // compact: a lane per token, experts in order
  if (t >= p.num_tokens) return;
  const int64_t stride = 2 * static_cast<int64_t>(E) + 1;
  int32_t* row = p.row_id_map + t * stride;
  const uint32_t earlier = (1u << lane) - 1u;
  int n = 0;
  for (int e = 0; e < E; ++e) {
    const uint32_t b = bits[warp * E + e];
    if (!((b >> lane) & 1u)) continue;
    const int64_t slot = static_cast<int64_t>(base[e]) + before[warp * E + e] + __popc(b & earlier);
    if (slot >= cap) continue;
    row[n] = static_cast<int32_t>(slot + 1);
    row[E + n] = probs_column(p, t, e);
    ++n;
  }
  row[2 * E] = n;
}

inline size_t count_smem(int E) { return static_cast<size_t>(kTileWarps) * E * sizeof(uint32_t); }
inline size_t rank_smem(int E) {
  return static_cast<size_t>(kTileWarps) * E * (sizeof(uint32_t) + sizeof(uint16_t)) + E * sizeof(int32_t);
}

// The three launches; returns the first launch error.
inline cudaError_t build(const PtMoeRouteParams& p) {
  auto s = static_cast<cudaStream_t>(p.stream);
  const int64_t tiles = pt_moe_route_tiles(p.num_tokens);
  const size_t rs = rank_smem(p.num_experts);
  if (rs > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(rank_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(rs));
    if (e != cudaSuccess) return e;
  }
  if (tiles > 0) tile_count_kernel<<<static_cast<unsigned>(tiles), kTileTokens, count_smem(p.num_experts), s>>>(p);
  scan_kernel<<<1, kScanThreads, 0, s>>>(p);
  if (tiles > 0) rank_kernel<<<static_cast<unsigned>(tiles), kTileTokens, rs, s>>>(p);
  return cudaGetLastError();
}

}  // namespace primus_turbo::kernels::moe::route
