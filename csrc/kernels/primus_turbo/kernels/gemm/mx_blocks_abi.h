// The C ABI between the core and an MX -> 1x128 restatement module (kernels/gemm/mx_to_blocks.cuh).
// Kept beside the kernel so that only these modules hash it; the ABI version is jit_abi.h's.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// q: FP8 [rows, k] (1 byte a value) or packed E2M1 [rows, k / 2] (low nibble = even element), per
// the module's format. scale: E8M0 bytes, row r's exponents at scale + (r / scale_row_div) * kb32
// (scale_row_div 1: one row of scales per row; 32: 32x32 blocks). q_out: FP8 [rows, k] (E4M3 for
// FP4 input). scale_out: fp32 [rows, ceil(kb32 / 4)], or with scale_ld_mn > 0 blocks-major at
// scale_out[block * scale_ld_mn + row] (the 1x128 GEMM's layout). k is a multiple of 16; q and
// q_out 16-byte aligned.
typedef struct PtMxBlocksParams {
  const void* q;
  const uint8_t* scale;
  void* q_out;
  float* scale_out;
  int64_t rows, k, kb32;
  int32_t scale_row_div;
  void* stream;  // cudaStream_t
  int64_t scale_ld_mn;
} PtMxBlocksParams;

typedef int (*PtMxBlocksFn)(const PtMxBlocksParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
