// The binary contract of FP8 grouped GEMM modules (kernels/grouped_gemm/cutlass_grouped_gemm_fp8_sm90.cuh).
// A header of its own, so the bf16 grouped modules' cache keys do not depend on it.
#pragma once

#include "primus_turbo/kernels/grouped_gemm/grouped_gemm_common_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// d[rows of g] = (a[rows of g] * sfa) @ (b[g] * sfb)^T for every group g, FP32 accumulation.
//   a    [rows, k] FP8, row-major (K-major);  sfa [rows, ceil(k/128)] fp32 row-major: one scale
//        per row and 128-deep K block (1x128 blocks).
//   b    [G, n, k] FP8, row-major per group (K-major).
//        sfb: scale_rows_b == 1:   [G, n, ceil(k/128)] (1x128 blocks of b[g]);
//             scale_rows_b == 128: [G, ceil(n/128), ceil(k/128)] (128x128 blocks).
//   d    [rows, n] bf16/fp16/fp32 row-major.
// Group starts and lengths are read from group_lens / group_offs and clamped into [0, rows) on
// the device, as for the bf16 grouped GEMM.
//
// wgrad (variable K): the groups split the reduction. Group g's clamped length len_g is padded to
// plen_g = round_up(len_g, 128) and the padded groups are packed from column 0 in group order
// (pstart_g = sum of the earlier plen). Then
//   d[g] [m, n] = (a[:, pstart_g : +plen_g] * sfa) @ (b[:, pstart_g : +plen_g] * sfb)^T
//   a    [m, ld] FP8 row-major (the tokens are its K), sfa [ld/128, m] fp32 (1x128 blocks along
//        the tokens, MN-major); b [n, ld], sfb [ld/128, n]; d [G, m, n]. The padding columns must
//        hold zeros. A group with no tokens gets an exact zero d[g].
// Common fields: rows is the packed token count the host knows; m: wgrad only; k: forward only.
typedef struct PtGroupedGemmFp8Params : PtGroupedGemmCommon {
  int32_t wgrad;
  int64_t ld;  // wgrad only: row length of a and b (a multiple of 128)
  const float* sfa;
  const float* sfb;
} PtGroupedGemmFp8Params;

typedef int (*PtGroupedGemmFp8RunFn)(const PtGroupedGemmFp8Params* params, char* err, size_t err_len);
typedef int (*PtGroupedGemmFp8WorkspaceFn)(const PtGroupedGemmFp8Params* params, size_t* bytes,
                                           char* err, size_t err_len);

#ifdef __cplusplus
}

// Exports Kernel::run and Kernel::workspace as pt_grouped_gemm_fp8_run / _workspace.
#define PT_JIT_EXPORT_GROUPED_GEMM_FP8(Kernel)                                           \
  PT_JIT_EXPORT_GROUPED_FUNCTIONS(Kernel, PtGroupedGemmFp8Params, pt_grouped_gemm_fp8_run, \
                                  pt_grouped_gemm_fp8_workspace)
#endif
