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
  int32_t* workspace;        // pt_moe_route_workspace_ints(T, E) int32 (see PtMoeRouteParams)
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
// permute: output[row_id_map[t, e]] = input[t] (+ permuted_probs), rows past the routed total zeroed
//   (after build_map; on a given map, routing_map null, num_out > 0 and a workspace: the rows past
//   the largest the map references).
// unpermute: output[t] = sum_e probs[t, e] * input[row_id_map[t, e]] (fp32 sum in expert order;
//   without probs a plain sum); with permuted_probs given as input it also gathers
//   grad_probs[t, e] = permuted_probs[row] (the permute's probs gradient).
// unpermute_bwd: output[row] = grad_output[t] * probs[t, e], grad_probs[t, e] = <grad_output[t], fwd_input[row]>.
typedef int (*PtMoePermuteFn)(const PtMoePermuteParams* params, char* err, size_t err_len);


// ---- index-based permutation (moe_permute / moe_unpermute) --------------------------------------
//
// One routing-map builder serves both map formats. The routing is a [T, E] mask (bool/uint8 or
// int32, non-zero: routed) or [T, K] expert indices (int32/int64; values outside [0, E) are no
// route, a repeated expert counts once). Expert e's rows form one block of the permuted tensor,
// blocks in expert order, tokens in token order within a block, each block padded with zero rows
// to a multiple of `align`; slots at or past `capacity` are dropped.
//   dense map   [T, E]: row of token t's copy for expert e, or -1 (token_permute).
//   compact map [T + P, 2E + 1]: row t < T lists token t's n routes in expert order: entries
//     [0, n) hold row + 1, entries [E, E + n) the probability column (e, or k of the first
//     topk_idx[t, k] == e when probs_topk), entry 2E holds n. Rows T + i (i < P) list the i-th
//     padding row of every expert that has one: -(row + 1), expert, count (moe_permute).
typedef struct PtMoeRouteParams {
  int64_t num_tokens;       // T: token rows of the map
  int32_t num_experts;      // E
  int32_t routing_kind;     // 0: uint8 mask, 1: int32 mask, 2: int32 indices, 3: int64 indices
  const void* routing;
  int32_t topk;             // K (index kinds)
  int32_t align;            // >= 1
  int64_t capacity;         // rows of the permuted tensor; < 0: unlimited
  int32_t pad_rows;         // P (compact)
  int32_t probs_topk;       // compact: the probability column is k instead of e
  int32_t compact;
  int32_t* row_id_map;
  int32_t* workspace;       // pt_moe_route_workspace_ints(T, E)
  int64_t* tokens_per_expert;  // [E] rows of each expert's block within capacity, or null
  int32_t* overflow_flag;      // [1] 1 when slots were dropped, or null
  int32_t* num_dispatched;     // [1] tokens with at least one route, or null
  // Row movement over a compact map (scatter: token t -> its rows, padding and unused rows zero;
  // gather: token t <- fp32 sum of its rows in expert order).
  int64_t row_units;        // units (16-byte vectors or elements) per row
  int64_t num_rows;         // M: rows of the permuted tensor
  int64_t num_out_tokens;   // gather: token rows written (<= T)
  const void* src;
  void* dst;
  const void* src_probs;    // scatter: [T, W]; gather: [M]
  void* dst_probs;          // scatter: [M]; gather: [T, W]
  int32_t probs_width;      // W
  int32_t probs_dtype;      // pt_dtype (float32, float16, bfloat16)
  const float* src_scales;  // scatter: [T, S]
  float* dst_scales;        // scatter: [M, S]
  int32_t scales_per_row;   // S
  int32_t* rows_in_use;     // scatter: rows [*rows_in_use, M) are zeroed
  int32_t count_rows;       // scatter: first set *rows_in_use to the slots the map lists
  void* stream;
  int num_sms;
} PtMoeRouteParams;

typedef int (*PtMoeRouteFn)(const PtMoeRouteParams* params, char* err, size_t err_len);

// Workspace of the builder (int32 elements), tiles of 256 tokens: per (tile, expert) counts then
// prefixes, per-tile routed-token counts, per-expert offsets / real counts / padded counts, and
// three scalars: rows in use (min(padded total, capacity)), padded total, routed tokens.
#define PT_MOE_ROUTE_TILE 256
#ifdef __CUDACC__
#define PT_MOE_HD __host__ __device__
#else
#define PT_MOE_HD
#endif
PT_MOE_HD static inline int64_t pt_moe_route_tiles(int64_t tokens) { return (tokens + PT_MOE_ROUTE_TILE - 1) / PT_MOE_ROUTE_TILE; }
PT_MOE_HD static inline int64_t pt_moe_route_ws_tile_dispatched(int64_t tokens, int32_t experts) {
  return pt_moe_route_tiles(tokens) * experts;
}
PT_MOE_HD static inline int64_t pt_moe_route_ws_offsets(int64_t tokens, int32_t experts) {
  return pt_moe_route_tiles(tokens) * (experts + 1);
}
PT_MOE_HD static inline int64_t pt_moe_route_ws_scalars(int64_t tokens, int32_t experts) {
  return pt_moe_route_ws_offsets(tokens, experts) + 3 * (int64_t)experts;
}
PT_MOE_HD static inline int64_t pt_moe_route_ws_ints(int64_t tokens, int32_t experts) {
  return pt_moe_route_ws_scalars(tokens, experts) + 3;
}

#ifdef __cplusplus
}
#endif
