// Batched transpose of the last two dimensions, for 1-, 2- and 4-byte elements (FP8 weights and
// bf16 weights turned K-major for the other GEMM of a training step).
//
// One CTA moves a 64 x 64 tile through shared memory, so that both the read of x's rows and the
// write of y's rows are coalesced. Each thread moves a 4-byte word (4 / sizeof(T) elements) when
// rows and cols are multiples of that and the pointers are 4-byte aligned, else single elements:
// a byte transpose in single elements would issue four times the memory instructions. The tile
// row is padded by one element, which spreads a word's column of elements over distinct banks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/layout/transpose_abi.h"

namespace primus_turbo::kernels::layout {

constexpr int kTile = 64;
constexpr int kThreads = 256;

template <class T, int V>
struct alignas(sizeof(T) * V) Word {
  T v[V];
};

// Grid (col tiles, row tiles, batch). V elements a thread per access.
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    transpose_tiles(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols) {
  constexpr int kWords = kTile / V;              // words across a tile row
  constexpr int kRowsPerPass = kThreads / kWords;
  __shared__ T tile[kTile][kTile + 1];
  const int64_t matrix = rows * cols;
  const T* src = x + int64_t(blockIdx.z) * matrix;
  T* dst = y + int64_t(blockIdx.z) * matrix;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int w = threadIdx.x % kWords, lane_row = threadIdx.x / kWords;
  for (int r = lane_row; r < kTile; r += kRowsPerPass) {
    const int64_t gr = r0 + r, gc = c0 + int64_t(w) * V;
    if (gr < rows && gc < cols) {  // V divides cols: the whole word is inside
      const Word<T, V> word = *reinterpret_cast<const Word<T, V>*>(src + gr * cols + gc);
#pragma unroll
      for (int j = 0; j < V; ++j) tile[r][w * V + j] = word.v[j];
    }
  }
  __syncthreads();
  for (int c = lane_row; c < kTile; c += kRowsPerPass) {
    const int64_t gc = c0 + c, gr = r0 + int64_t(w) * V;
    if (gc < cols && gr < rows) {  // V divides rows
      Word<T, V> word;
#pragma unroll
      for (int j = 0; j < V; ++j) word.v[j] = tile[w * V + j][c];
      *reinterpret_cast<Word<T, V>*>(dst + gc * rows + gr) = word;
    }
  }
}

template <int kBytes>
struct Transpose {
  using T = std::conditional_t<kBytes == 1, uint8_t, std::conditional_t<kBytes == 2, uint16_t, uint32_t>>;
  static constexpr int kWordElems = 4 / kBytes;

  static int run(const PtTransposeParams* p, char* err, size_t err_len) {
    if (p->batch == 0 || p->rows == 0 || p->cols == 0) return 0;
    const int64_t col_tiles = (p->cols + kTile - 1) / kTile, row_tiles = (p->rows + kTile - 1) / kTile;
    if (row_tiles > 65535 || p->batch > 65535 || col_tiles > INT32_MAX) {
      std::snprintf(err, err_len, "transpose: grid too large (batch %lld, rows %lld, cols %lld)",
                    static_cast<long long>(p->batch), static_cast<long long>(p->rows),
                    static_cast<long long>(p->cols));
      return 1;
    }
    const dim3 grid(unsigned(col_tiles), unsigned(row_tiles), unsigned(p->batch));
    auto stream = static_cast<cudaStream_t>(p->stream);
    const auto* x = static_cast<const T*>(p->x);
    auto* y = static_cast<T*>(p->y);
    const bool words = p->rows % kWordElems == 0 && p->cols % kWordElems == 0 &&
                       reinterpret_cast<uintptr_t>(x) % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 4 == 0;
    if (kWordElems > 1 && words) {
      transpose_tiles<T, kWordElems><<<grid, kThreads, 0, stream>>>(x, y, p->rows, p->cols);
    } else {
      transpose_tiles<T, 1><<<grid, kThreads, 0, stream>>>(x, y, p->rows, p->cols);
    }
    const cudaError_t launch = cudaGetLastError();
    if (launch != cudaSuccess) {
      std::snprintf(err, err_len, "transpose launch failed: %s", cudaGetErrorString(launch));
      return 1;
    }
    return 0;
  }
};

}  // namespace primus_turbo::kernels::layout
