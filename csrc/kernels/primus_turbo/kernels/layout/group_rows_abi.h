// The C ABI between the core and the grouped-rows module (kernels/layout/group_rows.cuh). Kept
// beside the kernel so that only this module hashes it; the ABI version is jit_abi.h's.
#pragma once

#include "primus_turbo/kernels/jit_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// The most groups a call takes: the kernel holds its group tables in shared memory.
#define PT_GROUP_ROWS_MAX_GROUPS 1024

// What the group tables are built from (index tensors of 4 or 8 bytes an entry, on the device).
enum PtGroupRowsMode {
  // Tokens [x_rows] -> padded layout [y_rows]: group g (lens[g] rows at offs[g], or back to back
  // when offs is null; clamped into x) moves to start at a multiple of align; lens_out / offs_out
  // (may be null) get the padded lens and offsets of max(lens, 0).
  PT_GROUP_ROWS_PAD = 0,
  // Padded layout [x_rows] -> tokens [y_rows]: token row t of group g (offs[g] <= t < offs[g + 1],
  // or < offs[g] + lens[g] when lens is given) is read from row offs_padded[g] + t - offs[g].
  PT_GROUP_ROWS_GATHER = 1,
};

// Rows of row_bytes bytes, copied bit for bit; every y row no group covers is written with zeros.
typedef struct PtGroupRowsParams {
  const void* x;
  void* y;
  int64_t x_rows, y_rows, row_bytes;
  int32_t mode, groups, align;
  const void* lens;  // [groups] or null (gather only)
  int32_t lens_bytes;
  const void* offs;  // [groups + 1] or null (pad only)
  int32_t offs_bytes;
  const void* offs_padded;  // gather: [groups + 1]
  int32_t offs_padded_bytes;
  int64_t* lens_out;  // pad: [groups] or null
  int64_t* offs_out;  // pad: [groups + 1] or null
  void* stream;       // cudaStream_t
} PtGroupRowsParams;

typedef int (*PtGroupRowsFn)(const PtGroupRowsParams* params, char* err, size_t err_len);

#ifdef __cplusplus
}

#define PT_JIT_EXPORT_GROUP_ROWS(Kernel)                                                        \
  PT_JIT_EXPORT_ABI_VERSION                                                                     \
  extern "C" __attribute__((visibility("default"))) int pt_group_rows_run(                      \
      const PtGroupRowsParams* params, char* err, size_t err_len) {                             \
    return Kernel::run(params, err, err_len);                                                   \
  }
#endif
