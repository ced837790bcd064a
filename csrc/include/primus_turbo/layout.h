/* Layout changes the GEMMs of a training step need between their operands. */
#pragma once

#include "primus_turbo/primus_turbo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[b] = x[b]^T: x [batch, rows, cols] (or 2-D [rows, cols], batch 1) -> y [batch, cols, rows]
   (2-D: [cols, rows]), the same dtype of 1, 2 or 4 bytes (FP8, FP4 pairs, bf16/fp16, fp32, ...),
   both contiguous, copied bit for bit. No host synchronization. */
PT_API pt_status pt_transpose_last2(const pt_tensor* x, pt_tensor* y, void* stream);
/* Compiles (or loads from the cache) the module for one element size (1, 2 or 4 bytes) without
   running it. Needs no GPU. */
PT_API pt_status pt_transpose_prepare(int32_t element_bytes);

#ifdef __cplusplus
}
#endif
