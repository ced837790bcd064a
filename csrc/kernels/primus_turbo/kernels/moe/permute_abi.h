// The C ABI between the core and a MoE token permutation JIT module (kernels/moe/permute.cuh).
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// Token-major routing of T tokens over E experts. row_id_map[t, e] is the row of the permuted
// tensor that holds token t's copy for expert e, or -1 (not routed, or dropped past num_out).
// Permuted rows are grouped by expert in expert order, tokens in token order within an expert.
typedef struct PtMoePermuteParams {
  int64_t num_tokens;    // T
  int32_t num_experts;   // E
  int64_t hidden;        // H
  int64_t num_out;       // rows of the permuted tensor
  const void* routing_map;   // [T, E], elements of routing_map_bytes (1: bool/uint8, 4: int32)
  int32_t routing_map_bytes;
  int32_t* row_id_map;       // [T, E] int32
  int32_t* workspace;        // [2 * E + 1] int32: counts, offsets, total
  const void* input;         // [T, H] (permute) or [num_out, H] (unpermute)
  void* output;              // [num_out, H] (permute) or [T, H] (unpermute)
  const void* probs;         // [T, E] (permute: gathered into permuted_probs; unpermute: merged), or null
  void* permuted_probs;      // [num_out] (permute), or null
  int32_t probs_dtype;       // pt_dtype of probs / permuted_probs
  // unpermute backward with merging probs:
  const void* grad_output;   // [T, H]
  const void* fwd_input;     // [num_out, H]: the permuted tensor the forward merged
  void* grad_probs;          // [T, E], probs_dtype
  void* stream;
  int num_sms;
} PtMoePermuteParams;

// build_map: counts, offsets and row_id_map from routing_map (three launches).
// permute: output[row_id_map[t, e]] = input[t] (+ permuted_probs), rows past the routed total zeroed.
// unpermute: output[t] = sum_e probs[t, e] * input[row_id_map[t, e]] (fp32 sum in expert order;
//   without probs a plain sum); with permuted_probs given as input it also gathers
//   grad_probs[t, e] = permuted_probs[row] (the permute's probs gradient).
// unpermute_bwd: output[row] = grad_output[t] * probs[t, e], grad_probs[t, e] = <grad_output[t], fwd_input[row]>.
typedef int (*PtMoePermuteFn)(const PtMoePermuteParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
