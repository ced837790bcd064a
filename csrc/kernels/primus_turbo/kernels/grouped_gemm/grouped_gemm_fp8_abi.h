// The binary contract of FP8 grouped GEMM modules (kernels/grouped_gemm/cutlass_grouped_gemm_fp8_sm90.cuh).
// A header of its own, so the bf16 grouped modules' cache keys do not depend on it.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// d[rows of g] = (a[rows of g] * sfa) @ (b[g] * sfb)^T for every group g, FP32 accumulation.
//   a    [rows, k] FP8, row-major (K-major);  sfa [rows, ceil(k/128)] fp32 row-major: one scale
//        per row and 128-deep K block (1x128 blocks).
//   b    [G, n, k] FP8, row-major per group (K-major).
//        sfb: scale_rows_b == 1:   [G, n, ceil(k/128)] (1x128 blocks of b[g]);
//             scale_rows_b == 128: [G, ceil(n/128), ceil(k/128)] (128x128 blocks).
//   d    [rows, n] bf16/fp16/fp32 row-major.
// Group starts and lengths are read from group_lens / group_offs and clamped into [0, rows) on
// the device, as for the bf16 grouped GEMM.
typedef struct PtGroupedGemmFp8Params {
  int64_t num_groups;
  int64_t rows;
  int64_t n, k;
  const int64_t* group_lens;  // [num_groups], device
  const int64_t* group_offs;  // [num_groups + 1] or NULL (exclusive prefix sum of group_lens)
  const void* a;
  const float* sfa;
  const void* b;
  const float* sfb;
  void* d;
  void* workspace;
  size_t workspace_bytes;
  void* stream;  // cudaStream_t
  int device;
  int num_sms;
} PtGroupedGemmFp8Params;

typedef int (*PtGroupedGemmFp8RunFn)(const PtGroupedGemmFp8Params* params, char* err, size_t err_len);
typedef int (*PtGroupedGemmFp8WorkspaceFn)(const PtGroupedGemmFp8Params* params, size_t* bytes,
                                           char* err, size_t err_len);

#ifdef __cplusplus
}

// Exports Kernel::run and Kernel::workspace as pt_grouped_gemm_fp8_run / _workspace.
#define PT_JIT_EXPORT_GROUPED_GEMM_FP8(Kernel)                                              \
  extern "C" __attribute__((visibility("default"))) int pt_jit_abi_version() {              \
    return PT_JIT_ABI_VERSION;                                                              \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_grouped_gemm_fp8_run(            \
      const PtGroupedGemmFp8Params* params, char* err, size_t err_len) {                    \
    return Kernel::run(params, err, err_len);                                               \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_grouped_gemm_fp8_workspace(      \
      const PtGroupedGemmFp8Params* params, size_t* bytes, char* err, size_t err_len) {     \
    return Kernel::workspace(params, bytes, err, err_len);                                  \
  }
#endif
