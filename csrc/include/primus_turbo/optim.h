/* Optimizer steps fused into one pass over each parameter's tensors. */
#pragma once

#include "primus_turbo/primus_turbo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One step of AdamW with decoupled weight decay, as torch.optim.AdamW (amsgrad and maximize off):
     p = p * (1 - lr * weight_decay)
     m = m + (g - m) * (1 - beta1);  v = v * beta2 + (1 - beta2) * g^2
     p = p - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
   for `count` parameters at the same step (>= 1, the step after this update's increment). params,
   grads, exp_avgs, exp_avg_sqs: arrays of `count` contiguous tensors, each param's four the same
   shape; every param float32, float16 or bfloat16 (all the same), its grad the same dtype, the
   moments all of one dtype: the params' or float32. Updated in place, float32 arithmetic, one
   rounding per stored value. amax: null, or `count` floats on the device that receive max |param|
   after the update (the value as stored; the call zeroes them first), e.g. for a tensorwise FP8
   quantization of the new weight without another read of it. One launch per 32 tensors; no host
   synchronization. */
typedef struct pt_adamw_config {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
} pt_adamw_config;

PT_API pt_status pt_adamw_step(const pt_tensor* params, const pt_tensor* grads, const pt_tensor* exp_avgs,
                               const pt_tensor* exp_avg_sqs, int32_t count, const pt_adamw_config* config,
                               float* amax, void* stream);
/* pt_adamw_step (no amax) that also writes each updated param's FP8 copy in 128 x 128 blocks: the
   param seen as [rows, cols] (cols its last dim), qdata[i] the param's shape in float8_e4m3fn or
   float8_e5m2 (every qdata the same), scale_inv[i] float32 with ceil(rows/128) * ceil(cols/128)
   elements, row-major: the copy pt_quantize makes of the updated param with PT_QUANT_2D_BLOCK (the
   same codes and scales, bit for bit), from the values the update holds instead of another read.
   qdata_t: null, or an array whose entry i (data null: none) receives each matrix's transposed
   copy: params[i] seen as [..., rows, cols] (2-D or more; the matrix's rows one, or a multiple of
   128), qdata_t[i] [..., cols, rows] in the same FP8 dtype, read with the same block scales
   transposed (what a backward GEMM reducing over the rows reads). */
PT_API pt_status pt_adamw_step_fp8_blocks(const pt_tensor* params, const pt_tensor* grads, const pt_tensor* exp_avgs,
                                          const pt_tensor* exp_avg_sqs, int32_t count, const pt_adamw_config* config,
                                          pt_tensor* qdata, pt_tensor* scale_inv, pt_tensor* qdata_t, void* stream);
/* Compiles (or loads from the cache) the fused AdamW module without running it. Needs no GPU. */
PT_API pt_status pt_adamw_prepare(void);

#ifdef __cplusplus
}
#endif
