/* Rotary position embedding (RoPE) of q and k in one launch; included by primus_turbo.h. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* Layouts of q / k: [batch, seq, heads, head_dim], [seq, batch, heads, head_dim], or packed
   variable-length sequences [tokens, heads, head_dim]. */
typedef enum pt_rope_layout {
  PT_ROPE_BSHD = 0,
  PT_ROPE_SBHD = 1,
  PT_ROPE_THD = 2,
} pt_rope_layout;

/* Rotates features [0, rotary_dim) of every head of q and k by position * theta^(-2j/rotary_dim)
   (pair j is (j, j + rotary_dim/2), or (2j, 2j+1) when interleaved) and copies the rest into
   q_out / k_out (contiguous, q's / k's shape and dtype). q and k: float32, float16 or bfloat16, any
   strides with a unit last stride; k may have another number of heads (GQA). rotary_dim: even,
   0 for head_dim.
   cos, sin: both null (computed from theta) or float32 [max_position, rotary_dim/2] tables;
   positions outside the table give NaN. positions: null (the index along the sequence, restarting
   at every cu_seqlens start for thd), or int32/int64 of shape [seq] (shared by the batch) or the
   token dimensions of q ([batch, seq], [seq, batch], [tokens]). cu_seqlens: int32 [num_seqs + 1],
   thd only. backward: applies the inverse rotation (q, k are then the output gradients). No host
   synchronization; CUDA-graph capturable. */
PT_API pt_status pt_rope(const pt_tensor* q, const pt_tensor* k, const pt_tensor* cos, const pt_tensor* sin,
                         const pt_tensor* positions, const pt_tensor* cu_seqlens, pt_tensor* q_out,
                         pt_tensor* k_out, int32_t rotary_dim, double theta, int32_t interleaved,
                         int32_t layout, int32_t backward, void* stream);
/* Compiles (or loads from the cache) one RoPE module for sm_90a without running it. Needs no GPU. */
PT_API pt_status pt_rope_prepare(int32_t dtype, int32_t vectorized, int32_t interleaved, int32_t table);

#ifdef __cplusplus
}
#endif
