// Quantization along the last dim of a contiguous [m, k] tensor when only that output is wanted
// (1-D blocks, or a scale from a device amax): no shared memory and no barriers, so occupancy is
// high and the loop keeps two 16-byte loads per lane in flight. A warp takes 256 consecutive
// elements of a row (8 per lane); a scale group of 32 / 64 / 128 elements is 4 / 8 / 16 lanes,
// reduced with shuffles.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "primus_turbo/kernels/quantization/quant_abi.h"
#include "primus_turbo/kernels/quantization/quant_formats.cuh"
#include "primus_turbo/kernels/quantization/quantize_tile_regs.cuh"

namespace primus_turbo::kernels::quant {

constexpr int kRowThreads = 256;
constexpr int kRowElems = 8;                   // per lane
constexpr int kRowChunk = 32 * kRowElems;      // elements of a row per warp step
constexpr int kRowUnroll = 2;                  // chunks per warp in flight

template <class T>
__device__ __forceinline__ void load8(const T* __restrict__ x, int64_t m, int64_t k, int64_t r, int64_t c, bool vec,
                                      float (&v)[kRowElems]) {
  if (r < m && vec && c < k) {
    const T* p = x + r * k + c;
    if constexpr (sizeof(T) == 2) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < kRowElems; ++j) v[j] = to_float(e[j]);
    } else {
      const float4 a = __ldg(reinterpret_cast<const float4*>(p));
      const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kRowElems; ++j) v[j] = (r < m && c + j < k) ? to_float(x[r * k + c + j]) : 0.0f;
  }
}

// 16-point random Hadamard transform with 8 values per lane: lanes 2g and 2g+1 hold one group.
__device__ __forceinline__ void rht16_pair(float (&v)[kRowElems], int lane) {
  const int base = (lane & 1) * 8;
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] *= rht_sign(base + j);
#pragma unroll
  for (int h = 1; h < 8; h <<= 1) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if ((j & h) == 0) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float p = __shfl_xor_sync(0xffffffffu, v[j], 1);
    v[j] = ((lane & 1) ? p - v[j] : v[j] + p) * 0.25f;
  }
}

// (row, first column) of chunk `chunk` of a row-major walk with `per_row` chunks a row; 32-bit
// division when both fit (a 64-bit one costs dozens of instructions, per chunk and lane).
__device__ __forceinline__ void chunk_position(int64_t chunk, int64_t per_row, int64_t& row, int64_t& col) {
  if ((static_cast<uint64_t>(chunk) | static_cast<uint64_t>(per_row)) >> 32 == 0) {
    const uint32_t r = static_cast<uint32_t>(chunk) / static_cast<uint32_t>(per_row);
    row = r;
    col = (static_cast<uint32_t>(chunk) - r * static_cast<uint32_t>(per_row)) * static_cast<int64_t>(kRowChunk);
  } else {
    row = chunk / per_row;
    col = (chunk % per_row) * kRowChunk;
  }
}

template <class T, class F>
__global__ void __launch_bounds__(kRowThreads) quantize_rows_kernel(const PtQuantParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t m = p.m, k = p.k;
  const int64_t chunks_per_row = (k + kRowChunk - 1) / kRowChunk;
  const int64_t total = m * chunks_per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / 32);
  const bool vec = k % kRowElems == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  const bool ext = p.row_block == 0;
  const int group_lanes = ext ? 32 : p.row_block / kRowElems;
  const int64_t ld_s = ext ? 0 : (k + p.row_block - 1) / p.row_block;
  const T* x = static_cast<const T*>(p.x);
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * (kRowThreads / 32) + threadIdx.x / 32; base < total;
       base += warps * kRowUnroll) {
    float v[kRowUnroll][kRowElems];
    int64_t row[kRowUnroll], col[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t chunk = base + u * warps;
      row[u] = m;  // m, k: nothing to do
      col[u] = k;
      if (chunk < total) {
        chunk_position(chunk, chunks_per_row, row[u], col[u]);
        col[u] += lane * kRowElems;
      }
      load8(x, m, k, row[u], col[u], vec, v[u]);
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t r = row[u], c = col[u];
      if (p.rht) rht16_pair(v[u], lane);
      float amax;
      if (ext) {
        amax = p.amax_row_per_row ? (r < m ? p.amax_row[r] : 0.0f) : p.amax_row[0];
      } else {
        amax = 0.0f;
#pragma unroll
        for (int j = 0; j < kRowElems; ++j) amax = fmaxf(amax, fabsf(v[u][j]));
        for (int o = 1; o < group_lanes; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      }
      if (r >= m || c >= k) continue;
      const Scale sc = make_scale<F>(amax, p.e8m0);
      if (ext) {
        if (c == 0 && (p.amax_row_per_row || r == 0)) store_scale_at(p.s_row, p.amax_row_per_row ? r : 0, sc, p.e8m0);
      } else if (lane % group_lanes == 0) {
        const int64_t at = p.s_row_ld_mn ? (c / p.row_block) * p.s_row_ld_mn + r : r * ld_s + c / p.row_block;
        store_scale_at(p.s_row, at, sc, p.e8m0);
      }
      const bool full = c + kRowElems <= k;
      if constexpr (!F::kFp4) {
        const float* e = v[u];
        uint2 w;
        w.x = encode4<F>(e[0], e[1], e[2], e[3], sc.mult);
        w.y = encode4<F>(e[4], e[5], e[6], e[7], sc.mult);
        uint8_t* out = static_cast<uint8_t*>(p.q_row) + r * k + c;
        if (full && k % kRowElems == 0) {
          *reinterpret_cast<uint2*>(out) = w;
        } else {
          for (int j = 0; j < kRowElems && c + j < k; ++j) out[j] = static_cast<uint8_t>((j < 4 ? w.x : w.y) >> (8 * (j % 4)));
        }
      } else {
        uint8_t q[kRowElems];
#pragma unroll
        for (int j = 0; j < kRowElems; ++j) {
          q[j] = p.sr ? F::encode_sr(v[u][j] * sc.mult, hash_uniform(p.seed, static_cast<uint64_t>(r * k + c + j)))
                      : F::encode(v[u][j] * sc.mult);
        }
        uint8_t* out = static_cast<uint8_t*>(p.q_row) + r * (k / 2) + c / 2;
        uint32_t packed = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) packed |= static_cast<uint32_t>(q[2 * j] | (q[2 * j + 1] << 4)) << (8 * j);
        if (full && k % kRowElems == 0) {
          *reinterpret_cast<uint32_t*>(out) = packed;
        } else {
          for (int j = 0; j < 4 && c + 2 * j < k; ++j) out[j] = static_cast<uint8_t>(packed >> (8 * j));
        }
      }
    }
  }
}

