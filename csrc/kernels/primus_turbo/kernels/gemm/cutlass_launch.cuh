// A CUTLASS 3 GEMM launched as GemmUniversalAdapter::initialize + run do it, except that the
// kernel's shared-memory opt-in is made once per device (common/smem_opt_in.cuh) instead of at
// every call: an op's host cost is paid on every training step.
#pragma once

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "primus_turbo/kernels/common/smem_opt_in.cuh"

namespace primus_turbo::kernels {

template <class Gemm>
cutlass::Status initialize_and_run(const typename Gemm::Arguments& args, void* workspace, cudaStream_t stream) {
  using Kernel = typename Gemm::GemmKernel;
  cutlass::Status status = Kernel::initialize_workspace(args, workspace, stream, nullptr);
  if (status != cutlass::Status::kSuccess) return status;
  typename Gemm::Params params = Kernel::to_underlying_arguments(args, workspace);
  constexpr int kSmem = static_cast<int>(Kernel::SharedStorageSize);
  if constexpr (kSmem >= (48 << 10)) {
    if (opt_in_smem(cutlass::device_kernel<Kernel>, kSmem) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the error bit, as the adapter does
      return cutlass::Status::kErrorInternal;
    }
  }
  return Gemm::run(params, stream);
}

}  // namespace primus_turbo::kernels
