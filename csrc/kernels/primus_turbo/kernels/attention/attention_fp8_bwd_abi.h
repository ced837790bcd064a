// The C ABI between the core and an FP8 attention backward JIT module
// (kernels/attention/attn_bwd_fp8_sm90.cuh). A header of its own so that the forward modules' keys
// do not depend on it; the ABI version is jit_abi.h's.
#pragma once

#include "primus_turbo/kernels/attention/attention_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// The backward quantizes in tiles of 64 rows (a query block of the dK/dV kernel, a key block of the
// dQ kernel). Tile nb of sequence b, whose first token is `first`, has the index
// b + first / 64 + nb (as attention_fp8_abi.h's 128-row tiles): batch + ceil(tokens / 64) indices.
#define PT_ATTN_FP8_BWD_TILE_ROWS 64

// One FP8 backward: `base` is the 16-bit backward problem on the dequantized q, k, v the forward
// computed with (so re-quantizing them reproduces the forward's bytes), with dout, out, lse, delta
// and the gradients. The module computes delta, quantizes q, dout, k and v into the workspace below
// (one E4M3 image per (tile index, head); "^T" images hold the tile transposed, its 64 rows in the
// register order of an 8-bit wgmma A operand), then runs the dK/dV and dQ kernels on them.
typedef struct PtAttnFp8BwdParams {
  PtAttnParams base;
  // Q_TILES / K_TILES: tile indices of q's / k's tokens (batch + ceil(tokens / 64)). 1024-byte aligned.
  void* q_tiles;    // [Q_TILES, heads_q][64 x head_dim]
  void* qt_tiles;   // [Q_TILES, heads_q][head_dim x 64]
  void* do_tiles;   // [Q_TILES, heads_q][64 x head_dim_v]
  void* dot_tiles;  // [Q_TILES, heads_q][head_dim_v x 64]
  void* k_tiles;    // [K_TILES, heads_kv][64 x head_dim]
  void* kt_tiles;   // [K_TILES, heads_kv][head_dim x 64]
  void* v_tiles;    // [K_TILES, heads_kv][64 x head_dim_v]
  float* q_scale;   // [Q_TILES, heads_q]: the float32 scale that dequantizes a tile
  float* do_scale;  // [Q_TILES, heads_q]
  float* k_scale;   // [K_TILES, heads_kv]
  float* v_scale;   // [K_TILES, heads_kv]
  float* lse2_tiles;   // [Q_TILES, heads_q][64]: lse in log2 units, +inf past the sequence
  float* delta_tiles;  // [Q_TILES, heads_q][64]: delta, 0 past the sequence
} PtAttnFp8BwdParams;

typedef int (*PtAttnFp8BwdFn)(const PtAttnFp8BwdParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
