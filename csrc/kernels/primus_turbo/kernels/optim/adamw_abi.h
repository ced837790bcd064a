// The C ABI between the core and the fused AdamW module (kernels/optim/adamw.cuh). Kept beside the
// kernel so that only this module hashes it; the ABI version is jit_abi.h's.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// Tensors one launch updates (the core splits longer lists): their table travels in the kernel's
// parameters, so a launch needs no device-side setup.
#define PT_ADAMW_MAX_TENSORS 32
// Elements a CTA updates (256 threads, 8 each).
#define PT_ADAMW_BLOCK_ELEMS 2048
// The FP8 weight copy's scale blocks (fp8_dtype set): a CTA updates one 128 x 128 tile.
#define PT_ADAMW_FP8_TILE 128

typedef struct PtAdamWTensor {
  void* param;
  const void* grad;  // the param's dtype
  void* exp_avg;     // the launch's state dtype
  void* exp_avg_sq;
  float* amax;  // or null: receives max |param| after the update (atomic max; zeroed by the core)
  int64_t numel;
  int64_t first_block;  // CTAs of the launch before this tensor's
  int32_t vec;          // every pointer 16-byte aligned: 8 elements a thread in vector accesses
  // fp8_dtype set: the param seen as [rows, cols] (its last dim cols), and its FP8 copy written from
  // the updated values, q [rows, cols] with scale_inv [ceil(rows/128), ceil(cols/128)] (row-major),
  // one scale per 128 x 128 block, as the quantizer's 2-D blocks (pt_quantize, PT_QUANT_2D_BLOCK).
  void* q;
  float* scale_inv;
  int64_t rows, cols;
  // Optional: each matrix's transposed copy, the param seen as [rows / matrix_rows, matrix_rows,
  // cols] and qt [rows / matrix_rows, cols, matrix_rows] (the same block scales serve it), for a
  // backward GEMM that reduces over the rows. matrix_rows: rows, or a multiple of 128.
  void* qt;
  int64_t matrix_rows;
} PtAdamWTensor;

// AdamW (decoupled weight decay) as torch.optim.AdamW computes it, in float32, one rounding to
// the stored dtype per value:
//   p = p * decay; m = m + (g - m) * (1 - beta1); v = v * beta2 + (1 - beta2) * g * g
//   p = p - step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
// with decay = 1 - lr * weight_decay and step_size = lr / (1 - beta1^step).
typedef struct PtAdamWParams {
  PtAdamWTensor tensors[PT_ADAMW_MAX_TENSORS];
  int32_t count;
  int32_t param_dtype;  // pt_dtype: float32, float16 or bfloat16 (grads the same)
  int32_t state_dtype;  // the param's dtype or float32
  int32_t fp8_dtype;    // 0, or pt_dtype PT_FLOAT8_E4M3 / PT_FLOAT8_E5M2: every tensor gets its FP8 copy
  int64_t blocks;       // CTAs of the launch
  float decay, step_size, beta1, beta2, bias_correction2_sqrt, eps;
  void* stream;  // cudaStream_t
} PtAdamWParams;

typedef int (*PtAdamWFn)(const PtAdamWParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}

#define PT_JIT_EXPORT_ADAMW(Kernel)                                                                     \
  PT_JIT_EXPORT_ABI_VERSION                                                                             \
  extern "C" __attribute__((visibility("default"))) int pt_adamw_run(const PtAdamWParams* params, char* err, \
                                                                     size_t err_len) {                  \
    return Kernel::run(params, err, err_len);                                                           \
  }
#endif
