// Packed-sequence metadata for cuDNN's fused attention (see ragged_abi.h): sequence lengths and,
// per operand, the element offset where each sequence starts, from cu_seqlens on the device, so a
// varlen call needs no host synchronization and stays capturable in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/attention/ragged_abi.h"
#include "primus_turbo/kernels/common/warp.cuh"
#include "primus_turbo/kernels/jit_export.cuh"

namespace primus_turbo::kernels::attention {

constexpr int kRaggedThreads = 256;

__device__ __forceinline__ int64_t clamped_start(const PtRaggedParams& p, int64_t b) {
  return min(max(static_cast<int64_t>(p.cu_seqlens[b]), int64_t{0}), p.total);
}

// Lengths and offsets: blockIdx.y == 0, one thread a sequence (batch + 1 entries), grid-strided.
__device__ __forceinline__ void ragged_offsets(const PtRaggedParams& p) {
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * kRaggedThreads + threadIdx.x; b <= p.batch;
       b += static_cast<int64_t>(gridDim.x) * kRaggedThreads) {
    const int64_t start = clamped_start(p, b);
    if (b < p.batch) {
      const int64_t len = static_cast<int64_t>(p.cu_seqlens[b + 1]) - p.cu_seqlens[b];
      p.seqlens[b] = static_cast<int32_t>(min(max(len, int64_t{0}), min(p.max_len, p.total - start)));
    }
    for (int i = 0; i < p.num_strides; ++i) p.offsets[i * (p.batch + 1) + b] = start * p.strides[i];
  }
}

// Tail t (blockIdx.y == t + 1): its rows' elements grid-strided (a tail is empty unless the packed
// tensor has rows past the last sequence).
__device__ __forceinline__ void ragged_tail(const PtRaggedParams& p, const PtRaggedTail& t) {
  const int64_t first = clamped_start(p, p.batch);
  const int64_t per_row = static_cast<int64_t>(t.heads) * t.dim;
  const int64_t count = (t.total > first ? t.total - first : 0) * per_row;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kRaggedThreads + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * kRaggedThreads) {
    const int64_t row = first + e / per_row, head = (e % per_row) / t.dim, i = e % t.dim;
    const int64_t at = row * t.ss + head * t.sh + i;
    if (t.elem_bytes == 4) {
      static_cast<float*>(t.data)[at] = t.fill;
    } else {
      static_cast<uint16_t*>(t.data)[at] = 0;
    }
  }
}

// One launch for both jobs (they are independent: a tail's first row comes from cu_seqlens), so a
// packed call issues one metadata launch before cuDNN's.
__global__ void __launch_bounds__(kRaggedThreads) ragged_metadata_kernel(const PtRaggedParams p) {
  if (blockIdx.y == 0) {
    ragged_offsets(p);
  } else {
    ragged_tail(p, p.tails[blockIdx.y - 1]);
  }
}

struct RaggedOffsets {
  static int run(const PtRaggedParams* p, char* err, size_t err_len) {
    if (p->num_strides < 0 || p->num_strides > PT_RAGGED_MAX_STRIDES || p->batch < 0) {
      snprintf(err, err_len, "ragged offsets: %d strides, batch %lld", p->num_strides,
               static_cast<long long>(p->batch));
      return 1;
    }
    if (p->num_tails < 0 || p->num_tails > PT_RAGGED_MAX_TAILS) {
      snprintf(err, err_len, "ragged offsets: %d tails", p->num_tails);
      return 1;
    }
    // x: the offsets' blocks (batch + 1 entries, up to 1024 blocks), at least the tails' 64.
    const int64_t offset_blocks = (p->batch + kRaggedThreads) / kRaggedThreads;
    const int64_t blocks = offset_blocks < 64 ? 64 : (offset_blocks < 1024 ? offset_blocks : 1024);
    ragged_metadata_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(1 + p->num_tails)),
                             kRaggedThreads, 0, static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch("ragged metadata", err, err_len);
  }
};

}  // namespace primus_turbo::kernels::attention
