// What the native grouped GEMM ops share (bf16 in grouped_gemm_ops.cpp, FP8 in
// grouped_gemm_fp8_ops.cpp): the group tensors' checks and the planned bf16/fp16 launch.
#pragma once

#include <cstdint>
#include <optional>

#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

// group_lens int64 [G >= 1] (G == num_groups unless num_groups < 0), group_offs int64 [G + 1];
// messages as ops/grouped_gemm.py: _check_groups. Returns G.
int64_t check_group_tensors(const Tensor& lens, const std::optional<Tensor>& offs, int64_t num_groups);

// PRIMUS_TURBO_CHECK_GROUP_LENS=1: reads the group sizes back (a host sync, so never during a CUDA
// graph capture) and rejects negative lengths and lengths that add up to more than the rows; the
// default path never synchronizes and instead clamps every group into the rows on the device.
void check_group_lens_on_host(const char* op, const Tensor& lens, int64_t rows, void* stream);

// The bf16/fp16 grouped GEMM into out (forward/dgrad, or the variable-K wgrad), on the cached plan
// of the problem (the planner picks it on first use).
void grouped_gemm_run(const Tensor& a, const Tensor& b, const Tensor& lens, const std::optional<Tensor>& offs,
                      const Tensor& out, bool wgrad, bool trans_b, int64_t num_sms, int32_t device);

}  // namespace primus_turbo::torch_binding
