// The C ABI between the core and an FP8 attention JIT module
// (kernels/attention/attn_fwd_fp8_sm90.cuh). Kept apart from attention_abi.h's function type so
// that the 16-bit modules' keys do not depend on it; the ABI version is jit_abi.h's.
#pragma once

#include "primus_turbo/kernels/attention/attention_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// Rows of a sequence are cut into tiles of 128 (the kernel's query and key blocks); tile nb of
// sequence b, whose first token is `first` (cu_seqlens[b], or b * seqlen for fixed length), has the
// index b + first / 128 + nb. Distinct sequences never share an index, and batch + ceil(tokens /
// 128) indices cover every tile (tokens: total_q / total_k, or batch * seqlen).
#define PT_ATTN_FP8_TILE_ROWS 128

// One FP8 forward: `base` is the 16-bit problem (q, k, v, out, lse, sink, offsets, shapes, strides,
// scale, window, stream). The module quantizes k and v into the workspace below, one E4M3 tile per
// (tile index, head) in the byte image the kernel's shared memory wants (wgmma's swizzled, K-major
// layout; V transposed so that keys run along its rows), each 64-row half with the float32 scale
// that dequantizes it, then runs the forward on the tiles; each forward CTA quantizes its own
// query tile (read by that CTA alone) in shared memory, with the same rule.
typedef struct PtAttnFp8Params {
  PtAttnParams base;
  // K_TILES below: the tile indices of k's tokens (batch + ceil(tokens / 128)).
  void* k_tiles;   // [K_TILES, heads_kv][128 x head_dim], 1024-byte aligned
  void* vt_tiles;  // [K_TILES, heads_kv][head_dim_v x 128]
  float* k_scale;  // [K_TILES, heads_kv, 2]: one scale per 64 rows
  float* v_scale;  // [K_TILES, heads_kv, 2]
  // 16-bit copies of the dequantized q, k, v (what the forward computes with, so what the backward
  // differentiates), contiguous [tokens, heads, head dim] (fixed length: batch * seqlen tokens);
  // each may be null. Tokens outside every sequence are not written.
  void* q_deq;
  void* k_deq;
  void* v_deq;
  int32_t scale_rows;  // 64 or 128: rows that share one amax (128: both halves get the same scale)
} PtAttnFp8Params;

typedef int (*PtAttnFp8Fn)(const PtAttnFp8Params* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
