// The binary contract between the core library and a just-in-time compiled kernel module.
//
// A JIT module is a shared object built from a few generated lines that instantiate one kernel
// template. It exports plain C functions whose arguments are the structs below, so the core never
// needs the kernel's C++ types and a module built by one version of the core is rejected (by
// PT_JIT_ABI_VERSION) rather than misread by another.
#pragma once

#include <stddef.h>
#include <stdint.h>

#define PT_JIT_ABI_VERSION 2

#ifdef __cplusplus
extern "C" {
#endif

// D[m, n] = alpha * op(A) @ op(B) + beta * D  (beta != 0 reads D first: in-place accumulation).
// Leading dimensions are in elements; the layouts themselves are compile-time parts of the module.
typedef struct PtGemmParams {
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* d;
  int64_t ldd;
  float alpha;
  float beta;
  void* workspace;
  size_t workspace_bytes;
  void* stream;  // cudaStream_t
  int device;
  int num_sms;   // SMs the persistent scheduler may use (0: all)
  int swizzle;   // persistent tile scheduler's max swizzle (1, 2, 4 or 8; 0 means 1): a runtime
                 // choice, so autotune can try it without another module
} PtGemmParams;

// RMSNorm over the last dimension of a contiguous [rows, hidden] tensor (see
// kernels/normalization/rmsnorm.cuh). Dtypes and vectorization are compile-time parts of the module.
typedef struct PtRmsNormFwdParams {
  int64_t rows, hidden;
  const void* x;      // [rows, hidden]
  const void* gamma;  // [hidden]
  void* y;            // [rows, hidden], x's dtype
  float* rstd;        // [rows]: 1 / sqrt(mean(x^2) + eps), kept for the backward
  float eps;
  int zero_centered;  // the weight is 1 + gamma
  void* stream;       // cudaStream_t
  int num_sms;
} PtRmsNormFwdParams;

typedef struct PtRmsNormBwdParams {
  int64_t rows, hidden;
  const void* dy;
  const void* x;
  const void* gamma;
  const float* rstd;
  void* dx;             // [rows, hidden], x's dtype
  void* dgamma;         // [hidden], gamma's dtype
  float* partials;      // [num_partials, hidden] fp32 workspace: one dgamma partial per block
  int64_t num_partials; // the backward's grid size; >= 1
  int zero_centered;
  void* stream;
  int num_sms;
} PtRmsNormBwdParams;

// Every module exports these. Return 0 on success; otherwise write a message into err.
typedef int (*PtJitAbiVersionFn)(void);
typedef int (*PtGemmRunFn)(const PtGemmParams* params, char* err, size_t err_len);
typedef int (*PtGemmWorkspaceFn)(const PtGemmParams* params, size_t* bytes, char* err,
                                 size_t err_len);
typedef int (*PtRmsNormFwdFn)(const PtRmsNormFwdParams* params, char* err, size_t err_len);
typedef int (*PtRmsNormBwdFn)(const PtRmsNormBwdParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
