// Primus-Turbo core C API.
//
// Framework-free: every function takes plain tensor descriptors (pointer, dtype, shape, strides
// in elements), a CUDA stream and returns a status. Bindings (PyTorch now, JAX later) translate
// their tensors into pt_tensor and a non-zero status into an exception carrying pt_last_error().
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define PT_API __attribute__((visibility("default")))
#else
#define PT_API
#endif

#define PT_MAX_DIMS 8

typedef enum pt_status {
  PT_SUCCESS = 0,
  PT_ERROR_INVALID_ARGUMENT = 1,  // the caller's fault: shape, dtype, stride, alignment
  PT_ERROR_NOT_SUPPORTED = 2,     // valid, but this backend/config does not implement it
  PT_ERROR_CUDA = 3,              // CUDA runtime or driver error
  PT_ERROR_CUBLAS = 4,            // cuBLAS / cuBLASLt error
  PT_ERROR_JIT = 5,               // compiling or loading a JIT kernel failed
  PT_ERROR_INTERNAL = 6,
} pt_status;

typedef enum pt_dtype {
  PT_FLOAT32 = 0,
  PT_FLOAT16 = 1,
  PT_BFLOAT16 = 2,
  PT_FLOAT8_E4M3 = 3,
  PT_FLOAT8_E5M2 = 4,
  PT_FLOAT8_E8M0 = 5,
  PT_FLOAT4_E2M1_X2 = 6,
  PT_INT32 = 7,
  PT_INT64 = 8,
  PT_UINT8 = 9,
  PT_NUM_DTYPES = 10,
} pt_dtype;

typedef struct pt_tensor {
  void* data;
  int32_t dtype;  // pt_dtype
  int32_t ndim;
  int64_t shape[PT_MAX_DIMS];
  int64_t strides[PT_MAX_DIMS];  // in elements
} pt_tensor;

// Implementations ("backends"). The numbering is part of the ABI; bindings mirror it.
typedef enum pt_backend {
  PT_BACKEND_NONE = 0,
  PT_BACKEND_CUBLASLT = 1,
  PT_BACKEND_CUTLASS = 2,
  PT_BACKEND_CUDNN = 3,
  PT_BACKEND_TURBO = 4,  // the library's own plain CUDA kernels
  PT_BACKEND_NCCL = 5,
  PT_BACKEND_DEEP_EP = 6,
  PT_NUM_BACKENDS = 7,
} pt_backend;

// Operator families that carry a backend setting.
typedef enum pt_op_family {
  PT_OP_GEMM = 0,
  PT_OP_GROUPED_GEMM = 1,
  PT_OP_ATTN = 2,
  PT_OP_MOE_DISPATCH_COMBINE = 3,
  PT_NUM_OP_FAMILIES = 4,
} pt_op_family;

typedef enum pt_precision {
  PT_PRECISION_BF16_FP16_FP32 = 0,
  PT_PRECISION_FP8 = 1,
  PT_PRECISION_FP4 = 2,
  PT_NUM_PRECISIONS = 3,
} pt_precision;

// ---- errors and version -------------------------------------------------------------------
// Message of the last failed call on this thread ("" if none).
PT_API const char* pt_last_error(void);
PT_API const char* pt_version(void);

// ---- backend selection (code setting > environment > autotune > default > any) ------------
// Name -> backend. Accepts NVIDIA names and the original AMD names where a natural equivalent
// exists (HIPBLASLT -> CUBLASLT, CK -> CUTLASS); anything else is PT_ERROR_INVALID_ARGUMENT with a
// message listing the choices.
PT_API pt_status pt_backend_from_name(const char* name, int32_t* backend);
PT_API const char* pt_backend_name(int32_t backend);
// precision < 0: every precision. backend 0 with auto_tune 0 clears the code setting.
PT_API pt_status pt_backend_set(int32_t op, int32_t precision, int32_t backend, int32_t auto_tune);
// The code setting alone (backend 0 and auto_tune 0 when unset).
PT_API pt_status pt_backend_get_code(int32_t op, int32_t precision, int32_t* backend,
                                     int32_t* auto_tune);
