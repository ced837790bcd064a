// FP8 GEMM: d = (a * a_scale) @ (b * b_scale)^T + beta * d, both operands K-major.
// Included from primus_turbo.h; C only.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// How an operand's dequantization scales (fp32, "scale_inv": value = q * scale) are laid out.
// rows is M for a and N for b; kb = ceil(K / 128). These are the layouts the GEMM reads directly
// (the Python binding converts the quantizer's [rows, kb] scales to them).
typedef enum pt_fp8_scaling {
  PT_FP8_SCALING_TENSOR = 0,        // one value: 0-dim or [1]
  PT_FP8_SCALING_ROW = 1,           // [rows]: one per row (per output row/column)
  PT_FP8_SCALING_BLOCK_1x128 = 2,   // [kb, round_up(rows, 4)]: 1x128 blocks, rows contiguous
  PT_FP8_SCALING_BLOCK_128x128 = 3, // [ceil(rows/128), round_up(kb, 4)]: 128x128 blocks
  PT_NUM_FP8_SCALINGS = 4,
} pt_fp8_scaling;

// Options of one FP8 GEMM (the `flags` argument below, a bitwise OR).
typedef enum pt_gemm_fp8_flag {
  // The GEMM may accumulate in the tensor cores' fast mode, without promoting the partial sums to
  // FP32 every few K steps (what the forward GEMMs of the common FP8 training recipes do). A
  // permission, not a request: honoured by cuBLASLt for tensor and row scalings; block-scaled
  // GEMMs and the CUTLASS kernels always promote.
  PT_GEMM_FP8_FAST_ACCUM = 1,
} pt_gemm_fp8_flag;

// a: [M, K] row-major float8_e4m3/e5m2; b: [N, K] row-major float8; d: [M, N] row-major
// float32/float16/bfloat16 (beta != 0 accumulates into d); flags: pt_gemm_fp8_flag bits. Row
// strides must be multiples of 16 bytes. backend: PT_BACKEND_CUBLASLT or PT_BACKEND_CUTLASS (block
// scalings). config: index into the backend's candidates for this problem, or -1 for its default.
PT_API pt_status pt_gemm_fp8(const pt_tensor* a, const pt_tensor* a_scale, int32_t a_scaling,
                             const pt_tensor* b, const pt_tensor* b_scale, int32_t b_scaling,
                             pt_tensor* d, float beta, int32_t flags, int32_t backend,
                             int32_t config, void* workspace, size_t workspace_bytes, void* stream);
// Whether backend accepts the problem (1/0), how many configs it offers, and if not, why.
// Invalid arguments are an error, not a refusal.
PT_API pt_status pt_gemm_fp8_query(const pt_tensor* a, const pt_tensor* a_scale, int32_t a_scaling,
                                   const pt_tensor* b, const pt_tensor* b_scale, int32_t b_scaling,
                                   const pt_tensor* d, float beta, int32_t flags, int32_t backend,
                                   int32_t* accepted, int32_t* num_configs, char* reason,
                                   size_t reason_len);
// Sizes, dtypes, scalings, alignment, accumulation and flags: the problem part of an autotune key.
PT_API pt_status pt_gemm_fp8_problem_key(const pt_tensor* a, const pt_tensor* a_scale,
                                         int32_t a_scaling, const pt_tensor* b,
                                         const pt_tensor* b_scale, int32_t b_scaling,
                                         const pt_tensor* d, float beta, int32_t flags, char* key,
                                         size_t key_len);

// An FP8 GEMM plan (as pt_gemm_plan): one backend config bound to a problem's sizes, dtypes,
// scalings, strides and pointer alignment, validated once; a run takes new data and scale pointers
// (at least as aligned as at creation) and a workspace of pt_gemm_workspace_bytes(). Bound to the
// device current at creation; runs from several threads are safe.
typedef struct pt_gemm_fp8_plan_s* pt_gemm_fp8_plan;
PT_API pt_status pt_gemm_fp8_plan_create(const pt_tensor* a, const pt_tensor* a_scale, int32_t a_scaling,
                                         const pt_tensor* b, const pt_tensor* b_scale, int32_t b_scaling,
                                         const pt_tensor* d, float beta, int32_t flags, int32_t backend,
                                         int32_t config, pt_gemm_fp8_plan* plan);
PT_API pt_status pt_gemm_fp8_plan_run(pt_gemm_fp8_plan plan, const void* a, const void* a_scale,
                                      const void* b, const void* b_scale, void* d, void* workspace,
                                      size_t workspace_bytes, void* stream);
// Whether the plan's runs read a workspace (0: pass none).
PT_API int32_t pt_gemm_fp8_plan_needs_workspace(pt_gemm_fp8_plan plan);
PT_API void pt_gemm_fp8_plan_destroy(pt_gemm_fp8_plan plan);

// Compiles (or loads from the cache) the CUTLASS kernel of one point (dtypes, block scalings,
// config index) for sm_90a without running it; needs no GPU. Thread-safe.
PT_API pt_status pt_gemm_fp8_prepare(int32_t a_dtype, int32_t b_dtype, int32_t d_dtype,
                                     int32_t a_scaling, int32_t b_scaling, int32_t config);
// Size of the CUTLASS config list (what a pair of 1x128 scalings offers; a 128x128-scaled
// operand allows fewer), or -1 for a backend whose list depends on the problem (cuBLASLt).
PT_API int32_t pt_gemm_fp8_num_configs(int32_t backend);

#ifdef __cplusplus
}
#endif
