// Checks for CUDA runtime and cuBLAS(Lt) calls: a failure throws with the call, the status code
// translated into words, and a hint where a common cause is known.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core/error.h"

namespace primus_turbo {

const char* cublas_status_string(cublasStatus_t status);
std::string cublas_status_hint(cublasStatus_t status);

}  // namespace primus_turbo

#define PT_CHECK_CUDA(expr)                                                                 \
  do {                                                                                      \
    cudaError_t pt_err_ = (expr);                                                           \
    if (pt_err_ != cudaSuccess) {                                                           \
      PT_THROW(PT_ERROR_CUDA, #expr, " failed: ", cudaGetErrorName(pt_err_), " (",          \
               cudaGetErrorString(pt_err_), ")");                                           \
    }                                                                                       \
  } while (0)

#define PT_CHECK_CUBLAS(expr)                                                                 \
  do {                                                                                        \
    cublasStatus_t pt_st_ = (expr);                                                           \
    if (pt_st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      PT_THROW(PT_ERROR_CUBLAS, #expr, " failed: ", ::primus_turbo::cublas_status_string(pt_st_), \
               ::primus_turbo::cublas_status_hint(pt_st_));                                   \
    }                                                                                         \
  } while (0)
