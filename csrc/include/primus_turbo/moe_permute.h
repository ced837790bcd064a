/* MoE token permutation by a routing mask; included by primus_turbo.h. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* Groups token copies by expert: output row r holds a token routed to an expert, experts in order,
   tokens in order within an expert; rows past the routed total (or all of them past
   output.shape[0], which drops the excess) are zero. tokens [T, H] and output [N, H]: float32,
   float16 or bfloat16. routing_map [T, E] bool/uint8 or int32 (non-zero: routed), E <= 1024;
   row_id_map [T, E] int32 receives each copy's row or -1; workspace int32
   [pt_moe_route_workspace_ints(T, E)]. probs [T, E]
   and permuted_probs [N] (float32/float16/bfloat16), optional together: permuted_probs[r] is the
   probability of row r. With routing_map null, row_id_map is read instead: without a workspace only
   the referenced rows are written; with one (same size) the rows the map does not reference are
   zeroed too. No host synchronization. */
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
   grad_probs[t, e] = <grad_output[t], fwd_input[row]> (0 where not routed). With a workspace
   (int32 [pt_moe_route_workspace_ints(T, E)]) the rows past the highest one the map references are
   zeroed (a map pt_moe_permute built references rows 0..n-1 with no gaps); without one (null) they
   are not written. */
PT_API pt_status pt_moe_unpermute_bwd(const pt_tensor* grad_output, const pt_tensor* fwd_input,
                                      const pt_tensor* row_id_map, const pt_tensor* merging_probs,
                                      pt_tensor* grad_input, pt_tensor* grad_probs, pt_tensor* workspace,
                                      void* stream);
/* ---- index-based permutation (moe_permute / moe_unpermute): a compact map [T + P, 2E + 1] ----
   Row t < T lists token t's n routes in expert order (entries [0, n): row + 1; [E, E + n): the
   probability column; entry 2E: n); rows T + i list the i-th zero padding row of each expert that
   has one (-(row + 1), expert). */
/* int32 elements of the builder's workspace for T tokens and E experts. */
PT_API int64_t pt_moe_route_workspace_ints(int64_t num_tokens, int32_t num_experts);
/* Builds the compact map from expert_map: a [T, E] bool/uint8 routing map or [T, K] int32/int64
   expert indices (values outside [0, E) are no route; a repeated expert counts once). Expert
   blocks are padded to a multiple of align; slots at or past capacity (< 0: none) are dropped
   (overflow_flag = 1). row_id_map [T + P, 2E + 1]; probs_topk: the probability column is the k of
   the index instead of the expert. tokens_per_expert int64 [E] (rows of each block within
   capacity), overflow_flag and num_dispatched (tokens with a route) int32 [1]: each optional.
   Three launches, no host synchronization. */
PT_API pt_status pt_moe_route_build(const pt_tensor* expert_map, int32_t num_experts, int32_t align, int64_t capacity,
                                    int32_t probs_topk, pt_tensor* row_id_map, pt_tensor* workspace,
                                    pt_tensor* tokens_per_expert, pt_tensor* overflow_flag, pt_tensor* num_dispatched,
                                    void* stream);
/* dst[row] = src[t] for every route of token t (dst_probs[row] = src_probs[t, column],
   dst_scales[row] = src_scales[t]); padding rows and rows [rows_in_use[0], M) become zero.
   count_rows: rows_in_use[0] is first set to the slots the map lists. Tokens of any row dtype
   (1-byte ones need 16-byte rows). */
PT_API pt_status pt_moe_rows_scatter(const pt_tensor* src, const pt_tensor* row_id_map, int32_t num_experts,
                                     const pt_tensor* src_probs, const pt_tensor* src_scales, pt_tensor* rows_in_use,
                                     int32_t count_rows, pt_tensor* dst, pt_tensor* dst_probs, pt_tensor* dst_scales,
                                     void* stream);
/* dst[t] = sum of src[row] over token t's routes (fp32, expert order); dst_probs[t, column] =
   src_probs[row], zero elsewhere. float32, float16 or bfloat16. */
PT_API pt_status pt_moe_rows_gather(const pt_tensor* src, const pt_tensor* row_id_map, int32_t num_experts,
                                    const pt_tensor* src_probs, pt_tensor* dst, pt_tensor* dst_probs, void* stream);
/* Compiles (or loads) the sm_90a module of a token dtype without running it. Needs no GPU. */
PT_API pt_status pt_moe_permute_prepare(int32_t dtype, int32_t vectorized);

#ifdef __cplusplus
}
#endif