// Rowwise quantization in one kernel (row output only): a block per row (rows grid-strided)
// reduces the row's amax, then reads the row again, now from L2, to encode it. Same arithmetic
// as the amax pass + quantize_rows_kernel pair, so the result is bit-identical to it.
template <class T, class F>
__global__ void __launch_bounds__(kRowThreads) quantize_rowwise_kernel(const PtQuantParams p) {
  __shared__ float warp_amax[kRowThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t m = p.m, k = p.k;
  const bool vec = k % kRowElems == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  const T* x = static_cast<const T*>(p.x);
  constexpr int64_t kStep = static_cast<int64_t>(kRowThreads) * kRowElems;
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    float amax = 0.0f;
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * kRowElems; c < k; c += kStep) {
      float v[kRowElems];
      load8(x, m, k, r, c, vec, v);
#pragma unroll
      for (int j = 0; j < kRowElems; ++j) amax = fmaxf(amax, fabsf(v[j]));
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0) warp_amax[warp] = amax;
    __syncthreads();
    amax = warp_amax[0];
#pragma unroll
    for (int w = 1; w < kRowThreads / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
    __syncthreads();  // warp_amax is reused by the next row
    const Scale sc = make_scale<F>(amax, false);
    if (threadIdx.x == 0) store_scale_at(p.s_row, r, sc, false);
    uint8_t* out_row = static_cast<uint8_t*>(p.q_row) + r * k;
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * kRowElems; c < k; c += kStep) {
      float v[kRowElems];
      load8(x, m, k, r, c, vec, v);
      uint2 w;
      w.x = encode4<F>(v[0], v[1], v[2], v[3], sc.mult);
      w.y = encode4<F>(v[4], v[5], v[6], v[7], sc.mult);
      if (vec) {
        *reinterpret_cast<uint2*>(out_row + c) = w;
      } else {
        for (int j = 0; j < kRowElems && c + j < k; ++j) out_row[c + j] = static_cast<uint8_t>((j < 4 ? w.x : w.y) >> (8 * (j % 4)));
      }
    }
  }
}

// Rowwise in one read (16-bit input, row output only): each row is held in registers by W warps of
// a CTA (V 16-byte vectors a lane, so K <= W * 32 * V * 8), its amax reduced from them (shuffles,
// then one shared-memory exchange between the W warps), and its codes made from the same registers.
// Same arithmetic as quantize_rowwise_kernel, so bit-identical to it; that kernel, which reads each
// row a second time from L2, stays for fp32 input and longer rows.
constexpr int kRowwiseRegsWarps = kRowThreads / 32;

