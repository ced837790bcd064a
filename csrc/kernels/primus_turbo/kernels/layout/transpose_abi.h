// The C ABI between the core and a batched transpose module (kernels/layout/transpose.cuh).
// Kept beside the kernel so that only these modules hash it; the ABI version is jit_abi.h's.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// y[b] = x[b]^T for b < batch: x [batch, rows, cols] -> y [batch, cols, rows], both contiguous,
// elements of the module's size (1, 2 or 4 bytes), copied bit for bit.
typedef struct PtTransposeParams {
  const void* x;
  void* y;
  int64_t batch, rows, cols;
  void* stream;  // cudaStream_t
} PtTransposeParams;

typedef int (*PtTransposeFn)(const PtTransposeParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}

#define PT_JIT_EXPORT_TRANSPOSE(Kernel)                                                          \
  PT_JIT_EXPORT_ABI_VERSION                                                                      \
  extern "C" __attribute__((visibility("default"))) int pt_transpose_run(                        \
      const PtTransposeParams* params, char* err, size_t err_len) {                              \
    return Kernel::run(params, err, err_len);                                                    \
  }
#endif