// The environment setting alone (PRIMUS_TURBO_<OP>_BACKEND), parsed; error on a bad value.
PT_API pt_status pt_backend_get_env(int32_t op, int32_t precision, int32_t* backend,
                                    int32_t* auto_tune);
// enabled < 0 clears the code setting (PRIMUS_TURBO_AUTO_TUNE then decides).
PT_API pt_status pt_autotune_set_enabled(int32_t enabled);
PT_API int32_t pt_autotune_enabled(void);
// Resolves code > environment > global autotune. *backend is 0 when nothing forces a choice;
// *auto_tune is 1 when the op should profile its candidates.
PT_API pt_status pt_backend_resolve(int32_t op, int32_t precision, int32_t* backend,
                                    int32_t* auto_tune);
PT_API pt_status pt_backend_reset(void);
// A counter that changes whenever a resolved choice could change: a code setting, the autotune
// switch, a reset or a cleared autotune memory. Bindings key their plan caches on it (with the
// environment variables, which they read themselves). pt_settings_touch bumps it for changes the
// core cannot see (a binding's own autotune memory cleared).
PT_API uint64_t pt_settings_epoch(void);
PT_API void pt_settings_touch(void);

// ---- autotune cache (memory, persisted under <cache dir>/autotune) ------------------------
// Returns 1 and copies the value when the key is known, 0 otherwise.
PT_API int32_t pt_autotune_lookup(const char* key, char* value, size_t value_len);
PT_API pt_status pt_autotune_store(const char* key, const char* value);
// Clears memory; with also_disk, removes the persisted file too.
PT_API pt_status pt_autotune_clear(int32_t also_disk);
PT_API pt_status pt_autotune_cache_file(char* path, size_t path_len);

// ---- JIT runtime -----------------------------------------------------------------------------
PT_API pt_status pt_jit_set_cutlass_include(const char* path);
PT_API pt_status pt_jit_cache_dir(char* path, size_t path_len);
// Number of modules compiled / loaded from disk in this process (for tests and progress).
PT_API pt_status pt_jit_stats(int64_t* compiled, int64_t* loaded_from_disk);

// ---- GEMM: d = alpha * op(a) @ op(b) + beta * d ------------------------------------------
// a, b, d are 2-D; each of a and b may be row- or column-major (any leading dimension), d is
// row-major. backend: PT_BACKEND_CUBLASLT or PT_BACKEND_CUTLASS. config: index into the backend's
// candidate list for this problem, or -1 for its heuristic default.
PT_API pt_status pt_gemm(const pt_tensor* a, const pt_tensor* b, pt_tensor* d, int32_t trans_a,
                         int32_t trans_b, float alpha, float beta, int32_t backend, int32_t config,
                         void* workspace, size_t workspace_bytes, void* stream);
// Whether backend accepts the problem (1/0), how many configs it offers, and if not, why.
// Checks arguments first (an invalid problem is an error, not a refusal). No device work.
PT_API pt_status pt_gemm_query(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d,
                               int32_t trans_a, int32_t trans_b, float beta, int32_t backend,
                               int32_t* accepted, int32_t* num_configs, char* reason,
                               size_t reason_len);
// Size of a backend's fixed config list (CUTLASS), or -1 when it depends on the problem
// (cuBLASLt's heuristic candidates). Needs no GPU.
PT_API int32_t pt_gemm_num_configs(int32_t backend);
// Human-readable name of a config (for logs and autotune cache values).
PT_API pt_status pt_gemm_config_name(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d,
                                     int32_t trans_a, int32_t trans_b, float beta, int32_t backend,
                                     int32_t config, char* name, size_t name_len);
// Compiles (or loads from the cache) the kernel module a CUTLASS config needs, without running
// it. Safe to call from several threads at once: used to compile autotune candidates in parallel.
PT_API pt_status pt_gemm_prepare(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d,
                                 int32_t trans_a, int32_t trans_b, float beta, int32_t backend,
                                 int32_t config);
