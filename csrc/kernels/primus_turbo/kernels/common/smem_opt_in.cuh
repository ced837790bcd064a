// Dynamic shared memory above 48 KiB needs an opt-in per kernel and device. It is made once per
// (kernel, device, size) here: the attribute call costs microseconds of host time, and every op
// call launches.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <set>
#include <tuple>

namespace primus_turbo::kernels {

inline cudaError_t opt_in_smem(const void* kernel, size_t bytes) {
  static std::mutex mutex;
  static std::set<std::tuple<const void*, int, size_t>> done;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const auto key = std::make_tuple(kernel, device, bytes);
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count(key)) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess) done.insert(key);
  return e;
}

template <class Kernel>
cudaError_t opt_in_smem(Kernel* kernel, size_t bytes) {
  return opt_in_smem(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace primus_turbo::kernels
