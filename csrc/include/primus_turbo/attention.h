/* Flash attention, forward and backward, on the library's own kernel (PT_BACKEND_TURBO) or on
   cuDNN's (PT_BACKEND_CUDNN); included by primus_turbo.h. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* softmax(scale * q k^T [+ sink]) v over the visible keys, per query head; GQA/MQA when q has a
   multiple of k's heads.
   Fixed length (cu_seqlens_q/k null): q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv];
   out [B, Sq, Hq, Dv] and lse float32 [B, Hq, Sq] contiguous.
   Packed (cu_seqlens_q/k int32 [B + 1] on the device): q [Tq, Hq, D], k [Tk, Hkv, D],
   v [Tk, Hkv, Dv]; out [Tq, Hq, Dv], lse [Hq, Tq]; max_seqlen_q/k bound the lengths (tokens of a
   longer sequence past the bound are not computed); tokens outside every sequence get zeros.
   q, k, v: bfloat16 or float16, any strides with a unit last stride, 16-byte aligned rows.
   (D, Dv): (64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256).
   Key j is visible from query i iff i + Sk - Sq - window_left <= j <= i + Sk - Sq + window_right
   (per sequence; -1: unbounded side; causal is window_right = 0). sink: null or float32 [Hq]
   logits joining each row's softmax denominator. lse: the natural log of the denominator, +inf for
   a row that sees nothing (its output is 0). No host synchronization; CUDA-graph capturable.
   backend: PT_BACKEND_TURBO, PT_BACKEND_CUDNN, or PT_BACKEND_NONE for cuDNN where it runs the
   problem (fixed length, every row sees a key, libcudnn 9.10+ loadable; not a deterministic
   backward) and TURBO elsewhere; an explicit CUDNN it cannot honour is PT_ERROR_NOT_SUPPORTED with
   the reason. The first CUDNN call of a shape builds its graph on the host: not under capture.
   Workspace: *workspace_needed receives the bytes of device memory the chosen backend needs; the
   call runs only when that fits in workspace_bytes, so a caller with none passes (null, 0), and
   calls again with a buffer (256-byte aligned) when *workspace_needed came back larger. */
PT_API pt_status pt_attention_fwd(const pt_tensor* q, const pt_tensor* k, const pt_tensor* v,
                                  const pt_tensor* sink, const pt_tensor* cu_seqlens_q,
                                  const pt_tensor* cu_seqlens_k, pt_tensor* out, pt_tensor* lse,
                                  int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                                  int32_t window_left, int32_t window_right, int32_t backend,
                                  void* workspace, size_t workspace_bytes, size_t* workspace_needed,
                                  void* stream);

/* The gradients of pt_attention_fwd: dq, dk, dv contiguous in q's, k's, v's shapes and dtype;
   dsink float32 [Hq] when sink is given (else null). dout: out's shape and dtype, any strides with
   a unit last one. delta: float32 workspace in lse's shape (TURBO). backend and workspace as for
   pt_attention_fwd; the two directions may run on different backends (lse means the same on both).
   deterministic != 0 asks for a bitwise-reproducible backward: cuDNN's deterministic algorithm,
   or our separate dQ kernel. Otherwise our sm_90a kernel at head dims 128/128 fuses dQ into the
   dK/dV kernel, adding it in no fixed order into a float32 workspace of rows * Hq * 128 * 4
   bytes (rows: total tokens of q) reported through workspace_needed; a caller passing no workspace and a null
   workspace_needed gets the separate dQ kernel. */
PT_API pt_status pt_attention_bwd(const pt_tensor* dout, const pt_tensor* q, const pt_tensor* k,
                                  const pt_tensor* v, const pt_tensor* out, const pt_tensor* lse,
                                  const pt_tensor* sink, const pt_tensor* cu_seqlens_q,
                                  const pt_tensor* cu_seqlens_k, pt_tensor* dq, pt_tensor* dk, pt_tensor* dv,
                                  pt_tensor* dsink, pt_tensor* delta, int64_t max_seqlen_q,
                                  int64_t max_seqlen_k, double softmax_scale, int32_t window_left,
                                  int32_t window_right, int32_t backend, int32_t deterministic,
                                  void* workspace, size_t workspace_bytes, size_t* workspace_needed,
                                  void* stream);

/* FP8 attention forward: pt_attention_fwd's problem (16-bit q, k, v and out; lse alike; every
   mask, GQA, sink and packed form) computed with q, k and v quantized to E4M3 in blocks of
   scale_rows (64 or 128) rows per head, each block with its own float32 scale applied inside the
   kernel (our Hopper kernel; sm_90a). Head dims 64, 96, 128 (q/k and v alike) and 192/128.
   Workspace as for pt_attention_fwd: it holds the quantized tiles. q_deq, k_deq, v_deq (each
   optional): contiguous tensors of q's, k's, v's shape and dtype that receive the dequantized
   operands the kernel computed with (rows outside every sequence untouched); pt_attention_bwd on
   them with this out and lse gives the gradients of this forward. */
PT_API pt_status pt_attention_fp8_fwd(const pt_tensor* q, const pt_tensor* k, const pt_tensor* v,
                                      const pt_tensor* sink, const pt_tensor* cu_seqlens_q,
                                      const pt_tensor* cu_seqlens_k, pt_tensor* out, pt_tensor* lse,
                                      pt_tensor* q_deq, pt_tensor* k_deq, pt_tensor* v_deq,
                                      int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                                      int32_t window_left, int32_t window_right, int32_t scale_rows,
                                      void* workspace, size_t workspace_bytes, size_t* workspace_needed,
                                      void* stream);

/* The gradients of pt_attention_fp8_fwd from our FP8 backward kernels (sm_90a; head dims 64, 96,
   128 for q/k and v alike): arguments as pt_attention_bwd's, with q, k, v the dequantized copies
   pt_attention_fp8_fwd returned. delta is computed from dout and out in 16 bits; q, k, v (exact in
   E4M3 at their forward scales) and dout are quantized to E4M3 in tiles of 64 rows per head, and
   P and dS per block with a power-of-two unit per accumulator row. Deterministic (no atomics).
   Workspace as for pt_attention_fwd: it holds the quantized tiles (about 7 bytes per element of
   q, k, v and dout together). */
PT_API pt_status pt_attention_fp8_bwd(const pt_tensor* dout, const pt_tensor* q, const pt_tensor* k,
                                      const pt_tensor* v, const pt_tensor* out, const pt_tensor* lse,
                                      const pt_tensor* sink, const pt_tensor* cu_seqlens_q,
                                      const pt_tensor* cu_seqlens_k, pt_tensor* dq, pt_tensor* dk, pt_tensor* dv,
                                      pt_tensor* dsink, pt_tensor* delta, int64_t max_seqlen_q,
                                      int64_t max_seqlen_k, double softmax_scale, int32_t window_left,
                                      int32_t window_right, void* workspace, size_t workspace_bytes,
                                      size_t* workspace_needed, void* stream);

/* Compiles (or loads from the cache) the FP8 attention modules of (dtype of q, D, Dv) for sm_90a:
   the forward, and the backward where its head dims allow. */
PT_API pt_status pt_attention_fp8_prepare(int32_t dtype, int32_t head_dim, int32_t head_dim_v);

/* Compiles (or loads from the cache) the attention module of (dtype, D, Dv) for sm_90a without
   running it. Needs no GPU. */
PT_API pt_status pt_attention_prepare(int32_t dtype, int32_t head_dim, int32_t head_dim_v);

#ifdef __cplusplus
}
#endif
