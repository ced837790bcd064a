// Device helpers shared by the memory-bound kernels (normalization, gated activations): packed
// 16-byte accesses, conversions to and from fp32 (convert.cuh), warp (warp.cuh) and block sums,
// launch error reporting (warp.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/common/convert.cuh"
#include "primus_turbo/kernels/common/warp.cuh"

namespace primus_turbo::kernels {

constexpr int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Read-only, streamed once: do not keep it in L1 (leaves L1 to the per-column vectors).
template <class P>
__device__ __forceinline__ P load_stream(const P* p) {
  P out;
  if constexpr (sizeof(P) == 16) {
    const int4 v = __ldcs(reinterpret_cast<const int4*>(p));
    out = *reinterpret_cast<const P*>(&v);
  } else {
    out = *p;
  }
  return out;
}

// Written once, read by a later kernel: streaming store.
template <class P>
__device__ __forceinline__ void store_stream(P* p, const P& v) {
  if constexpr (sizeof(P) == 16) {
    __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&v));
  } else {
    *p = v;
  }
}

// Sums of two values over a block whose size is a multiple of 32; every thread gets the same
// values. scratch holds 66 floats. Two barriers make back-to-back calls safe.
__device__ __forceinline__ float2 block_sum2(float a, float b, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    float s = lane < num_warps ? scratch[lane] : 0.f;
    float t = lane < num_warps ? scratch[32 + lane] : 0.f;
    s = warp_sum(s);
    t = warp_sum(t);
    if (lane == 0) {
      scratch[64] = s;
      scratch[65] = t;
    }
  }
  __syncthreads();
  return make_float2(scratch[64], scratch[65]);
}

}  // namespace primus_turbo::kernels
