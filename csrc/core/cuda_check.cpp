#include "core/cuda_check.h"

namespace primus_turbo {

const char* cublas_status_string(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

std::string cublas_status_hint(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return " (is a CUDA device present and the driver loaded?)";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return " (out of device memory)";
    case CUBLAS_STATUS_INVALID_VALUE:
      return " (a size, leading dimension or pointer alignment is not valid for this layout)";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return " (this dtype/layout combination has no cuBLASLt kernel on this GPU)";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return " (the kernel failed to launch or run; an earlier asynchronous error may be the cause)";
    default:
      return "";
  }
}

}  // namespace primus_turbo
