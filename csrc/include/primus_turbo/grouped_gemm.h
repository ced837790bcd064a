// Primus-Turbo C API: grouped GEMM (mixture-of-experts layers), bf16/fp16.
//
// Group sizes stay on the device: group_lens (and optionally group_offs) are read by a small
// kernel that fills the per-group problems, so no call synchronizes with the host and every call
// can be captured in a CUDA graph whose group sizes change between replays.
#pragma once

#include "primus_turbo/primus_turbo.h"

#ifdef __cplusplus
extern "C" {
#endif

// One grouped GEMM call. All tensors contiguous, on one device; G = group_lens->shape[0] >= 1.
//   forward (wgrad = 0): a [M, K], b [G, K, N] (trans_b: [G, N, K]), d [M, N];
//       d[rows of g] = a[rows of g] @ op(b[g]). Also the dgrad: grad_out against b with trans_b
//       flipped (the same memory read the other way round).
//   wgrad (wgrad = 1): a [M, K] (the forward's input), b [M, N] (grad of its output),
//       d [G, K, N] = a_g^T @ b_g (trans_b: d [G, N, K] = b_g^T @ a_g). A group with no rows gets
//       an exact zero d[g].
// group_lens: int64 [G]; group_offs: NULL or int64 [G + 1] with group g starting at row
// group_offs[g] (default: the exclusive prefix sum of group_lens). Lengths below 0 count as 0.
// Sizes that do not add up to M cannot be checked without a host sync: each group is clamped into
// rows [0, M) on the device, so nothing outside the tensors is ever read or written; forward rows
// past the last group's end are zeroed (gaps between explicit group_offs are left as they are).
typedef struct pt_grouped_gemm_args {
  const pt_tensor* a;
  const pt_tensor* b;
  const pt_tensor* group_lens;
  const pt_tensor* group_offs;  // may be NULL
  const pt_tensor* d;
  int32_t wgrad;
  int32_t trans_b;
  int32_t num_sms;  // SMs the persistent kernel may use, rounded down to even (2-CTA clusters); 0: all
} pt_grouped_gemm_args;

// backend: PT_BACKEND_CUTLASS. config: index into its candidate list, or -1 for its default.
// workspace: at least pt_grouped_gemm_workspace_size bytes, 256-byte aligned.
PT_API pt_status pt_grouped_gemm(const pt_grouped_gemm_args* args, int32_t backend,
                                 int32_t config, void* workspace, size_t workspace_bytes,
                                 void* stream);
// Whether backend accepts the call (1/0), how many configs it offers and, if not, why. Checks the
// arguments first (an invalid call is an error, not a refusal). No device work.
PT_API pt_status pt_grouped_gemm_query(const pt_grouped_gemm_args* args, int32_t backend,
                                       int32_t* accepted, int32_t* num_configs, char* reason,
                                       size_t reason_len);
// Workspace a config needs (depends on G and the GPU's SM count, never on group sizes). Builds or
// loads the config's kernel module.
PT_API pt_status pt_grouped_gemm_workspace_size(const pt_grouped_gemm_args* args, int32_t backend,
                                                int32_t config, size_t* bytes);
// Compiles (or loads from the cache) the module of a config without running it. Thread-safe.
PT_API pt_status pt_grouped_gemm_prepare(const pt_grouped_gemm_args* args, int32_t backend,
                                         int32_t config);
PT_API pt_status pt_grouped_gemm_config_name(const pt_grouped_gemm_args* args, int32_t backend,
                                             int32_t config, char* name, size_t name_len);
// The problem part of an autotune key: M, N, K, G, dtypes, direction and layout.
PT_API pt_status pt_grouped_gemm_problem_key(const pt_grouped_gemm_args* args, char* key,
                                             size_t key_len);
// Size of a backend's fixed config list, or -1 when the backend has no grouped GEMM.
PT_API int32_t pt_grouped_gemm_num_configs(int32_t backend);

#ifdef __cplusplus
}
#endif