template <class T, class F, int V>
__global__ void __launch_bounds__(kRowThreads) quantize_rowwise_regs_kernel(const PtQuantParams p, int warps_per_row) {
  __shared__ float part[2][kRowwiseRegsWarps];  // per warp, by iteration parity (one barrier a row)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int W = warps_per_row, rows_per_cta = kRowwiseRegsWarps / W, row_in = warp / W, seg = warp % W;
  const int64_t m = p.m, k = p.k;
  const int64_t groups = (m + rows_per_cta - 1) / rows_per_cta;
  const T* x = static_cast<const T*>(p.x);
  int parity = 0;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x, parity ^= 1) {
    const int64_t r = g * rows_per_cta + row_in;
    uint4 d[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {  // vector v of the row part: the W warps' 512-byte runs interleave
      const int64_t c = (static_cast<int64_t>(v * W + seg) * 32 + lane) * 8;
      d[v] = (r < m && c < k) ? __ldg(reinterpret_cast<const uint4*>(x + r * k + c)) : make_uint4(0, 0, 0, 0);
    }
    float amax = 0.0f;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float2 a = tile_regs::Pair<T>::to_float2(tile_regs::abs_max8<T>(d[v]));
      amax = fmaxf(amax, fmaxf(a.x, a.y));
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0) part[parity][warp] = amax;
    __syncthreads();
    amax = part[parity][row_in * W];
    for (int w = 1; w < W; ++w) amax = fmaxf(amax, part[parity][row_in * W + w]);
    if (r >= m) continue;
    const Scale sc = make_scale<F>(amax, false);
    if (seg == 0 && lane == 0) store_scale_at(p.s_row, r, sc, false);
    uint8_t* out = static_cast<uint8_t*>(p.q_row) + r * k;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = (static_cast<int64_t>(v * W + seg) * 32 + lane) * 8;
      if (c >= k) break;
      *reinterpret_cast<uint2*>(out + c) = tile_regs::encode8<T, F>(d[v], [&](int) { return sc.mult; });
    }
  }
}

// Launches quantize_rowwise_regs_kernel where it applies (16-bit input with 16-byte aligned rows of
// at most 32768 elements, 8-byte aligned output); false: the caller uses quantize_rowwise_kernel.
template <class T, class F>
bool launch_rowwise_regs(const PtQuantParams& p, cudaStream_t stream) {
  if (sizeof(T) != 2 || p.k % 8 != 0 || p.k > 32768 || reinterpret_cast<uintptr_t>(p.x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.q_row) % 8 != 0)
    return false;
  const int v = p.k <= 16384 ? 8 : 16;
  int w = 1;
  while (int64_t{w} * 32 * v * 8 < p.k) w *= 2;  // a power of two, so rows tile the CTA's 8 warps
  const int64_t groups = (p.m + kRowwiseRegsWarps / w - 1) / (kRowwiseRegsWarps / w);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(groups, int64_t{p.num_sms} * 8));
  if (v == 8) {
    quantize_rowwise_regs_kernel<T, F, 8><<<grid, kRowThreads, 0, stream>>>(p, w);
  } else {
    quantize_rowwise_regs_kernel<T, F, 16><<<grid, kRowThreads, 0, stream>>>(p, w);
  }
  return true;
}

// amax of the whole tensor and/or of each row, same walk as above; one atomic per warp chunk.
template <class T>
__global__ void __launch_bounds__(kRowThreads) amax_rows_kernel(const PtQuantAmaxParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t m = p.m, k = p.k;
  const int64_t chunks_per_row = (k + kRowChunk - 1) / kRowChunk;
  const int64_t total = m * chunks_per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / 32);
  const bool vec = k % kRowElems == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  const T* x = static_cast<const T*>(p.x);
  float tensor_amax = 0.0f;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * (kRowThreads / 32) + threadIdx.x / 32; base < total;
       base += warps * kRowUnroll) {
    float v[kRowUnroll][kRowElems];
    int64_t row[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t chunk = base + u * warps;
      int64_t c = k;
      row[u] = m;
      if (chunk < total) {
        chunk_position(chunk, chunks_per_row, row[u], c);
        c += lane * kRowElems;
      }
      load8(x, m, k, row[u], c, vec, v[u]);
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      float a = 0.0f;
#pragma unroll
      for (int j = 0; j < kRowElems; ++j) a = fmaxf(a, fabsf(v[u][j]));
      tensor_amax = fmaxf(tensor_amax, a);
      if (p.amax_rows) {
        for (int o = 1; o < 32; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        if (lane == 0 && row[u] < m) atomicMax(reinterpret_cast<int*>(p.amax_rows + row[u]), __float_as_int(a));
      }
    }
  }
  if (p.amax_tensor) {
    for (int o = 1; o < 32; o <<= 1) tensor_amax = fmaxf(tensor_amax, __shfl_xor_sync(0xffffffffu, tensor_amax, o));
    __shared__ float warp_amax[kRowThreads / 32];
    if (lane == 0) warp_amax[threadIdx.x / 32] = tensor_amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = 0.0f;
      for (int w = 0; w < kRowThreads / 32; ++w) t = fmaxf(t, warp_amax[w]);
      atomicMax(reinterpret_cast<int*>(p.amax_tensor), __float_as_int(t));
    }
  }
}

}  // namespace primus_turbo::kernels::quant
