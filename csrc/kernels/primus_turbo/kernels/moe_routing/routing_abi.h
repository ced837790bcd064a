// The C ABI between the core and the MoE routing JIT modules (kernels/moe_routing/routing.cuh).
// Kept beside the kernels so that only these modules hash it; the ABI version is jit_abi.h's.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// Group-limited top-k routing of one token per warp. logits [tokens, experts] (contiguous, the
// module's dtype). Writes scores (the aux-loss scores), probs (dense: zero off the chosen experts)
// in the logits' dtype and routing_map (uint8 0/1), all [tokens, experts] contiguous.
typedef struct PtRoutingFwdParams {
  const void* logits;
  void* scores;
  void* probs;
  uint8_t* routing_map;
  int64_t tokens;
  int32_t experts, topk, groups, selected_groups;
  int32_t softmax;  // 0: sigmoid, 1: softmax
  float scaling;
  void* stream;  // cudaStream_t
} PtRoutingFwdParams;

// Gradient wrt the logits of the forward above: grad_probs / grad_scores (each optional, null for
// zero; the logits' dtype, contiguous [tokens, experts]) -> grad_logits (the logits' dtype).
typedef struct PtRoutingBwdParams {
  const void* logits;
  const uint8_t* routing_map;
  const void* grad_probs;
  const void* grad_scores;
  void* grad_logits;
  int64_t tokens;
  int32_t experts, topk;
  int32_t softmax;
  float scaling;
  void* stream;
} PtRoutingBwdParams;

// indices [tokens, topk] (int32 / int64) and probs [tokens, topk] -> multihot [tokens, experts]
// (uint8 0/1) and probs_out [tokens, experts] (zero where not routed). Indices outside
// [0, experts) (-1: dropped) are skipped; for a repeated index the last position wins.
// Backward: grad_probs [tokens, topk] = grad_multihot_probs[t, indices[t, k]] at the winning
// positions, 0 elsewhere. Dtype codes: pt_dtype.
typedef struct PtMultihotParams {
  const void* indices;
  const void* probs;            // forward input
  uint8_t* multihot;            // forward output
  void* probs_out;              // forward output
  const void* grad_multihot;    // backward input (dtype probs_out_dtype)
  void* grad_probs;             // backward output (dtype probs_dtype)
  int64_t tokens;
  int32_t topk, experts;
  int32_t indices_dtype, probs_dtype, probs_out_dtype;
  void* stream;
} PtMultihotParams;

// mask[i] = i < sum(tokens_per_expert) for i in [0, num_tokens) (int64 0/1).
typedef struct PtTokensMaskParams {
  const void* tokens_per_expert;  // int32 / int64 [experts]
  int64_t* mask;
  int64_t experts, num_tokens;
  int32_t counts_dtype;
  void* stream;
} PtTokensMaskParams;

typedef int (*PtRoutingFwdFn)(const PtRoutingFwdParams* params, char* err, size_t err_len);
typedef int (*PtRoutingBwdFn)(const PtRoutingBwdParams* params, char* err, size_t err_len);
typedef int (*PtMultihotFn)(const PtMultihotParams* params, char* err, size_t err_len);
typedef int (*PtTokensMaskFn)(const PtTokensMaskParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
