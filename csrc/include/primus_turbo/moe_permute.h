/* MoE token permutation by a routing mask; included by primus_turbo.h. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* Groups token copies by expert: output row r holds a token routed to an expert, experts in order,
   tokens in order within an expert; rows past the routed total (or all of them past
   output.shape[0], which drops the excess) are zero. tokens [T, H] and output [N, H]: float32,
   float16 or bfloat16. routing_map [T, E] bool/uint8 or int32 (non-zero: routed), E <= 1024;
   row_id_map [T, E] int32 receives each copy's row or -1; workspace int32 [2E + 1]. probs [T, E]
   and permuted_probs [N] (float32/float16/bfloat16), optional together: permuted_probs[r] is the
   probability of row r. With routing_map null, row_id_map is read instead and only the referenced
   rows are written. No host synchronization. */
PT_API pt_status pt_moe_permute(const pt_tensor* tokens, const pt_tensor* routing_map, const pt_tensor* probs,
                                pt_tensor* output, pt_tensor* permuted_probs, pt_tensor* row_id_map,
                                pt_tensor* workspace, void* stream);
/* output[t] = sum over experts e with row_id_map[t, e] >= 0 of (merging_probs[t, e] *)
   input[row_id_map[t, e]], summed in fp32 in expert order. permuted_probs [N] with probs_grad
   [T, E] (optional, not with merging_probs): probs_grad[t, e] = permuted_probs[row], 0 where not
   routed (the gradient of the permute's probs). */
PT_API pt_status pt_moe_unpermute(const pt_tensor* input, const pt_tensor* row_id_map, const pt_tensor* merging_probs,
                                  pt_tensor* output, const pt_tensor* permuted_probs, pt_tensor* probs_grad,
                                  void* stream);
/* Backward of the merging unpermute: grad_input[row] = grad_output[t] * merging_probs[t, e],
   grad_probs[t, e] = <grad_output[t], fwd_input[row]> (0 where not routed). Rows of grad_input no
   token references are not written. */
PT_API pt_status pt_moe_unpermute_bwd(const pt_tensor* grad_output, const pt_tensor* fwd_input,
                                      const pt_tensor* row_id_map, const pt_tensor* merging_probs,
                                      pt_tensor* grad_input, pt_tensor* grad_probs, void* stream);
/* Compiles (or loads) the sm_90a module of a token dtype without running it. Needs no GPU. */
PT_API pt_status pt_moe_permute_prepare(int32_t dtype, int32_t vectorized);

#ifdef __cplusplus
}
#endif
