// FP8 quantization of a 16-bit [m, k] tensor by 128 x 128 tiles held in registers: the common
// training case (1 x 128 / 128 x 1 blocks, 128 x 128 weight blocks, or scales from an amax reduced
// beforehand), with a row output and/or a transposed column output.
//
// quantize_tile.cuh stages the tile in shared memory and walks it once per stage; a profile showed
// it bound by instruction issue (about 18 K warp instructions a tile). Here each thread loads an
// 8 x 8 block of the tile (eight 16-byte loads, all in flight at once) and keeps it:
//   - row and column maxima come from the registers (paired 16-bit max, then a few shuffles),
//   - one thread per row and one per column turns its amax into a scale (one division each),
//   - the codes of both outputs are made from the same registers; the column codes pass through
//     a small swizzled staging buffer so the transposed output is written in full 128-byte lines.
// Same arithmetic as quantize_tile.cuh (amax on the 16-bit values, x * (max / amax) rounded by the
// hardware conversion), so the outputs are bit-identical; tile_regs_supported says which requests
// this kernel takes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "primus_turbo/kernels/common/dependent_launch.cuh"
#include "primus_turbo/kernels/quantization/quant_abi.h"
#include "primus_turbo/kernels/quantization/quant_formats.cuh"

namespace primus_turbo::kernels::quant {

constexpr int kRegsTile = 128;
constexpr int kRegsThreads = 256;

namespace tile_regs {

constexpr int kSide = 8;  // a thread's block is kSide x kSide elements

template <class T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using T = __nv_bfloat162;
  __device__ static float2 to_float2(uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  }
};
template <>
struct Pair<__half> {
  using T = __half2;
  __device__ static float2 to_float2(uint32_t u) { return __half22float2(*reinterpret_cast<const __half2*>(&u)); }
};

template <class T>
__device__ __forceinline__ uint32_t abs_max2(uint32_t a, uint32_t b) {
  using P = typename Pair<T>::T;
  const P r = __hmax2(__habs2(*reinterpret_cast<const P*>(&a)), __habs2(*reinterpret_cast<const P*>(&b)));
  return *reinterpret_cast<const uint32_t*>(&r);
}
template <class T>
__device__ __forceinline__ uint32_t max2(uint32_t a, uint32_t b) {
  using P = typename Pair<T>::T;
  const P r = __hmax2(*reinterpret_cast<const P*>(&a), *reinterpret_cast<const P*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
// |max| of 8 packed 16-bit values, as a pair (the max of the even and of the odd positions).
template <class T>
__device__ __forceinline__ uint32_t abs_max8(const uint4& v) {
  return max2<T>(abs_max2<T>(v.x, v.y), abs_max2<T>(v.z, v.w));
}

// 8 packed 16-bit values as FP8 codes in one 8-byte word, value j scaled by mult(j).
template <class T, class F, class Mult>
__device__ __forceinline__ uint2 encode8(const uint4& v, Mult mult) {
  const float2 a = Pair<T>::to_float2(v.x), b = Pair<T>::to_float2(v.y), c = Pair<T>::to_float2(v.z),
               e = Pair<T>::to_float2(v.w);
  const uint32_t lo = F::encode2(a.x * mult(0), a.y * mult(1)) |
                      (uint32_t{F::encode2(b.x * mult(2), b.y * mult(3))} << 16);
  const uint32_t hi = F::encode2(c.x * mult(4), c.y * mult(5)) |
                      (uint32_t{F::encode2(e.x * mult(6), e.y * mult(7))} << 16);
  return make_uint2(lo, hi);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

struct Smem {
  float row_amax[kRegsTile];
  float row_mult[kRegsTile];
  float col_mult[kRegsTile];
  uint32_t col_part[kRegsThreads / 32][kRegsTile / 2];  // per warp: column maxima of its 16 rows, in pairs
  alignas(16) uint8_t staged[kRegsTile * kRegsTile];    // column codes, [column][row], swizzled
};

// Byte offset in `staged` of the 8-byte run (column c, rows 8 * tr .. 8 * tr + 7): the run's slot
// is XORed with c / 8 so that a warp's stores fall in distinct banks.
__device__ __forceinline__ int staged_at(int c, int tr) { return c * kRegsTile + 8 * (tr ^ (c >> 3)); }

// The thread's 8 x 8 block at (r0, c0) as eight 16-byte loads, all in flight at once; rows or
// columns past the tensor read as zero (they never raise an amax).
template <class T>
__device__ __forceinline__ void load_block(const T* __restrict__ x, int64_t m, int64_t k, int64_t r0, int64_t c0,
                                           uint4 (&d)[kSide]) {
#pragma unroll
  for (int i = 0; i < kSide; ++i) {
    const int64_t r = r0 + i;
    d[i] = (r < m && c0 < k) ? __ldg(reinterpret_cast<const uint4*>(x + r * k + c0)) : make_uint4(0, 0, 0, 0);
  }
}

// |max| of each of the block's 8 rows over the tile's 128 columns: the 16 threads of a row group
// (lanes 16 apart hold other rows) reduce together, two rows a word. Lane tc == 0 writes out[0..7].
template <class T>
__device__ __forceinline__ void row_maxima(const uint4 (&d)[kSide], int tc, float* out) {
#pragma unroll
  for (int i = 0; i < kSide; i += 2) {
    const uint32_t a = abs_max8<T>(d[i]), b = abs_max8<T>(d[i + 1]);
    // (a.lo, b.lo) max (a.hi, b.hi): the low half is row i's max, the high half row i + 1's.
    uint32_t w = max2<T>(__byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632));
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) w = max2<T>(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (tc == 0) {
      const float2 f = Pair<T>::to_float2(w);
      out[i] = f.x;
      out[i + 1] = f.y;
    }
  }
}

// |max| of the block's 8 columns over the warp's 16 rows, as 4 words of column pairs; lanes < 16
// write them to out[0..3] (the warp's share of Smem::col_part).
template <class T>
__device__ __forceinline__ void column_maxima(const uint4 (&d)[kSide], int lane, uint32_t* out) {
  uint32_t c[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a = abs_max2<T>(word(d[0], j), word(d[1], j));
#pragma unroll
    for (int i = 2; i < kSide; i += 2) a = max2<T>(a, abs_max2<T>(word(d[i], j), word(d[i + 1], j)));
    c[j] = max2<T>(a, __shfl_xor_sync(0xffffffffu, a, 16));
  }
  if (lane < 16) *reinterpret_cast<uint4*>(out) = make_uint4(c[0], c[1], c[2], c[3]);
}

// Column t's |max| over the tile's 128 rows, from the warps' partial maxima.
template <class T>
__device__ __forceinline__ float column_amax(const uint32_t (&part)[kRegsThreads / 32][kRegsTile / 2], int t) {
  uint32_t a = part[0][t / 2];
#pragma unroll
  for (int w = 1; w < kRegsThreads / 32; ++w) a = max2<T>(a, part[w][t / 2]);
  const float2 f = Pair<T>::to_float2(a);
  return (t & 1) ? f.y : f.x;
}

// The block's rows (the first `rows` of them, those inside the tensor) as codes, 8 a row in one
// 8-byte store at out, out + k, ...: value j of row i scaled by mult(i, j).
template <class T, class F, class Mult>
__device__ __forceinline__ void store_row_codes(const uint4 (&d)[kSide], uint8_t* out, int64_t k, int64_t rows,
                                                Mult mult) {
#pragma unroll
  for (int i = 0; i < kSide; ++i, out += k) {
    if (i >= rows) break;
    *reinterpret_cast<uint2*>(out) = encode8<T, F>(d[i], [&](int j) { return mult(i, j); });
  }
}

}  // namespace tile_regs

// Requests this kernel takes (the rest go to quantize_tile.cuh): 16-bit input in 16-byte aligned
// rows (k % 8), FP8 with fp32 scales, no transform; the row output with 128-element blocks or a
// given amax; the column output in place or transposed (then m % 16) with 128-row blocks, the row
// output's 2-D blocks, or a given amax.
__host__ __device__ __forceinline__ bool tile_regs_supported(const PtQuantParams& p, int elem_bytes, bool fp4) {
  if (elem_bytes != 2 || fp4 || p.rht || p.sr || p.e8m0 || p.k % 8 != 0 ||
      reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || reinterpret_cast<uintptr_t>(p.q_row) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(p.q_col) % 16 != 0)
    return false;
  if (p.block_2d && p.row_block != 128) return false;
  if (p.q_row && !(p.row_block == 0 || p.row_block == 128)) return false;
  if (p.q_col && !((!p.col_transposed || p.m % 16 == 0) && (p.block_2d || p.col_block == 0 || p.col_block == 128)))
    return false;
  if (p.col_rows && !(p.q_col && p.col_transposed && p.col_rows % 128 == 0 && p.m % p.col_rows == 0 &&
                      !p.s_col_ld_mn && !p.s_col_ld_2d))
    return false;
  return p.q_row || p.q_col;
}

// The register-tile kernels' grid over [m, k]: k tiles along x (fastest), m tiles along y; false
// where it does not fit (more than 65535 row tiles).
inline bool regs_grid(int64_t m, int64_t k, dim3& grid) {
  const int64_t mt = (m + kRegsTile - 1) / kRegsTile, kt = (k + kRegsTile - 1) / kRegsTile;
  if (kt > INT32_MAX || mt > 65535) return false;
  grid = dim3(unsigned(kt), unsigned(mt));
  return true;
}

// The grid walks k fastest (blockIdx.x): CTAs that run together cover a band of rows, so a
// row-major [m, blocks] scale matrix is completed in L2 before it is written back (measured faster
// for every layout, the transposed column output's included). It walks the tiles last to first:
// where an amax pass over x ran just before (tensorwise, and the column maxima of a transposed
// rowwise copy), that pass walked first to last in the same orientation, so the tiles it read last
// are still in L2 when this one starts (up to about the L2's size of x read once instead of twice).
template <class T, class F>
__global__ void __launch_bounds__(kRegsThreads, 3) quantize_tile_regs_kernel(const PtQuantParams p) {
  using namespace tile_regs;
  __shared__ Smem s;
  const int64_t m = p.m, k = p.k;
  const int64_t m_tile = gridDim.y - 1 - blockIdx.y, k_tile = gridDim.x - 1 - blockIdx.x;
  const int64_t m0 = m_tile * kRegsTile, k0 = k_tile * kRegsTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tc = lane % 16, tr = 2 * warp + lane / 16;  // the thread's block: rows 8 tr.., columns 8 tc..
  const int64_t gc = k0 + kSide * tc;
  const bool row = p.q_row != nullptr, col = p.q_col != nullptr;
  const bool row_blocks = row && p.row_block != 0 && !p.block_2d;
  const bool col_blocks = col && p.col_block != 0 && !p.block_2d;
  // The tile's matrix (a stack with col_rows: each matrix has its own column output and maxima)
  // and its rows.
  const int64_t ld = p.col_rows ? p.col_rows : m, mat = m0 / ld;

  uint4 d[kSide];
  load_block(static_cast<const T*>(p.x), m, k, m0 + kSide * tr, gc, d);
  // Launched as the amax pass's dependent, the tile's loads overlap that pass's last wave; its
  // maxima are read (and every output written) only after it completed.
  grid_dependency_wait();
  if (row_blocks || p.block_2d) row_maxima<T>(d, tc, s.row_amax + kSide * tr);
  if (col_blocks) column_maxima<T>(d, lane, s.col_part[warp] + 4 * tc);
  __syncthreads();

  // One thread per row (threads 0..127) and per column (128..255) makes the scale.
  float tile_amax = 0.0f;
  if (p.block_2d) {  // every warp reduces the tile's row maxima itself (no extra barrier)
    const float4 a = *reinterpret_cast<const float4*>(&s.row_amax[4 * lane]);
    tile_amax = fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w));
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) tile_amax = fmaxf(tile_amax, __shfl_xor_sync(0xffffffffu, tile_amax, o));
  }
  const int t = threadIdx.x % kRegsTile;
  if (threadIdx.x < kRegsTile && row) {
    const int64_t gr = m0 + t;
    float amax;
    if (p.row_block == 0) {
      amax = p.amax_row_per_row ? (gr < m ? p.amax_row[gr] : 0.0f) : p.amax_row[0];
    } else {
      amax = p.block_2d ? tile_amax : s.row_amax[t];
    }
    const Scale sc = make_scale<F>(amax, false);
    s.row_mult[t] = sc.mult;
    if (gr < m) {
      if (p.row_block == 0) {
        if (p.amax_row_per_row) {
          if (k_tile == 0) store_scale_at(p.s_row, gr, sc, false);
        } else if (gr == 0 && k0 == 0) {
          store_scale_at(p.s_row, 0, sc, false);
        }
      } else if (!p.block_2d || t == 0) {
        const int64_t blocks = (k + kRegsTile - 1) / kRegsTile, ld = p.s_row_ld_2d ? p.s_row_ld_2d : blocks;
        const int64_t r = p.block_2d ? m_tile : gr;
        store_scale_at(p.s_row, p.s_row_ld_mn ? k_tile * p.s_row_ld_mn + gr : r * ld + k_tile, sc, false);
        if (k_tile == blocks - 1) {
          for (int64_t j = blocks; j < ld; ++j) store_scale_at(p.s_row, r * ld + j, Scale{}, false);
        }
      }
    }
  } else if (threadIdx.x >= kRegsTile && col) {
    const int64_t gcol = k0 + t;
    float amax;
    if (p.block_2d) {
      amax = tile_amax;
    } else if (p.col_block == 0) {
      amax = p.amax_col_per_col ? (gcol < k ? p.amax_col[mat * k + gcol] : 0.0f) : p.amax_col[0];
    } else {
      amax = column_amax<T>(s.col_part, t);
    }
    const Scale sc = make_scale<F>(amax, false);
    s.col_mult[t] = sc.mult;
    if (gcol < k) {
      if (!p.block_2d && p.col_block == 0) {
        if (p.amax_col_per_col) {
          if (m0 == mat * ld) store_scale_at(p.s_col, mat * k + gcol, sc, false);  // the matrix's first tile
        } else if (gcol == 0 && m0 == 0) {
          store_scale_at(p.s_col, 0, sc, false);
        }
      } else if (!p.block_2d || t == 0) {
        if (p.s_col_ld_mn) {
          store_scale_at(p.s_col, m_tile * p.s_col_ld_mn + gcol, sc, false);
        } else if (!p.col_transposed) {
          store_scale_at(p.s_col, m_tile * k + gcol, sc, false);
        } else {
          // [matrices, k or k blocks, the matrix's row tiles]; one matrix unless col_rows.
          const int64_t tiles = p.col_rows ? p.col_rows / kRegsTile : (m + kRegsTile - 1) / kRegsTile;
          const int64_t tile = m_tile - mat * tiles;
          const int64_t rows = p.block_2d ? (k + kRegsTile - 1) / kRegsTile : k, r = p.block_2d ? k_tile : gcol;
          const int64_t s_ld = p.s_col_ld_2d ? p.s_col_ld_2d : tiles, at = (mat * rows + r) * s_ld;
          store_scale_at(p.s_col, at + tile, sc, false);
          if (tile == tiles - 1) {
            for (int64_t j = tiles; j < s_ld; ++j) store_scale_at(p.s_col, at + j, Scale{}, false);
          }
        }
      }
    }
  }
  __syncthreads();

  using P = Pair<T>;
  const int64_t rows_in = m - (m0 + kSide * tr);  // of the block's 8 rows, those inside the tensor
  if (row && gc < k) {  // 8 codes a row, written as one 8-byte store (a warp: two full 128-byte rows)
    float mult[kSide];
    *reinterpret_cast<float4*>(&mult[0]) = *reinterpret_cast<const float4*>(&s.row_mult[kSide * tr]);
    *reinterpret_cast<float4*>(&mult[4]) = *reinterpret_cast<const float4*>(&s.row_mult[kSide * tr + 4]);
    store_row_codes<T, F>(d, static_cast<uint8_t*>(p.q_row) + (m0 + kSide * tr) * k + gc, k, rows_in,
                          [&](int i, int) { return mult[i]; });
  }
  if (!col) return;
  float cmult[kSide];
  *reinterpret_cast<float4*>(&cmult[0]) = *reinterpret_cast<const float4*>(&s.col_mult[kSide * tc]);
  *reinterpret_cast<float4*>(&cmult[4]) = *reinterpret_cast<const float4*>(&s.col_mult[kSide * tc + 4]);
  if (!p.col_transposed) {  // in place, [m, k]: like the row output, each value with its column's scale
    if (gc < k) {
      store_row_codes<T, F>(d, static_cast<uint8_t*>(p.q_col) + (m0 + kSide * tr) * k + gc, k, rows_in,
                            [&](int, int j) { return cmult[j]; });
    }
    return;
  }
  {  // column j of the block: its 8 rows' codes as one 8-byte run of the staged [column][row] tile
#pragma unroll
    for (int j = 0; j < kSide; ++j) {
      float v[kSide];
#pragma unroll
      for (int i = 0; i < kSide; ++i) {
        const float2 f = P::to_float2(word(d[i], j / 2));
        v[i] = (j & 1) ? f.y : f.x;
      }
      const uint2 w =
          make_uint2(encode4<F>(v[0], v[1], v[2], v[3], cmult[j]), encode4<F>(v[4], v[5], v[6], v[7], cmult[j]));
      *reinterpret_cast<uint2*>(&s.staged[staged_at(kSide * tc + j, tr)]) = w;
    }
  }
  __syncthreads();
  // The transposed output [k, m] (of the tile's matrix, with col_rows): each of the tile's 128
  // columns is 128 bytes of an output row, 16 bytes a thread (m % 16 == 0, so a run is all in or
  // all out).
  uint8_t* q_col = static_cast<uint8_t*>(p.q_col) + mat * k * ld + (m0 - mat * ld);
