/* MoE routing: group-limited top-k routing with aux-loss scores, indices <-> multihot, and the
   token mask of a tokens-per-expert count; included by primus_turbo.h. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* Routing of logits [tokens, experts] (float32, float16 or bfloat16, contiguous, experts <= 1024):
   s = sigmoid(logits) (softmax = 0) or softmax over the experts (softmax = 1), in fp32. With
   groups > 1 the experts form `groups` contiguous groups (groups <= 64, dividing experts); a
   group's score is the sum of its top (topk / selected_groups) values of s, and only the experts
   of the best `selected_groups` groups can be chosen. The topk largest eligible s are chosen
   (ties: the lower expert / group index). Outputs, all [tokens, experts] contiguous:
   scores (logits' dtype): the aux-loss scores, softmax: s; sigmoid: s / (sum s + 1e-20) when
   topk > 1, else s. probs (logits' dtype): zero off the chosen experts; softmax: s * scaling;
   sigmoid: s / (sum of the chosen s + 1e-20) * scaling when topk > 1, else s * scaling.
   routing_map (uint8): 1 on the chosen experts. Requires 1 <= selected_groups <= groups,
   selected_groups <= topk <= selected_groups * experts / groups. No host synchronization. */
PT_API pt_status pt_moe_routing_fwd(const pt_tensor* logits, pt_tensor* scores, pt_tensor* probs,
                                    pt_tensor* routing_map, int32_t topk, int32_t groups,
                                    int32_t selected_groups, int32_t softmax, float scaling, void* stream);
/* Gradient wrt the logits of pt_moe_routing_fwd given the gradients of probs and scores (either may be
   null: zero). logits, grad_probs, grad_scores, grad_logits: the logits' dtype and shape;
   routing_map: the forward's uint8 map. */
PT_API pt_status pt_moe_routing_bwd(const pt_tensor* logits, const pt_tensor* routing_map,
                                    const pt_tensor* grad_probs, const pt_tensor* grad_scores,
                                    pt_tensor* grad_logits, int32_t topk, int32_t softmax, float scaling,
                                    void* stream);
/* indices [tokens, topk] int32/int64 and probs [tokens, topk] (float) -> multihot [tokens, experts]
   uint8 and probs_out [tokens, experts] (float32, or probs' dtype). Indices outside [0, experts)
   (-1 marks a dropped route) are skipped; a repeated index takes the last position's prob. */
PT_API pt_status pt_indices_to_multihot_fwd(const pt_tensor* indices, const pt_tensor* probs,
                                            pt_tensor* multihot, pt_tensor* probs_out, void* stream);
/* grad_probs [tokens, topk] (probs' dtype) = grad_probs_out[t, indices[t, k]] at the positions
   the forward used, 0 elsewhere. */
PT_API pt_status pt_indices_to_multihot_bwd(const pt_tensor* indices, const pt_tensor* grad_probs_out,
                                            pt_tensor* grad_probs, void* stream);
/* mask [num_tokens] int64: 1 for i < sum(tokens_per_expert) (int32/int64 [experts]), else 0. */
PT_API pt_status pt_tokens_per_expert_to_mask(const pt_tensor* tokens_per_expert, pt_tensor* mask, void* stream);
/* Compiles (or loads from the cache) the routing module of a logits dtype (dtype >= 0) or, with
   dtype -1, the helpers' module, for sm_90a, without running it. Needs no GPU. */
PT_API pt_status pt_moe_routing_prepare(int32_t dtype);

#ifdef __cplusplus
}
#endif
