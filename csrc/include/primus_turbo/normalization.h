// Primus-Turbo C API: RMSNorm fused with the residual add, and LayerNorm (RMSNorm itself is in
// primus_turbo.h). Same conventions: contiguous tensors, >= 1-D x whose leading dimensions are
// rows, last dimension (hidden) 1 to 65536, float32/float16/bfloat16 x, gamma (and beta) of x's
// dtype or float32, float32 statistics with one element per row, the current device and the
// given stream. Backward parameter gradients are reduced in a fixed order (bitwise reproducible).
#pragma once

#include "primus_turbo/primus_turbo.h"

#ifdef __cplusplus
extern "C" {
#endif

// s = x + residual (in x's dtype), written to residual_out; y = RMSNorm(s) as pt_rmsnorm_fwd.
PT_API pt_status pt_rmsnorm_residual_fwd(const pt_tensor* x, const pt_tensor* residual, const pt_tensor* gamma,
                                         pt_tensor* y, pt_tensor* residual_out, pt_tensor* rstd, float eps,
                                         int32_t zero_centered, void* stream);
// ds = RMSNorm backward at s (= residual_out of the forward) plus dsum, the gradient of residual_out
// (may be null: zero); dx receives ds, which is also the gradient of residual. Workspace as
// pt_rmsnorm_bwd (pt_rmsnorm_bwd_workspace_bytes).
PT_API pt_status pt_rmsnorm_residual_bwd(const pt_tensor* dy, const pt_tensor* dsum, const pt_tensor* residual_out,
                                         const pt_tensor* gamma, const pt_tensor* rstd, pt_tensor* dx,
                                         pt_tensor* dgamma, void* workspace, size_t workspace_bytes,
                                         int32_t zero_centered, void* stream);

// y = (x - mean) * rstd * gamma + beta, mean and rstd = 1 / sqrt(var + eps) per row (biased
// variance, two-pass). beta: like gamma.
PT_API pt_status pt_layernorm_fwd(const pt_tensor* x, const pt_tensor* gamma, const pt_tensor* beta, pt_tensor* y,
                                  pt_tensor* mean, pt_tensor* rstd, float eps, void* stream);
// dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)), g = gamma * dy, x_hat = (x - mean) * rstd;
// dgamma = sum of dy * x_hat, dbeta = sum of dy over rows. workspace: 16-byte aligned, at least
// pt_layernorm_bwd_workspace_bytes.
PT_API pt_status pt_layernorm_bwd(const pt_tensor* dy, const pt_tensor* x, const pt_tensor* gamma,
                                  const pt_tensor* mean, const pt_tensor* rstd, pt_tensor* dx, pt_tensor* dgamma,
                                  pt_tensor* dbeta, void* workspace, size_t workspace_bytes, void* stream);
PT_API size_t pt_layernorm_bwd_workspace_bytes(int64_t rows, int64_t hidden);

// Compiles (or loads from the cache) the sm_90a module of a normalization kind (0 rmsnorm,
// 1 rmsnorm_residual, 2 layernorm) that contiguous, 16-byte aligned tensors of this dtype pair and
// hidden size use, without running it. Needs no GPU.
PT_API pt_status pt_norm_prepare(int32_t kind, int32_t dtype, int32_t gamma_dtype, int64_t hidden);

#ifdef __cplusplus
}
#endif
