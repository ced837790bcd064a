// Primus-Turbo C API: gated activations (SwiGLU, GeGLU), with the MoE variant's routing
// probabilities and row mask fused in.
//
// x: contiguous, >= 1-D, float32/float16/bfloat16, last dimension 2 * cols = [gate | up]; every
// leading dimension is a row. act: 0 SiLU (SwiGLU), 1 exact erf GELU (GeGLU).
// out = act(gate) * up * probs[row]; probs: float32 with one element per row, or null (1).
// row_mask: int64 with one element per row, or null; rows where it is 0 give zeros (inputs unread).
// Runs on the current device and the given stream.
#pragma once

#include "primus_turbo/primus_turbo.h"

#ifdef __cplusplus
extern "C" {
#endif

// out: x's shape with the last dimension halved, x's dtype. amax (float32, one element, or null):
// set to max |out| over the written (rounded) values, for a tensorwise FP8 quantization of out that
// then skips its own amax pass (pt_quantize_job.amax).
PT_API pt_status pt_gated_act_fwd(int32_t act, const pt_tensor* x, const pt_tensor* probs,
                                  const pt_tensor* row_mask, pt_tensor* out, pt_tensor* amax, void* stream);
// dx (like x) = [dy * p * up * act'(gate) | dy * p * act(gate)]; dprobs (float32 per row, or null)
// = sum over the row of dy * act(gate) * up. Masked rows: zeros. amax: as the forward's, of dx.
PT_API pt_status pt_gated_act_bwd(int32_t act, const pt_tensor* dy, const pt_tensor* x, const pt_tensor* probs,
                                  const pt_tensor* row_mask, pt_tensor* dx, pt_tensor* dprobs, pt_tensor* amax,
                                  void* stream);
// Compiles (or loads from the cache) the sm_90a module contiguous, aligned tensors of this dtype
// and cols use, without running it. Needs no GPU.
PT_API pt_status pt_gated_act_prepare(int32_t act, int32_t dtype, int64_t cols);

#ifdef __cplusplus
}
#endif
