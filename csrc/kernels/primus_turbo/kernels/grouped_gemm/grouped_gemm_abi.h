// The binary contract of grouped GEMM modules (beside jit_abi.h, which every module shares, so that
// adding this operator leaves other modules' cache keys unchanged).
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// split says how the packed operands are divided among the groups:
//   ROWS (forward, dgrad): group g owns rows of a [rows, k] and d [rows, n]; b is [G, ...].
//   REDUCTION (wgrad): group g owns rows of a [rows, m] and b [rows, n], which are the GEMM's K;
//   d is [G, m, n].
// Group starts and lengths are read and clamped into [0, rows) on the device.
#define PT_GROUPED_SPLIT_ROWS 0
#define PT_GROUPED_SPLIT_REDUCTION 1

typedef struct PtGroupedGemmParams {
  int32_t split;
  int64_t num_groups;
  int64_t rows;               // the packed extent the host knows
  int64_t m, n, k;            // fixed sizes (m: REDUCTION only; k: ROWS only)
  const int64_t* group_lens;  // [num_groups], device
  const int64_t* group_offs;  // [num_groups + 1] start offsets, device; NULL: prefix sum of lens
  const void* a;
  const void* b;
  void* d;
  void* workspace;
  size_t workspace_bytes;
  void* stream;  // cudaStream_t
  int device;
  int num_sms;
} PtGroupedGemmParams;

typedef int (*PtGroupedGemmRunFn)(const PtGroupedGemmParams* params, char* err, size_t err_len);
typedef int (*PtGroupedGemmWorkspaceFn)(const PtGroupedGemmParams* params, size_t* bytes,
                                        char* err, size_t err_len);

#ifdef __cplusplus
}

// Exports Kernel::run and Kernel::workspace as pt_grouped_gemm_run / pt_grouped_gemm_workspace.
#define PT_JIT_EXPORT_GROUPED_GEMM(Kernel)                                                  \
  extern "C" __attribute__((visibility("default"))) int pt_jit_abi_version() {              \
    return PT_JIT_ABI_VERSION;                                                              \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_grouped_gemm_run(                \
      const PtGroupedGemmParams* params, char* err, size_t err_len) {                       \
    return Kernel::run(params, err, err_len);                                               \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int pt_grouped_gemm_workspace(          \
      const PtGroupedGemmParams* params, size_t* bytes, char* err, size_t err_len) {        \
    return Kernel::workspace(params, bytes, err, err_len);                                  \
  }
#endif
