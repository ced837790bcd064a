// The binary contract between the core library and a just-in-time compiled kernel module.
//
// A JIT module is a shared object built from a few generated lines that instantiate one kernel
// template. It exports plain C functions whose arguments are the structs below, so the core never
// needs the kernel's C++ types and a module built by one version of the core is rejected (by
// PT_JIT_ABI_VERSION) rather than misread by another.
#pragma once

#include <stddef.h>
#include <stdint.h>

#define PT_JIT_ABI_VERSION 3

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

// RMSNorm / LayerNorm over the last dimension of a contiguous [rows, hidden] tensor, optionally
// fused with a residual add (see kernels/normalization/norm.cuh). Dtypes, the norm kind, the
// residual fusion and vectorization are compile-time parts of the module; pointers a module does
// not use are ignored.
typedef struct PtNormFwdParams {
  int64_t rows, hidden;
  const void* x;        // [rows, hidden]
  const void* residual; // [rows, hidden], x's dtype (residual modules)
  const void* gamma;    // [hidden]
  const void* beta;     // [hidden], gamma's dtype (LayerNorm)
  void* y;              // [rows, hidden], x's dtype
  void* residual_out;   // [rows, hidden]: x + residual (residual modules)
  float* rstd;          // [rows], kept for the backward
  float* mean;          // [rows] (LayerNorm)
  float eps;
  int zero_centered;    // the weight is 1 + gamma
  void* stream;         // cudaStream_t
  int num_sms;
  // FP8 modules (quantization/fused_fp8.cuh): y quantized, [rows, hidden] FP8, and its float32
  // scale_inv ([rows] rowwise, [rows, ceil(hidden / 128)] 1x128); y may then be null.
  void* q;
  float* q_scale_inv;
} PtNormFwdParams;

typedef struct PtNormBwdParams {
  int64_t rows, hidden;
  const void* dy;
  const void* x;        // the normalized input (x + residual for residual modules)
  const void* gamma;
  const float* rstd;
  const float* mean;    // LayerNorm
  const void* dsum;     // residual modules: gradient of the residual_out output, added to dx; may be null
  void* dx;             // [rows, hidden], x's dtype
  void* dgamma;         // [hidden], gamma's dtype
  void* dbeta;          // [hidden], gamma's dtype (LayerNorm)
  float* partials;      // fp32 workspace: [1 or 2 (LayerNorm), num_partials, hidden]
  int64_t num_partials; // the backward's grid size; >= 1
  int zero_centered;
  void* stream;
  int num_sms;
} PtNormBwdParams;

// Gated activations over [rows, 2 * cols] -> [rows, cols] (see kernels/activation/gated.cuh):
// out = act(x[:, :cols]) * x[:, cols:] * probs[row], rows with row_mask[row] == 0 give zeros.
typedef struct PtGatedActParams {
  int64_t rows, cols;
  const void* x;         // [rows, 2 * cols]
  const float* probs;    // [rows] or null (then 1)
  const int64_t* row_mask; // [rows] or null (then every row)
  const void* dy;        // backward: [rows, cols]
  void* out;             // forward: [rows, cols]; backward: dx [rows, 2 * cols]
  float* dprobs;         // backward: [rows] or null
  void* stream;
  int num_sms;
  // FP8 forward modules: out quantized, [rows, cols] FP8, and its float32 scale_inv ([rows]
  // rowwise, [rows, ceil(cols / 128)] 1x128); out may then be null.
  void* q;
  float* q_scale_inv;
  // Plain modules: max |out| (forward) or max |dx| (backward) of the rounded outputs, merged with
  // atomic max into a float the caller zeroed (null: not wanted). A tensorwise FP8 quantization of
  // the output then needs no amax pass of its own.
  float* amax;
} PtGatedActParams;

// Every module exports these. Return 0 on success; otherwise write a message into err.
typedef int (*PtJitAbiVersionFn)(void);
typedef int (*PtGemmRunFn)(const PtGemmParams* params, char* err, size_t err_len);
typedef int (*PtGemmWorkspaceFn)(const PtGemmParams* params, size_t* bytes, char* err,
                                 size_t err_len);
typedef int (*PtNormFwdFn)(const PtNormFwdParams* params, char* err, size_t err_len);
typedef int (*PtNormBwdFn)(const PtNormBwdParams* params, char* err, size_t err_len);
typedef int (*PtGatedActFn)(const PtGatedActParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
