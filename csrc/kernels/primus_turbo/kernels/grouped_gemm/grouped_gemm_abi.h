// The binary contract of grouped GEMM modules (beside jit_abi.h, which every module shares, so that
// adding this operator leaves other modules' cache keys unchanged).
#pragma once

#include "primus_turbo/kernels/grouped_gemm/grouped_gemm_common_abi.h"

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

typedef struct PtGroupedGemmParams : PtGroupedGemmCommon {
  int32_t split;  // PT_GROUPED_SPLIT_*; m: REDUCTION only, k: ROWS only
} PtGroupedGemmParams;

typedef int (*PtGroupedGemmRunFn)(const PtGroupedGemmParams* params, char* err, size_t err_len);
typedef int (*PtGroupedGemmWorkspaceFn)(const PtGroupedGemmParams* params, size_t* bytes,
                                        char* err, size_t err_len);

#ifdef __cplusplus
}

// Exports Kernel::run and Kernel::workspace as pt_grouped_gemm_run / pt_grouped_gemm_workspace.
#define PT_JIT_EXPORT_GROUPED_GEMM(Kernel)                                              \
  PT_JIT_EXPORT_GROUPED_FUNCTIONS(Kernel, PtGroupedGemmParams, pt_grouped_gemm_run,      \
                                  pt_grouped_gemm_workspace)
#endif