// The part of an autotune key that identifies the problem: sizes, dtypes, layouts, alignment and
// whether it accumulates. Bindings prefix it with the op and GPU name.
PT_API pt_status pt_gemm_problem_key(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d,
                                     int32_t trans_a, int32_t trans_b, float beta, char* key,
                                     size_t key_len);
PT_API size_t pt_gemm_workspace_bytes(void);

// A GEMM plan binds one backend config to a problem's sizes, layouts, dtypes, leading dimensions
// and pointer alignment, validated once; running it on new pointers skips all per-call checks and
// reuses the backend's descriptors (the per-call path of a framework's plan cache). The pointers
// given to pt_gemm_plan_run must be at least as aligned as those the plan was created with (an
// error otherwise). A plan is bound to the device current at creation.
typedef struct pt_gemm_plan_s* pt_gemm_plan;
PT_API pt_status pt_gemm_plan_create(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d,
                                     int32_t trans_a, int32_t trans_b, float alpha, float beta,
                                     int32_t backend, int32_t config, pt_gemm_plan* plan);
PT_API pt_status pt_gemm_plan_run(pt_gemm_plan plan, const void* a, const void* b, void* d,
                                  void* workspace, size_t workspace_bytes, void* stream);
// Whether the plan's runs read a workspace (a cuBLASLt algorithm that asks for one); 0: pass none.
PT_API int32_t pt_gemm_plan_needs_workspace(pt_gemm_plan plan);
PT_API void pt_gemm_plan_destroy(pt_gemm_plan plan);
#include "primus_turbo/gemm_fp8.h"  // ---- FP8 GEMM

// ---- RMSNorm over the last dimension ------------------------------------------------------
// y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps) per row (statistics in float32) and
// w = gamma, or 1 + gamma when zero_centered. x: contiguous, >= 1-D, float32/float16/bfloat16, last
// dimension (hidden) 1 to 65536; every leading dimension is a row. gamma: contiguous [hidden], x's
// dtype or float32. y: like x. rstd: contiguous float32 with one element per row (for the backward).
// Runs on the current device and the given stream.
PT_API pt_status pt_rmsnorm_fwd(const pt_tensor* x, const pt_tensor* gamma, pt_tensor* y,
                                pt_tensor* rstd, float eps, int32_t zero_centered, void* stream);
// dx = rstd * (w*dy - x_hat * mean(w*dy*x_hat)) with x_hat = x * rstd; dgamma = sum over rows of
// dy * x_hat, reduced in a fixed order (bitwise reproducible). dy, dx: like x; dgamma: like gamma;
// rstd: from the forward. workspace: 16-byte aligned, at least pt_rmsnorm_bwd_workspace_bytes.
PT_API pt_status pt_rmsnorm_bwd(const pt_tensor* dy, const pt_tensor* x, const pt_tensor* gamma,
                                const pt_tensor* rstd, pt_tensor* dx, pt_tensor* dgamma,
                                void* workspace, size_t workspace_bytes, int32_t zero_centered,
                                void* stream);
// Workspace of the backward; depends only on the sizes (0 when rows or hidden is not positive).
PT_API size_t pt_rmsnorm_bwd_workspace_bytes(int64_t rows, int64_t hidden);
// Compiles (or loads from the cache) the module for sm_90a that contiguous, 16-byte aligned
// tensors of this dtype pair and hidden size use, without running it. Needs no GPU.
PT_API pt_status pt_rmsnorm_prepare(int32_t dtype, int32_t gamma_dtype, int64_t hidden);

#ifdef __cplusplus
}
#endif

#include "primus_turbo/normalization.h"  // RMSNorm + residual, LayerNorm
#include "primus_turbo/activation.h"     // SwiGLU, GeGLU
#include "primus_turbo/rope.h"
#include "primus_turbo/attention.h"  // flash attention
#include "primus_turbo/moe_permute.h"
#include "primus_turbo/moe_routing.h"

#include "primus_turbo/quantization.h"  // IWYU pragma: export
#include "primus_turbo/grouped_gemm.h"