#pragma unroll
  for (int q = threadIdx.x; q < kRegsTile * kRegsTile / 16; q += kRegsThreads) {
    const int c = q / 8, run = q % 8;
    if (k0 + c >= k || m0 + 16 * run >= m) continue;
    const int slot = (2 * run) ^ (c >> 3);  // the first 8-byte half; odd: the halves are swapped
    uint4 v = *reinterpret_cast<const uint4*>(&s.staged[c * kRegsTile + 8 * (slot & ~1)]);
    if (slot & 1) v = make_uint4(v.z, v.w, v.x, v.y);
    *reinterpret_cast<uint4*>(q_col + (k0 + c) * ld + 16 * run) = v;
  }
}

// Launches the kernel (the caller checked tile_regs_supported); false where the grid does not fit.
template <class T, class F>
bool launch_tile_regs(const PtQuantParams& p, cudaStream_t stream) {
  dim3 grid;
  if (!regs_grid(p.m, p.k, grid)) return false;
  if (p.after_amax_pass) {
    launch_dependent(quantize_tile_regs_kernel<T, F>, grid, dim3(kRegsThreads), 0, stream, p);
  } else {
    quantize_tile_regs_kernel<T, F><<<grid, kRegsThreads, 0, stream>>>(p);
  }
  return true;
}

