// Up to two FP8 quantizations (a GEMM's two operands) in one cooperative launch. Where the scales
// come from a device-wide amax (tensorwise; rowwise with a column copy), the separate path costs a
// memset, an amax launch and a quantize launch per operand: here the CTAs zero the amax scratch,
// meet at a grid barrier, reduce the amax of every tile, meet again and quantize every tile. Block
// scales need no barrier. Each phase walks the tiles of both jobs grid-strided; the tile bodies are
// the separate kernels' (quantize_tile.cuh), so the results are bit-identical to theirs.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "primus_turbo/kernels/quantization/quant_abi.h"
#include "primus_turbo/kernels/quantization/quantize_tile.cuh"

namespace primus_turbo::kernels::quant {

__host__ __device__ __forceinline__ int64_t tiles_of(const PtQuantParams& p) {
  return ((p.m + kTile - 1) / kTile) * ((p.k + kTile - 1) / kTile);
}

// Job p's scales come from a device-wide amax (tensorwise, rowwise), not from its tiles.
__device__ __forceinline__ bool needs_amax(const PtQuantParams& p) {
  return p.amax_row != nullptr || p.amax_col != nullptr;
}

// Grid-strided zeroing of job p's amax scratch and of the padding of its blocks-major scales.
__device__ __forceinline__ void zero_scratch(const PtQuantParams& p, int64_t first, int64_t stride) {
  if (p.amax_row != nullptr) {  // per row [m], or the tensor's one value (which amax_col shares)
    float* rows = const_cast<float*>(p.amax_row);
    const int64_t n = p.amax_row_per_row ? p.m : 1;
    for (int64_t i = first; i < n; i += stride) rows[i] = 0.0f;
  }
  if (p.amax_col != nullptr && p.amax_col_per_col) {
    float* cols = const_cast<float*>(p.amax_col);
    for (int64_t i = first; i < p.k; i += stride) cols[i] = 0.0f;
  }
  // Blocks-major 1-D block scales: [blocks, ld] with ld = round_up(rows, 4); rows..ld stay 0.
  const auto pad = [&](void* scales, int64_t rows, int64_t ld, int64_t blocks) {
    const int64_t extra = ld - rows;
    if (scales == nullptr || extra <= 0) return;
    float* f = static_cast<float*>(scales);
    for (int64_t i = first; i < extra * blocks; i += stride) f[(i / extra) * ld + rows + i % extra] = 0.0f;
  };
  if (p.s_row_ld_mn) pad(p.s_row, p.m, p.s_row_ld_mn, (p.k + p.row_block - 1) / p.row_block);
  if (p.s_col_ld_mn) pad(p.s_col, p.k, p.s_col_ld_mn, (p.m + p.col_block - 1) / p.col_block);
}

// Tile t of the batch's tile sequence (job 0's tiles, then job 1's): its job and tile coordinates.
struct BatchTile {
  int job;
  int64_t m_tile, k_tile;
};

__device__ __forceinline__ BatchTile batch_tile(const PtQuantBatch& b, int64_t t, int64_t tiles0) {
  const int job = t >= tiles0 ? 1 : 0;
  const int64_t local = job ? t - tiles0 : t;
  const int64_t k_tiles = (b.jobs[job].k + kTile - 1) / kTile;
  return {job, local / k_tiles, local % k_tiles};
}

template <class T, class F>
__global__ void __launch_bounds__(kThreads) quantize_batch_kernel(const __grid_constant__ PtQuantBatch b) {
  // __grid_constant__: jobs[j] is read in place with a run-time j (no local copy of the batch).
  namespace cg = cooperative_groups;
  extern __shared__ __align__(16) float smem[];
  const TileSmem<T> s = carve<T>(smem);
  const int64_t tiles0 = tiles_of(b.jobs[0]);
  const int64_t total = tiles0 + (b.count > 1 ? tiles_of(b.jobs[1]) : 0);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * kThreads;
  bool amax = false;
  for (int j = 0; j < b.count; ++j) {
    zero_scratch(b.jobs[j], thread, threads);
    amax = amax || needs_amax(b.jobs[j]);
  }
  if (amax) {
    cg::this_grid().sync();  // scratch zeroed everywhere before any atomic max
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
      const BatchTile bt = batch_tile(b, t, tiles0);
      const PtQuantParams& p = b.jobs[bt.job];
      if (!needs_amax(p)) continue;
      float* rows = const_cast<float*>(p.amax_row);  // null, per row, or the tensor's
      float* cols = p.amax_col_per_col ? const_cast<float*>(p.amax_col) : nullptr;
      amax_tile<T>(s, static_cast<const T*>(p.x), p.m, p.k, bt.m_tile, bt.k_tile, p.amax_row_per_row ? nullptr : rows,
                   p.amax_row_per_row ? rows : nullptr, cols);
      __syncthreads();  // the next tile reuses the shared memory
    }
    cg::this_grid().sync();  // every amax complete
  }
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const BatchTile bt = batch_tile(b, t, tiles0);
    quantize_tile<T, F, T>(s, b.jobs[bt.job], bt.m_tile, bt.k_tile);
    __syncthreads();
  }
}

}  // namespace primus_turbo::kernels::quant
