// One cuBLASLt handle per device, shared by the GEMM backends (created on first use).
#pragma once

#include <cublasLt.h>

namespace primus_turbo::gemm {

cublasLtHandle_t cublaslt_handle(int device);

}  // namespace primus_turbo::gemm
