// A CUTLASS 3 GEMM launched as GemmUniversalAdapter::initialize + run do it, except that the
// kernel's shared-memory opt-in (cudaFuncSetAttribute, microseconds of host time) is made once per
// device instead of at every call: an op's host cost is paid on every training step.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"

namespace primus_turbo::kernels {

template <class Gemm>
cutlass::Status initialize_and_run(const typename Gemm::Arguments& args, void* workspace, cudaStream_t stream) {
  using Kernel = typename Gemm::GemmKernel;
  cutlass::Status status = Kernel::initialize_workspace(args, workspace, stream, nullptr);
  if (status != cutlass::Status::kSuccess) return status;
  typename Gemm::Params params = Kernel::to_underlying_arguments(args, workspace);
  constexpr int kSmem = static_cast<int>(Kernel::SharedStorageSize);
  if constexpr (kSmem >= (48 << 10)) {
    static std::atomic<uint64_t> opted{0};  // a bit per device (the first 64)
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return cutlass::Status::kErrorInternal;
    const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
    if (!bit || !(opted.load(std::memory_order_acquire) & bit)) {
      if (cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) !=
          cudaSuccess) {
        (void)cudaGetLastError();  // clear the error bit, as the adapter does
        return cutlass::Status::kErrorInternal;
      }
      opted.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
  return Gemm::run(params, stream);
}

}  // namespace primus_turbo::kernels
