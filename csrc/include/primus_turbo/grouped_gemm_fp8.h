// Primus-Turbo C API: FP8 grouped GEMM (mixture-of-experts layers), forward and dgrad.
//
// Like the bf16 grouped GEMM (grouped_gemm.h), group sizes stay on the device: a small kernel
// reads group_lens / group_offs and fills the per-group problems, so no call synchronizes with the
// host and every call can be captured in a CUDA graph whose group sizes change between replays.
#pragma once

#include "primus_turbo/primus_turbo.h"  // includes gemm_fp8.h (pt_gemm_fp8_flag)

#ifdef __cplusplus
extern "C" {
#endif

// d[rows of g] = (a[rows of g] * a_scale) @ (b[g] * b_scale)^T, FP32 accumulation. Both FP8
// operands K-major (what FP8 tensor cores read), all tensors contiguous on one device; kb =
// ceil(K / 128).
//   a        [M, K] float8_e4m3 / float8_e5m2
//   a_scale  float32 [M, kb]: one dequantization scale per row and 128-deep K block
//   b        [G, N, K] float8_e4m3 / float8_e5m2
//   b_scale  float32 [G, N, kb] (b_scale_rows = 1) or [G, ceil(N/128), kb] (b_scale_rows = 128)
//   d        [M, N] bfloat16 / float16 / float32
// Tensorwise scalings are expressed in these layouts by the caller (a value repeated over the
// blocks it covers). Row scales (b_scale_rows = 0): a_scale float32 [M] and b_scale [G, N], one
// scale per row of each operand, applied to the product in the epilogue; the mainloop then reads no
// scales and, with PT_GEMM_FP8_FAST_ACCUM in flags, accumulates in the fast mode (gemm_fp8.h). group_lens int64 [G], group_offs NULL or int64 [G + 1]; sizes that
// do not add up to M are clamped on the device as in grouped_gemm.h.
typedef struct pt_grouped_gemm_fp8_args {
  const pt_tensor* a;
  const pt_tensor* a_scale;
  const pt_tensor* b;
  const pt_tensor* b_scale;
  const pt_tensor* group_lens;
  const pt_tensor* group_offs;  // may be NULL
  const pt_tensor* d;
  int32_t b_scale_rows;  // 1 or 128 (block scales), 0 (row scales)
  int32_t num_sms;       // SMs the persistent kernel may use; 0: all
  // wgrad = 1: the groups split the reduction (the variable-K weight gradient). Group g's
  // clamped token count len_g is padded to plen_g = round_up(len_g, 128), the padded groups packed
  // from column 0 in group order (pstart_g = sum of earlier plen), and
  //   d[g] [m, n] = (a[:, pstart_g : +plen_g] * a_scale) @ (b[:, pstart_g : +plen_g] * b_scale)^T
  // with a [m, ld], b [n, ld] FP8 (ld a multiple of 128, padding columns zero), a_scale
  // [ld/128, m], b_scale [ld/128, n] (1x128 blocks along the tokens), d [G, m, n]; tokens is the
  // token count the lengths are clamped to. b_scale_rows must be 1. An empty group gets zeros.
  int32_t wgrad;
  int64_t tokens;
  int32_t flags;  // pt_gemm_fp8_flag bits; PT_GEMM_FP8_FAST_ACCUM is taken with row scales
} pt_grouped_gemm_fp8_args;

// backend: PT_BACKEND_CUTLASS. config: index into its candidates, or -1 for its default.
// workspace: at least pt_grouped_gemm_fp8_workspace_size bytes, 256-byte aligned.
PT_API pt_status pt_grouped_gemm_fp8(const pt_grouped_gemm_fp8_args* args, int32_t backend,
                                     int32_t config, void* workspace, size_t workspace_bytes,
                                     void* stream);
// Whether backend accepts the call, how many configs it offers and, if not, why. Invalid
// arguments are an error, not a refusal. No device work.
PT_API pt_status pt_grouped_gemm_fp8_query(const pt_grouped_gemm_fp8_args* args, int32_t backend,
                                           int32_t* accepted, int32_t* num_configs, char* reason,
                                           size_t reason_len);
// Workspace a config needs (depends on G and the SM count only). Builds or loads the module.
PT_API pt_status pt_grouped_gemm_fp8_workspace_size(const pt_grouped_gemm_fp8_args* args,
                                                    int32_t backend, int32_t config,
                                                    size_t* bytes);
PT_API pt_status pt_grouped_gemm_fp8_config_name(const pt_grouped_gemm_fp8_args* args,
                                                 int32_t backend, int32_t config, char* name,
                                                 size_t name_len);
// The problem part of an autotune key: M, N, K, G, dtypes, scale granularity, alignment.
PT_API pt_status pt_grouped_gemm_fp8_problem_key(const pt_grouped_gemm_fp8_args* args, char* key,
                                                 size_t key_len);
// Compiles (or loads from the cache) one kernel point for sm_90a without running it; needs no
// GPU. Thread-safe. b_scale_rows 0: the row-scaled kernel, with full accumulation.
PT_API pt_status pt_grouped_gemm_fp8_prepare(int32_t a_dtype, int32_t b_dtype, int32_t d_dtype,
                                             int32_t b_scale_rows, int32_t config);
// The same for the row-scaled kernel with fast accumulation (PT_GEMM_FP8_FAST_ACCUM).
PT_API pt_status pt_grouped_gemm_fp8_fast_prepare(int32_t a_dtype, int32_t b_dtype, int32_t d_dtype,
                                                  int32_t config);
// The same for the wgrad (reduction split) kernel of one dtype point.
PT_API pt_status pt_grouped_gemm_fp8_wgrad_prepare(int32_t a_dtype, int32_t b_dtype, int32_t d_dtype,
                                                   int32_t config);
// Size of the CUTLASS config list of the block-scaled kernel (the fast row-scaled one offers more:
// pt_grouped_gemm_fp8_query), or -1 for a backend without an FP8 grouped GEMM.
PT_API int32_t pt_grouped_gemm_fp8_num_configs(int32_t backend);

#ifdef __cplusplus
}
#endif
