// Shared pieces of the MoE permutation kernels: limits and probability loads of any of the three
// float dtypes (16-byte packs and float conversions: common/convert.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "primus_turbo/kernels/common/convert.cuh"
#include "primus_turbo/kernels/common/warp.cuh"

namespace primus_turbo::kernels::moe {

constexpr int kMaxExperts = 1024;
constexpr int kThreads = 256;

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