// Requests the register-tile amax kernel takes: 16-bit input in 16-byte aligned rows (a stack's
// per-matrix column maxima: whole 128-row tiles per matrix).
__host__ __device__ __forceinline__ bool amax_regs_supported(const PtQuantAmaxParams& p, int elem_bytes) {
  return elem_bytes == 2 && p.k % 8 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
         (!p.col_rows || (p.col_rows % kRegsTile == 0 && p.m % p.col_rows == 0));
}

// Absolute maxima of a tile (the tensor's, per row, per column; null: not wanted), merged into the
// caller's zeroed buffers with atomic max (non-negative floats order like their bits). k fastest
// (blockIdx.x), first to last: the quantization that follows walks back from where this ends.
template <class T>
__global__ void __launch_bounds__(kRegsThreads, 3) amax_tile_regs_kernel(const PtQuantAmaxParams p) {
  using namespace tile_regs;
  __shared__ float row_amax[kRegsTile];
  __shared__ uint32_t col_part[kRegsThreads / 32][kRegsTile / 2];
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kRegsTile, k0 = static_cast<int64_t>(blockIdx.x) * kRegsTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tc = lane % 16, tr = 2 * warp + lane / 16;
  // Once every block has passed here (all have started), the quantization launched as this pass's
  // dependent may take the SMs its last wave leaves free.
  allow_dependent_launch();
  uint4 d[kSide];
  load_block(static_cast<const T*>(p.x), p.m, p.k, m0 + kSide * tr, k0 + kSide * tc, d);
  const bool rows = p.amax_rows != nullptr || p.amax_tensor != nullptr;
  if (rows) row_maxima<T>(d, tc, row_amax + kSide * tr);
  if (p.amax_cols) column_maxima<T>(d, lane, col_part[warp] + 4 * tc);
  __syncthreads();
  const int t = threadIdx.x % kRegsTile;
  if (threadIdx.x < kRegsTile && rows) {  // warps 0..3: a row each; the tensor's amax from the rows'
    const float a = row_amax[t];
    if (p.amax_rows && m0 + t < p.m) atomicMax(reinterpret_cast<int*>(p.amax_rows + m0 + t), __float_as_int(a));
    if (p.amax_tensor) {
      float w = a;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, o));
      if (lane == 0) atomicMax(reinterpret_cast<int*>(p.amax_tensor), __float_as_int(w));
    }
  } else if (threadIdx.x >= kRegsTile && p.amax_cols && k0 + t < p.k) {
    const int64_t mat = p.col_rows ? m0 / p.col_rows : 0;  // a stack's matrix: its own column maxima
    atomicMax(reinterpret_cast<int*>(p.amax_cols + mat * p.k + k0 + t), __float_as_int(column_amax<T>(col_part, t)));
  }
}

// Launches amax_tile_regs_kernel (the request checked by amax_regs_supported); false when the grid
// is out of range (more than 65535 row tiles), as launch_tile_regs.
template <class T>
bool launch_amax_regs(const PtQuantAmaxParams& p, cudaStream_t stream) {
  dim3 grid;
  if (!regs_grid(p.m, p.k, grid)) return false;
  amax_tile_regs_kernel<T><<<grid, kRegsThreads, 0, stream>>>(p);
  return true;
}

}  // namespace primus_turbo::kernels::quant
