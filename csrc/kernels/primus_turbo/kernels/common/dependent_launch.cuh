// Programmatic dependent launch (sm_90): a kernel that consumes its predecessor's output on the
// same stream is launched as that kernel's dependent, so its blocks are placed as the
// predecessor's retire instead of after a launch gap; it waits for the predecessor's results at
// grid_dependency_wait(). The predecessor allows the early launch with allow_dependent_launch()
// (every block must reach it, or exit, before any dependent block starts). Both are no-ops when
// the kernels were launched the ordinary way, and below sm_90.
#pragma once

#include <cuda_runtime.h>

namespace primus_turbo::kernels {

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether the current device takes programmatic dependent launches (compute capability 9.0 on).
inline bool dependent_launch_supported() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 9;
}

// kernel<<<grid, block, smem, stream>>>(args...) as the dependent of the stream's previous kernel
// (an ordinary launch below sm_90, or where the attributed launch is refused: stream order alone is
// correct, only slower). Returns the launch's status.
template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = dependent_launch_supported() ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  if (e != cudaSuccess && config.numAttrs) {
    (void)cudaGetLastError();
    config.numAttrs = 0;
    e = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  }
  return e;
}

}  // namespace primus_turbo::kernels
