// The C ABI of a JIT-compiled FP8 GEMM module (kernels/gemm/cutlass_gemm_fp8_sm90.cuh).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// D[m, n] = sum_kb (A[m, kb] @ B[n, kb]^T) * sfa * sfb + beta * D, A [m, k] and B [n, k] row-major
// FP8, one fp32 scale per 128-deep K block of each operand, at the granularity (1 or 128 rows)
// compiled into the module. Scale layouts are those of pt_fp8_scaling (gemm_fp8.h): 1-row
// granularity: [kb, sf_ld] rows contiguous; 128-row: [ceil(rows/128), sf_ld] K blocks contiguous.
typedef struct PtGemmFp8Params {
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  const float* sfa;
  int64_t sfa_ld;
  const float* sfb;
  int64_t sfb_ld;
  void* d;
  int64_t ldd;
  float beta;
  void* workspace;
  size_t workspace_bytes;
  void* stream;  // cudaStream_t
  int device;
  int num_sms;
} PtGemmFp8Params;

typedef int (*PtGemmFp8RunFn)(const PtGemmFp8Params* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
