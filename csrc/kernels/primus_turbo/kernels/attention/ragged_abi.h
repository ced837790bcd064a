// The C ABI between the core and the packed-sequence metadata module (kernels/attention/
// ragged_offsets.cuh) of the CUDNN attention backend. Kept apart from attention_abi.h so that the
// attention kernels' cache keys do not depend on it; the ABI version is jit_abi.h's.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PT_RAGGED_MAX_STRIDES 12
#define PT_RAGGED_MAX_TAILS 6

// Rows [clamped cu[batch], total) of a packed output, which no sequence covers: element (row, head, i) at
// data + (row * ss + head * sh + i) * elem_bytes, set to `fill` (elem_bytes 2: bf16/fp16 zero;
// 4: fp32, e.g. +inf for a log-sum-exp).
typedef struct PtRaggedTail {
  void* data;
  int64_t total, ss, sh;
  int32_t heads, dim, elem_bytes;
  float fill;
} PtRaggedTail;

// From cu_seqlens [batch + 1] (int32, on the device), each sequence's start clamped into
// [0, total] and its length into [0, min(max_len, total - start)] (as our kernel reads them: bad
// offsets never reach past the tensors or the graph's length bound): seqlens[b] (int32 [batch])
// and, for each of num_strides token strides s_i (elements between consecutive tokens of one
// operand), offsets[i * (batch + 1) + b] = start_b * s_i (int64): where sequence b starts in that
// operand, the "ragged offset" cuDNN reads for packed sequences; then the tails of the outputs
// cuDNN leaves untouched are filled. No host sync.
typedef struct PtRaggedParams {
  const int32_t* cu_seqlens;
  int32_t* seqlens;
  int64_t* offsets;
  int64_t batch;
  int64_t total;    // rows of the packed tensors
  int64_t max_len;  // the length bound the graph was built for
  int32_t num_strides;
  int64_t strides[PT_RAGGED_MAX_STRIDES];
  int32_t num_tails;
  PtRaggedTail tails[PT_RAGGED_MAX_TAILS];
  void* stream;  // cudaStream_t
} PtRaggedParams;

typedef int (*PtRaggedFn)(const PtRaggedParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}

#define PT_JIT_EXPORT_RAGGED(Kernel)                                                     \
  PT_JIT_EXPORT_ABI_VERSION                                                              \
  extern "C" __attribute__((visibility("default"))) int pt_ragged_run(                   \
      const PtRaggedParams* params, char* err, size_t err_len) {                         \
    return Kernel::run(params, err, err_len);                                            \
  }
#endif
