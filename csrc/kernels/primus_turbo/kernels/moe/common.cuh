// Shared pieces of the MoE permutation kernels: limits, 16-byte packs, float conversions and
// probability loads of any of the three float dtypes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace primus_turbo::kernels::moe {

constexpr int kMaxExperts = 1024;
constexpr int kThreads = 256;

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
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// pt_dtype codes of the probabilities: 0 float32, 1 float16, 2 bfloat16.
__device__ __forceinline__ float load_prob(const void* p, int dtype, int64_t i) {
  if (dtype == 1) return __half2float(static_cast<const __half*>(p)[i]);
  if (dtype == 2) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_prob(void* p, int dtype, int64_t i, float v) {
  if (dtype == 1) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else if (dtype == 2) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<float*>(p)[i] = v;
}

}  // namespace primus_turbo::kernels::moe
