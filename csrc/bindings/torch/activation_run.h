// The gated activations of activation_ops.cpp (SwiGLU / GeGLU, with optional per-row probs and row
// mask), for the other native ops built on them (swiglu_mlp_fp8_ops.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>

#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

// act(x[..., :H]) * x[..., H:] -> [..., H]. With amax (may be null): also max |out|, into a
// float32 [1] allocated here after the checks (zero for an empty out).
Tensor gated_act_forward(const Tensor& x, const std::optional<Tensor>& probs, const std::optional<Tensor>& row_mask,
                         int64_t act, std::optional<Tensor>* amax);

// (dx, dprobs): dprobs float32 [probs.numel()] when need_dprobs, else [0]. With amax: also max
// |dx|, as above.
std::tuple<Tensor, Tensor> gated_act_backward(const Tensor& dy, const Tensor& x, const std::optional<Tensor>& probs,
                                              const std::optional<Tensor>& row_mask, int64_t act, bool need_dprobs,
                                              std::optional<Tensor>* amax);

}  // namespace primus_turbo::torch_binding
