// Quantization of a contiguous [m, k] tensor by 128 x 128 tiles staged in shared memory.
//
// One CTA reads its tile from HBM once (16-byte loads when the row length and pointer allow) and
// can write two outputs from it: quantized along k (row-major, like x) and quantized along m,
// either in place ([m, k]) or transposed ([k, m], what Hopper FP8 tensor cores need for the
// backward GEMMs). Both writes are coalesced: the row output by a warp per row, the column output
// by a thread per column writing 16-byte runs of its output row.
//
// Scales come from the tile itself for block granularities (1 x B, B x 1, B x B with B = 32 or 128),
// or from an amax reduced beforehand (tensorwise / rowwise: the amax kernel below, whose result
// stays on the device, so nothing waits on the host). Tile stages, separated by barriers:
//   A. amax of every 32-element segment of each row and each column;
//   B. the scale of every segment's block (and scale_inv written by the block's owner);
//   C. quantize and store.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "primus_turbo/kernels/quantization/quant_abi.h"
#include "primus_turbo/kernels/quantization/quant_formats.cuh"

namespace primus_turbo::kernels::quant {

constexpr int kTile = 128;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSegs = kTile / 32;
// Row stride of the tile in elements: 16 bytes of padding keeps every row 16-byte aligned and
// shifts consecutive rows across banks.
template <class S>
constexpr int kLdOf = kTile + 16 / static_cast<int>(sizeof(S));

// The tile is held in the input's 16-bit type when it can be (half the shared memory, so more
// CTAs per SM hide more latency), in fp32 for fp32 inputs and when the Hadamard transform
// rewrites it in place.
template <class S>
constexpr size_t tile_smem_bytes() {
  return sizeof(S) * kTile * kLdOf<S> + sizeof(float) * (4 * kTile * kSegs + 16);
}

template <class S>
struct TileSmem {
  S* tile;           // [kTile][kLdOf<S>]
  float* seg_row;    // [kTile][kSegs]: amax of 32-column segments, then their scale multipliers
  float* seg_col;    // [kSegs][kTile]: amax of 32-row segments
  float* row_mult;   // [kTile][kSegs]
  float* col_mult;   // [kSegs][kTile]
  float* blk2d;      // [4][4]: amax of 2-D blocks
};

template <class S>
__device__ __forceinline__ TileSmem<S> carve(float* base) {
  TileSmem<S> s;
  s.tile = reinterpret_cast<S*>(base);
  s.seg_row = reinterpret_cast<float*>(s.tile + kTile * kLdOf<S>);
  s.seg_col = s.seg_row + kTile * kSegs;
  s.row_mult = s.seg_col + kTile * kSegs;
  s.col_mult = s.row_mult + kTile * kSegs;
  s.blk2d = s.col_mult + kTile * kSegs;
  return s;
}

__device__ __forceinline__ float warp_max(float a, int width) {
  for (int o = 1; o < width; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

// Four consecutive tile elements as floats (p is 4-element aligned), and the reverse.
__device__ __forceinline__ float4 read4(const float* p) { return *reinterpret_cast<const float4*>(p); }
template <class S>
__device__ __forceinline__ float4 read4(const S* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const S* e = reinterpret_cast<const S*>(&u);
  return make_float4(to_float(e[0]), to_float(e[1]), to_float(e[2]), to_float(e[3]));
}

// Loads the tile at (m0, k0); elements outside [m, k] read as 0 (they never raise an amax).
template <class T, class S>
__device__ __forceinline__ void load_tile(const T* __restrict__ x, int64_t m, int64_t k, int64_t m0, int64_t k0,
                                          S* tile) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kVecPerRow = kTile / V;
  constexpr int kIters = kTile * kVecPerRow / kThreads;
  const bool vec = k % V == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (vec) {
    uint4 regs[kIters];
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int64_t gr = m0 + idx / kVecPerRow, gc = k0 + (idx % kVecPerRow) * V;
      regs[i] = (gr < m && gc < k) ? __ldg(reinterpret_cast<const uint4*>(x + gr * k + gc)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      S* dst = tile + (idx / kVecPerRow) * kLdOf<S> + (idx % kVecPerRow) * V;
      if constexpr (std::is_same_v<S, T>) {
        *reinterpret_cast<uint4*>(dst) = regs[i];
      } else {
        const T* e = reinterpret_cast<const T*>(&regs[i]);
#pragma unroll
        for (int j = 0; j < V; j += 4) {
          *reinterpret_cast<float4*>(dst + j) =
              make_float4(to_float(e[j]), to_float(e[j + 1]), to_float(e[j + 2]), to_float(e[j + 3]));
        }
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < kTile * kTile; idx += kThreads) {
      const int r = idx / kTile, c = idx % kTile;
      const int64_t gr = m0 + r, gc = k0 + c;
      tile[r * kLdOf<S> + c] = from_float<S>((gr < m && gc < k) ? to_float(x[gr * k + gc]) : 0.0f);
    }
  }
}

// Two 16-bit tile values as one register: their |max| is one instruction (HMNMX2), exact, and
// NaN-ignoring like fmaxf, so amax is taken on the stored values without converting each to fp32.
template <class S>
struct PairOf;
template <>
struct PairOf<__nv_bfloat16> {
  using T = __nv_bfloat162;
};
template <>
struct PairOf<__half> {
  using T = __half2;
};

template <class P>
__device__ __forceinline__ float pair_max(P a) {
  return fmaxf(__low2float(a), __high2float(a));
}

// Stage A for rows: amax of each 32-column segment (a warp per row, 4 consecutive values per
// lane). With rht the tile is transformed in place first.
template <class S>
__device__ __forceinline__ void row_segment_amax(TileSmem<S> s, bool rht) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if constexpr (!std::is_same_v<S, float>) {  // 16-bit tile (never transformed in place)
    using P = typename PairOf<S>::T;
    for (int r = warp; r < kTile; r += kWarps) {
      const P* p = reinterpret_cast<const P*>(s.tile + r * kLdOf<S> + 4 * lane);
      float a = pair_max(__hmax2(__habs2(p[0]), __habs2(p[1])));
      a = warp_max(a, 8);
      if (lane % 8 == 0) s.seg_row[r * kSegs + lane / 8] = a;
    }
  } else {
    for (int r = warp; r < kTile; r += kWarps) {
      float* p = s.tile + r * kLdOf<S> + 4 * lane;
      const float4 f = read4(p);
      float v[4] = {f.x, f.y, f.z, f.w};
      if (rht) {
        rht16_lanes(v, lane);
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
      }
      float a = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
      a = warp_max(a, 8);
      if (lane % 8 == 0) s.seg_row[r * kSegs + lane / 8] = a;
    }
  }
}

// Stage A for columns: a thread per column and half tile (64 rows, two 32-row segments); for a
// 16-bit tile, a thread per pair of columns and 32-row segment, reading both columns at once.
template <class S>
__device__ __forceinline__ void col_segment_amax(TileSmem<S> s, bool rht) {
  if constexpr (!std::is_same_v<S, float>) {
    using P = typename PairOf<S>::T;
    static_assert(kThreads == (kTile / 2) * kSegs, "one thread per column pair and segment");
    const int c = 2 * (threadIdx.x % (kTile / 2)), seg = threadIdx.x / (kTile / 2);
    const S* col = s.tile + 32 * seg * kLdOf<S> + c;
    P a = __habs2(*reinterpret_cast<const P*>(col));
#pragma unroll
    for (int j = 1; j < 32; ++j) a = __hmax2(a, __habs2(*reinterpret_cast<const P*>(col + j * kLdOf<S>)));
    s.seg_col[seg * kTile + c] = __low2float(a);
    s.seg_col[seg * kTile + c + 1] = __high2float(a);
  } else {
    const int c = threadIdx.x % kTile, half = threadIdx.x / kTile;
    for (int seg = 2 * half; seg < 2 * half + 2; ++seg) {
      float a = 0.0f;
      for (int g = 0; g < 32; g += 16) {
        float v[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) v[j] = s.tile[(32 * seg + g + j) * kLdOf<S> + c];
        if (rht) {
          rht16(v);
#pragma unroll
          for (int j = 0; j < 16; ++j) s.tile[(32 * seg + g + j) * kLdOf<S> + c] = v[j];
        }
#pragma unroll
        for (int j = 0; j < 16; ++j) a = fmaxf(a, fabsf(v[j]));
      }
      s.seg_col[seg * kTile + c] = a;
    }
  }
}

// 2-D blocks of B x B (B = 32 or 128): amax from the column segments, one warp per block.
template <class S>
__device__ __forceinline__ void block2d_amax(TileSmem<S> s, int B) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nb = kTile / B;
  for (int b = warp; b < nb * nb; b += kWarps) {
    const int rb = b / nb, cb = b % nb;
    float a = 0.0f;
    for (int seg = rb * B / 32; seg < (rb + 1) * B / 32; ++seg)
      for (int c = cb * B + lane; c < (cb + 1) * B; c += 32) a = fmaxf(a, s.seg_col[seg * kTile + c]);
    a = warp_max(a, 32);
    if (lane == 0) s.blk2d[rb * 4 + cb] = a;
  }
}

template <class F>
__device__ __forceinline__ uint8_t quantize_one(float v, float mult, const PtQuantParams& p, int64_t index) {
  if constexpr (F::kFp4) {
    return p.sr ? F::encode_sr(v * mult, hash_uniform(p.seed, static_cast<uint64_t>(index))) : F::encode(v * mult);
  } else {
    return F::encode(v * mult);
  }
}

// Stage B + C for the row output.
template <class F, class S>
__device__ __forceinline__ void row_output(TileSmem<S> s, const PtQuantParams& p, int64_t m0, int64_t k0, bool first_k_tile) {
  const int64_t m = p.m, k = p.k;
  const bool ext = p.row_block == 0;
  const int B = p.row_block;
  const int nseg = ext ? 1 : (B >= 32 ? B / 32 : 1);
  for (int e = threadIdx.x; e < kTile * kSegs; e += kThreads) {
    const int r = e / kSegs, sg = e % kSegs;
    const int64_t gr = m0 + r, gc = k0 + 32 * sg;
    float amax;
    if (ext) {
      amax = p.amax_row_per_row ? (gr < m ? p.amax_row[gr] : 0.0f) : p.amax_row[0];
    } else if (p.block_2d) {
      amax = s.blk2d[(r / B) * 4 + (32 * sg) / B];
    } else {
      amax = 0.0f;
      const int s0 = sg / nseg * nseg;
      for (int j = s0; j < s0 + nseg; ++j) amax = fmaxf(amax, s.seg_row[r * kSegs + j]);
    }
    const Scale sc = make_scale<F>(amax, p.e8m0);
    s.row_mult[e] = sc.mult;
    if (gr >= m || gc >= k) continue;
    if (ext) {
      if (p.amax_row_per_row) {
        if (first_k_tile && sg == 0) store_scale_at(p.s_row, gr, sc, p.e8m0);
      } else if (gr == 0 && gc == 0) {
        store_scale_at(p.s_row, 0, sc, p.e8m0);
      }
    } else if ((32 * sg) % B == 0 && (!p.block_2d || r % B == 0)) {
      const int64_t blocks = (k + B - 1) / B, ld = p.s_row_ld_2d ? p.s_row_ld_2d : blocks;
      const int64_t row = p.block_2d ? gr / B : gr;
      const int64_t at = p.s_row_ld_mn ? (gc / B) * p.s_row_ld_mn + gr : row * ld + gc / B;
      store_scale_at(p.s_row, at, sc, p.e8m0);
      // Padded 2-D scales: the owner of a row's last block zeroes the padding after it.
      if (gc / B == blocks - 1) {
        for (int64_t j = blocks; j < ld; ++j) store_scale_at(p.s_row, row * ld + j, Scale{}, false);
      }
    }
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t gc = k0 + 4 * lane;
  if constexpr (!F::kFp4) {
    // Interior tile (nearly all of them): no bounds, the output pointer strided instead of
    // recomputed from 64-bit products, four codes per lane and row.
    if (m0 + kTile <= m && k0 + kTile <= k && k % 4 == 0) {
      uint8_t* out = static_cast<uint8_t*>(p.q_row) + (m0 + warp) * k + gc;
      const int64_t step = kWarps * k;
#pragma unroll 4
      for (int r = warp; r < kTile; r += kWarps, out += step) {
        const float4 v = read4(s.tile + r * kLdOf<S> + 4 * lane);
        *reinterpret_cast<uint32_t*>(out) = encode4<F>(v.x, v.y, v.z, v.w, s.row_mult[r * kSegs + lane / 8]);
      }
      return;
    }
  }
  for (int r = warp; r < kTile; r += kWarps) {
    const int64_t gr = m0 + r;
    if (gr >= m) break;
    if (gc >= k) continue;
    const float4 v = read4(s.tile + r * kLdOf<S> + 4 * lane);
    const float mult = s.row_mult[r * kSegs + lane / 8];
    const bool full = gc + 4 <= k;
    if constexpr (!F::kFp4) {
      const uint32_t w = encode4<F>(v.x, v.y, v.z, v.w, mult);
      uint8_t* out = static_cast<uint8_t*>(p.q_row) + gr * k + gc;
      if (full && k % 4 == 0) {
        *reinterpret_cast<uint32_t*>(out) = w;
      } else {
        for (int j = 0; j < 4 && gc + j < k; ++j) out[j] = static_cast<uint8_t>(w >> (8 * j));
      }
    } else {
      const int64_t idx = gr * k + gc;
      uint8_t q[4] = {quantize_one<F>(v.x, mult, p, idx), quantize_one<F>(v.y, mult, p, idx + 1),
                      quantize_one<F>(v.z, mult, p, idx + 2), quantize_one<F>(v.w, mult, p, idx + 3)};
      uint8_t* out = static_cast<uint8_t*>(p.q_row) + gr * (k / 2) + gc / 2;
      const uint8_t b0 = q[0] | (q[1] << 4), b1 = q[2] | (q[3] << 4);
      if (full && k % 4 == 0) {
        *reinterpret_cast<uint16_t*>(out) = static_cast<uint16_t>(b0 | (b1 << 8));
      } else {
        out[0] = b0;  // k is even, so a valid first pair is whole
        if (gc + 2 < k) out[1] = b1;
      }
    }
  }
}

// Stage B + C for the column output: thread per column, 32-row segments.
template <class F, class S>
__device__ __forceinline__ void col_output(TileSmem<S> s, const PtQuantParams& p, int64_t m0, int64_t k0, bool first_m_tile) {
  const int64_t m = p.m, k = p.k;
  const int c = threadIdx.x % kTile, half = threadIdx.x / kTile;
  const int64_t gc = k0 + c;
  const bool ext = p.col_block == 0;
  const int B = p.block_2d ? p.row_block : p.col_block;
  for (int seg = 2 * half; seg < 2 * half + 2; ++seg) {
    const int64_t gr0 = m0 + 32 * seg;
    float amax;
    if (ext) {
      amax = p.amax_col_per_col ? (gc < k ? p.amax_col[gc] : 0.0f) : p.amax_col[0];
    } else if (p.block_2d) {
      amax = s.blk2d[(32 * seg / B) * 4 + c / B];
    } else {
      amax = 0.0f;
      const int s0 = seg / (B / 32) * (B / 32);
      for (int j = s0; j < s0 + B / 32; ++j) amax = fmaxf(amax, s.seg_col[j * kTile + c]);
    }
    const Scale sc = make_scale<F>(amax, p.e8m0);
    if (gc >= k || gr0 >= m) continue;
    if (ext) {
      if (p.amax_col_per_col) {
        if (first_m_tile && seg == 0) store_scale_at(p.s_col, gc, sc, p.e8m0);
      } else if (gc == 0 && gr0 == 0) {
        store_scale_at(p.s_col, 0, sc, p.e8m0);
      }
    } else if ((32 * seg) % B == 0 && (!p.block_2d || c % B == 0)) {
      const int64_t ldm = (m + B - 1) / B;
      if (p.s_col_ld_mn) {
        store_scale_at(p.s_col, (gr0 / B) * p.s_col_ld_mn + gc, sc, p.e8m0);
      } else if (p.col_transposed) {
        const int64_t ld = p.s_col_ld_2d ? p.s_col_ld_2d : ldm, row = p.block_2d ? gc / B : gc;
        store_scale_at(p.s_col, row * ld + gr0 / B, sc, p.e8m0);
        if (gr0 / B == ldm - 1) {
          for (int64_t j = ldm; j < ld; ++j) store_scale_at(p.s_col, row * ld + j, Scale{}, false);
        }
      } else {
        store_scale_at(p.s_col, (gr0 / B) * k + gc, sc, p.e8m0);
      }
    }
    const bool full = gr0 + 32 <= m;
    uint8_t* base = static_cast<uint8_t*>(p.q_col);
    if constexpr (!F::kFp4) {
      // The segment's 32 codes packed straight into eight words (a byte array would live in
      // local memory), converted two at a time.
      const S* col = s.tile + 32 * seg * kLdOf<S> + c;
      uint32_t w[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        w[j] = encode4<F>(to_float(col[(4 * j) * kLdOf<S>]), to_float(col[(4 * j + 1) * kLdOf<S>]),
                          to_float(col[(4 * j + 2) * kLdOf<S>]), to_float(col[(4 * j + 3) * kLdOf<S>]), sc.mult);
      }
      if (p.col_transposed) {
        uint8_t* out = base + gc * m + gr0;
        if (full && m % 16 == 0) {
          reinterpret_cast<uint4*>(out)[0] = make_uint4(w[0], w[1], w[2], w[3]);
          reinterpret_cast<uint4*>(out)[1] = make_uint4(w[4], w[5], w[6], w[7]);
        } else {
#pragma unroll
          for (int j = 0; j < 32; ++j)
            if (gr0 + j < m) out[j] = static_cast<uint8_t>(w[j / 4] >> (8 * (j % 4)));
        }
      } else {
#pragma unroll
        for (int j = 0; j < 32; ++j)
          if (gr0 + j < m) base[(gr0 + j) * k + gc] = static_cast<uint8_t>(w[j / 4] >> (8 * (j % 4)));
      }
    } else {
      // FP4 (transposed only, [k, m/2]): the 32 values of this segment, two per byte.
      alignas(16) uint8_t q[32];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        q[j] = quantize_one<F>(to_float(s.tile[(32 * seg + j) * kLdOf<S> + c]), sc.mult, p, (gr0 + j) * k + gc);
      }
      alignas(16) uint8_t b[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) b[j] = q[2 * j] | (q[2 * j + 1] << 4);
      uint8_t* out = base + gc * (m / 2) + gr0 / 2;
      if (full && (m / 2) % 16 == 0) {
        *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(b);
      } else {
        for (int j = 0; j < 16 && gr0 + 2 * j < m; ++j) out[j] = b[j];
      }
    }
  }
}

// One tile of a quantization (stages A-C) into the CTA's shared memory s; the caller separates
// consecutive tiles of one CTA with a barrier.
template <class T, class F, class S>
__device__ __forceinline__ void quantize_tile(TileSmem<S> s, const PtQuantParams& p, int64_t m_tile, int64_t k_tile) {
  const int64_t m0 = m_tile * kTile, k0 = k_tile * kTile;
  load_tile(static_cast<const T*>(p.x), p.m, p.k, m0, k0, s.tile);
  __syncthreads();
  const bool row = p.q_row != nullptr, col = p.q_col != nullptr;
  if (row && p.row_block != 0 && !p.block_2d) row_segment_amax(s, p.rht);
  if ((col && p.col_block != 0) || p.block_2d) col_segment_amax(s, p.rht && !row);
  __syncthreads();
  if (p.block_2d) {
    block2d_amax(s, p.row_block);
    __syncthreads();
  }
  if (row) row_output<F, S>(s, p, m0, k0, k_tile == 0);
  if (col) col_output<F, S>(s, p, m0, k0, m_tile == 0);
}

template <class T, class F, class S>
__global__ void __launch_bounds__(kThreads, sizeof(S) == 2 ? 5 : 3) quantize_tile_kernel(const PtQuantParams p) {
  extern __shared__ __align__(16) float smem[];
  quantize_tile<T, F, S>(carve<S>(smem), p, blockIdx.x, blockIdx.y);
}

// One tile's absolute maxima into atomically updated buffers (non-negative floats order like their
// bits; null: not wanted): the whole tensor, per row, per column. The caller separates consecutive
// tiles of one CTA with a barrier.
template <class T>
__device__ __forceinline__ void amax_tile(TileSmem<T> s, const T* x, int64_t m, int64_t k, int64_t m_tile,
                                          int64_t k_tile, float* amax_tensor, float* amax_rows, float* amax_cols) {
  const int64_t m0 = m_tile * kTile, k0 = k_tile * kTile;
  load_tile(x, m, k, m0, k0, s.tile);
  __syncthreads();
  row_segment_amax(s, false);
  if (amax_cols) col_segment_amax(s, false);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (amax_rows || amax_tensor) {
    float t = 0.0f;
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      float a = 0.0f;
      for (int j = 0; j < kSegs; ++j) a = fmaxf(a, s.seg_row[r * kSegs + j]);
      if (amax_rows && m0 + r < m) atomicMax(reinterpret_cast<int*>(amax_rows + m0 + r), __float_as_int(a));
      t = fmaxf(t, a);
    }
    if (amax_tensor) {
      t = warp_max(t, 32);
      if (lane == 0) s.blk2d[warp] = t;
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < kWarps; ++w) t = fmaxf(t, s.blk2d[w]);
        atomicMax(reinterpret_cast<int*>(amax_tensor), __float_as_int(t));
      }
    }
  }
  if (amax_cols && threadIdx.x < kTile && k0 + threadIdx.x < k) {
    float a = 0.0f;
    for (int j = 0; j < kSegs; ++j) a = fmaxf(a, s.seg_col[j * kTile + threadIdx.x]);
    atomicMax(reinterpret_cast<int*>(amax_cols + k0 + threadIdx.x), __float_as_int(a));
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) amax_tile_kernel(const PtQuantAmaxParams p) {
  extern __shared__ __align__(16) float smem[];
  amax_tile<T>(carve<T>(smem), static_cast<const T*>(p.x), p.m, p.k, blockIdx.x, blockIdx.y, p.amax_tensor,
               p.amax_rows, p.amax_cols);
}

}  // namespace primus_turbo::kernels::quant
