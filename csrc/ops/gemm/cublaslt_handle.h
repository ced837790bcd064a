// What the cuBLASLt GEMM backends (bf16 and FP8) share: one handle per device (created on first
// use) and owning wrappers of the descriptor objects.
#pragma once

#include <cublasLt.h>

namespace primus_turbo::gemm {

cublasLtHandle_t cublaslt_handle(int device);

// A cuBLASLt object destroyed with its owner (matmul descriptor, matrix layout, preference).
template <class T, cublasStatus_t (*Destroy)(T)>
struct Owned {
  T value = nullptr;
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (value) Destroy(value);
  }
};

using OwnedMatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using OwnedLayout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using OwnedPreference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

}  // namespace primus_turbo::gemm
