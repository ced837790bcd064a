// The C ABI between the core and a RoPE JIT module (kernels/rope/rope.cuh). Kept beside the kernel
// rather than in jit_abi.h so that only RoPE modules hash it; the ABI version is jit_abi.h's.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// Where a token's rotary position comes from.
enum PtRopePositionMode {
  PT_ROPE_POS_INDEX = 0,       // its index along the sequence dimension (i0 or i1, see seq_dim)
  PT_ROPE_POS_SHARED = 1,      // positions[index along the sequence dimension]: one row for the batch
  PT_ROPE_POS_PER_TOKEN = 2,   // positions[t], t = i0 * n1 + i1
  PT_ROPE_POS_CU_SEQLENS = 3,  // t - cu_seqlens[s] for the packed sequence s holding t (n0 == 1)
};

// Rotates the first rotary_dim features of every head of q and k (or, with backward set, applies
// the inverse rotation to their gradients) and copies the rest. Token t = i0 * n1 + i1 of q is read
// at q + i0 * q_stride0 + i1 * q_stride1 + head * q_stride_h (unit stride along the head dimension)
// and written to q_out + (t * heads_q + head) * head_dim (contiguous); the same for k. The dtype,
// the vector width, the layout of the rotated pairs and the cos/sin source are compile-time parts
// of the module.
typedef struct PtRopeParams {
  const void* q;
  const void* k;
  void* q_out;
  void* k_out;
  int64_t n0, n1;
  int64_t q_stride0, q_stride1, q_stride_h;
  int64_t k_stride0, k_stride1, k_stride_h;
  int32_t heads_q, heads_k, head_dim, rotary_dim;
  const float* cos;       // [table_len, rotary_dim / 2], or null when computed from theta
  const float* sin;
  int64_t table_len;      // positions outside [0, table_len) produce NaN (no host synchronization)
  double log2_theta;      // inverse frequency j: theta^(-2j / rotary_dim)
  const void* positions;  // int32 or int64 (positions_int64), see pos_mode
  int32_t positions_int64;
  int32_t pos_mode;       // PtRopePositionMode
  int32_t seq_dim;        // 0: the position index is i0 (sbhd), 1: i1 (bshd, thd)
  const int32_t* cu_seqlens;  // [num_seqs + 1], nondecreasing, from 0
  int64_t num_seqs;
  int32_t backward;       // rotate by -angle (the gradient of the forward rotation)
  int32_t tokens_per_block;  // tokens of one thread block (1 to 64), chosen by the core
  void* stream;           // cudaStream_t
} PtRopeParams;

typedef int (*PtRopeFn)(const PtRopeParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
