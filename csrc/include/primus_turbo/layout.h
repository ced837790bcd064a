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

/* Grouped tokens (G <= 1024 groups, e.g. experts) between their tight layout and a padded one in
   which every group starts at a multiple of `align` rows (what block quantization along the tokens
   needs: no block spans two groups). x and y are 2-D [rows, C], contiguous, the same dtype; rows
   are copied bit for bit and every y row no group covers is written with zeros. Index tensors are
   1-D int32 or int64 on the device. No host synchronization.
   pt_group_pad_rows: group g (group_lens[g] rows, negative as 0, at group_offs[g], or back to back
   when group_offs is null; clamped into x) goes to y at the running sum of the groups before it,
   each rounded up to `align`; rows past y's end are dropped. lens_out [G] / offs_out [G + 1]
   (int64, either may be null) receive the padded lens of max(group_lens, 0) and their offsets. */
PT_API pt_status pt_group_pad_rows(const pt_tensor* x, const pt_tensor* group_lens, const pt_tensor* group_offs,
                                   int64_t align, pt_tensor* y, pt_tensor* lens_out, pt_tensor* offs_out,
                                   void* stream);
/* The inverse: y row t of group g (group_offs[g] <= t < group_offs[g + 1], or < group_offs[g] +
   group_lens[g] with group_lens; group_offs non-decreasing) is x row group_offs_padded[g] + t -
   group_offs[g]; rows of no group, or whose source lies outside x, are zeros. */
PT_API pt_status pt_group_gather_rows(const pt_tensor* x, const pt_tensor* group_offs,
                                      const pt_tensor* group_offs_padded, const pt_tensor* group_lens, pt_tensor* y,
                                      void* stream);
/* Compiles (or loads from the cache) the grouped-rows module without running it. Needs no GPU. */
PT_API pt_status pt_group_rows_prepare(void);

#ifdef __cplusplus
}
#endif
