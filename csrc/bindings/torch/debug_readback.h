// The debug modes that read device-side sizes back to check them on the host
// (PRIMUS_TURBO_CHECK_GROUP_LENS, PRIMUS_TURBO_CHECK_CU_SEQLENS): the switch and the read-back.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

// Whether the debug check named by environment variable `var` runs: set, not empty and not "0",
// and the stream not capturing a CUDA graph (a read-back synchronizes).
inline bool debug_readback_on(const char* var, void* stream) {
  const char* flag = std::getenv(var);
  return flag && *flag && std::string(flag) != "0" && !is_capturing(stream);
}

// t's elements (a contiguous tensor of T) on the host, after a synchronization of stream; a
// failed copy raises naming the op, the argument and the debug variable.
template <class T>
std::vector<T> read_back(const char* op, const Tensor& t, const char* name, const char* var, void* stream) {
  std::vector<T> host(static_cast<size_t>(t.numel()));
  if (!host.empty() &&
      (cudaMemcpyAsync(host.data(), t.data_ptr(), host.size() * sizeof(T), cudaMemcpyDeviceToHost,
                       static_cast<cudaStream_t>(stream)) != cudaSuccess ||
       cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) != cudaSuccess))
    fail_with(ErrorKind::Runtime, op, ": could not read '", name, "' back for ", var);
  return host;
}

}  // namespace primus_turbo::torch_binding
