// Device helpers shared by the memory-bound kernels (normalization, gated activations): packed
// 16-byte accesses, conversions to and from fp32, warp and block sums, launch error reporting.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace primus_turbo::kernels {

constexpr int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// N contiguous elements moved as one access (two 16-byte accesses for 8 floats).
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
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

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

// Butterfly: every lane ends with the same bits (each step adds the same two values).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
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

inline int report_launch(const char* what, char* err, size_t err_len) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  snprintf(err, err_len, "%s launch failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return 1;
}

}  // namespace primus_turbo::kernels
