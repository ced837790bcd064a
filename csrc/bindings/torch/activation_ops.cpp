// primus_turbo::gated_act_fwd / gated_act_bwd: SwiGLU / GeGLU (optionally with per-row probs and a
// row mask), forward and backward, each one native call: output allocation and the launch. The
// core checks shapes and dtypes; the Python layer has made x, probs and row_mask contiguous.
// The _amax twins also return max |output| (float32 [1]) for a tensorwise FP8 quantization of
// the output that then skips its own amax pass.
#include <optional>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/ops.h>

#include "bindings/torch/activation_run.h"
#include "primus_turbo/activation.h"

namespace primus_turbo::torch_binding {

namespace {

int32_t check_devices(const char* op, NamedTensors all, const std::optional<Tensor>& probs,
                      const std::optional<Tensor>& row_mask) {
  add_present(all, "probs", probs);
  add_present(all, "row_mask", row_mask);
  return check_cuda(op, all);
}

}  // namespace

Tensor gated_act_forward(const Tensor& x, const std::optional<Tensor>& probs, const std::optional<Tensor>& row_mask,
                         int64_t act, std::optional<Tensor>* amax) {
  const int32_t device = check_devices("gated activation", {{"x", &x}}, probs, row_mask);
  if (x.dim() < 1 || x.sizes()[x.dim() - 1] % 2)
    fail_with(ErrorKind::Value, "gated activation: x has shape ", shape_string(x), "; expected [..., 2H]");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() /= 2;
  Tensor out = empty(shape.data(), static_cast<int64_t>(shape.size()), x.scalar_type(), device);
  if (amax) *amax = empty({1}, ScalarType::Float, device);
  if (out.numel() == 0) {
    if (amax) torch::stable::zero_(**amax);
    return out;
  }
  const pt_tensor px = to_pt(x);
  pt_tensor po = to_pt(out);
  std::optional<pt_tensor> pa;
  if (amax) pa = to_pt(**amax);
  OptionalPt pp(probs), pm(row_mask);
  DeviceScope scope(device);
  check_status(pt_gated_act_fwd(static_cast<int32_t>(act), &px, pp.get(), pm.get(), &po, pa ? &*pa : nullptr,
                                current_stream(device)),
               "gated activation forward");
  return out;
}

namespace {

Tensor gated_act_fwd(Tensor x, std::optional<Tensor> probs, std::optional<Tensor> row_mask, int64_t act) {
  return gated_act_forward(x, probs, row_mask, act, nullptr);
}

std::tuple<Tensor, Tensor> gated_act_fwd_amax(Tensor x, std::optional<Tensor> probs, std::optional<Tensor> row_mask,
                                              int64_t act) {
  std::optional<Tensor> amax;
  Tensor out = gated_act_forward(x, probs, row_mask, act, &amax);
  return {out, *amax};
}

}  // namespace

std::tuple<Tensor, Tensor> gated_act_backward(const Tensor& dy, const Tensor& x, const std::optional<Tensor>& probs,
                                              const std::optional<Tensor>& row_mask, int64_t act, bool need_dprobs,
                                              std::optional<Tensor>* amax) {
  const int32_t device = check_devices("gated activation backward", {{"dy", &dy}, {"x", &x}}, probs, row_mask);
  need_dprobs = need_dprobs && probs.has_value();
  Tensor dx = torch_binding::empty_like(x);
  Tensor dprobs = empty({need_dprobs ? probs->numel() : 0}, ScalarType::Float, device);
  if (amax) *amax = empty({1}, ScalarType::Float, device);
  if (dx.numel() == 0) {
    if (need_dprobs) torch::stable::zero_(dprobs);
    if (amax) torch::stable::zero_(**amax);
    return {dx, dprobs};
  }
  const pt_tensor pdy = to_pt(dy), px = to_pt(x);
  pt_tensor pdx = to_pt(dx);
  std::optional<pt_tensor> pa;
  if (amax) pa = to_pt(**amax);
  OptionalPt pp(probs), pm(row_mask), pdp(need_dprobs ? std::optional<Tensor>(dprobs) : std::nullopt);
  DeviceScope scope(device);
  check_status(pt_gated_act_bwd(static_cast<int32_t>(act), &pdy, &px, pp.get(), pm.get(), &pdx, pdp.get(),
                                pa ? &*pa : nullptr, current_stream(device)),
               "gated activation backward");
  return {dx, dprobs};
}

namespace {

std::tuple<Tensor, Tensor> gated_act_bwd(Tensor dy, Tensor x, std::optional<Tensor> probs,
                                         std::optional<Tensor> row_mask, int64_t act, bool need_dprobs) {
  return gated_act_backward(dy, x, probs, row_mask, act, need_dprobs, nullptr);
}

std::tuple<Tensor, Tensor, Tensor> gated_act_bwd_amax(Tensor dy, Tensor x, std::optional<Tensor> probs,
                                                       std::optional<Tensor> row_mask, int64_t act,
                                                       bool need_dprobs) {
  std::optional<Tensor> amax;
  auto [dx, dprobs] = gated_act_backward(dy, x, probs, row_mask, act, need_dprobs, &amax);
  return {dx, dprobs, *amax};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("gated_act_fwd(Tensor x, Tensor? probs, Tensor? row_mask, int act) -> Tensor");
  m.def("gated_act_bwd(Tensor dy, Tensor x, Tensor? probs, Tensor? row_mask, int act, bool need_dprobs) -> "
        "(Tensor, Tensor)");
  m.def("gated_act_fwd_amax(Tensor x, Tensor? probs, Tensor? row_mask, int act) -> (Tensor, Tensor)");
  m.def("gated_act_bwd_amax(Tensor dy, Tensor x, Tensor? probs, Tensor? row_mask, int act, bool need_dprobs) -> "
        "(Tensor, Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("gated_act_fwd", TORCH_BOX(&gated_act_fwd));
  m.impl("gated_act_bwd", TORCH_BOX(&gated_act_bwd));
  m.impl("gated_act_fwd_amax", TORCH_BOX(&gated_act_fwd_amax));
  m.impl("gated_act_bwd_amax", TORCH_BOX(&gated_act_bwd_amax));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
