// Warp reductions over all 32 lanes (butterfly: every lane ends with the same bits, as each step
// combines the same two values), and the launch error report of a module's host side.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>

namespace primus_turbo::kernels {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// After a launch: 0, or 1 with err naming `what` and the CUDA error.
inline int report_launch(const char* what, char* err, size_t err_len) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  snprintf(err, err_len, "%s launch failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return 1;
}

}  // namespace primus_turbo::kernels
