// The part of the grouped GEMM module contract that the bf16 (grouped_gemm_abi.h) and FP8
// (grouped_gemm_fp8_abi.h) modules share: the packed problem, the device-side group sizes and the
// launch resources. Each operator's parameter struct extends it (C++ inheritance, so these
// headers are C++ only) with what only it needs.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {

typedef struct PtGroupedGemmCommon {
  int64_t num_groups;
  int64_t rows;               // the packed extent the host knows
  int64_t m, n, k;            // fixed sizes (which ones a split reads: see the operator's header)
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
} PtGroupedGemmCommon;
}

// Exports pt_jit_abi_version and Kernel::run / Kernel::workspace under the given names, taking
// the operator's parameter struct Params.
#define PT_JIT_EXPORT_GROUPED_FUNCTIONS(Kernel, Params, run_name, workspace_name)            \
  extern "C" __attribute__((visibility("default"))) int pt_jit_abi_version() {              \
    return PT_JIT_ABI_VERSION;                                                              \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int run_name(                           \
      const Params* params, char* err, size_t err_len) {                                    \
    return Kernel::run(params, err, err_len);                                               \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int workspace_name(                     \
      const Params* params, size_t* bytes, char* err, size_t err_len) {                     \
    return Kernel::workspace(params, bytes, err, err_len);                                  \
  }
#endif
