// rope's training op with its autograd in C++: primus_turbo::rope_train(q, k, ...) -> (q_out, k_out)
// runs the native rope forward and saves its tables; the backward is the same op run as the inverse
// rotation. The Python RopeFunction does the same where this library is not loaded.
#include "autograd_common.h"

#include <tuple>

namespace {

using namespace primus_turbo::torch_autograd;

using RopeSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
                                           const OptTensor&, const OptTensor&, int64_t, double, bool, int64_t, bool);

const c10::TypedOperatorHandle<RopeSig>& rope_op() {
  static const auto handle = op<RopeSig>("primus_turbo::rope");
  return handle;
}

struct RopeFunction : public torch::autograd::Function<RopeFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const OptTensor& cos,
                               const OptTensor& sin, const OptTensor& positions, const OptTensor& cu_seqlens,
                               int64_t rotary_dim, double theta, bool interleaved, int64_t layout) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [q_out, k_out] =
        rope_op().call(q, k, cos, sin, positions, cu_seqlens, rotary_dim, theta, interleaved, layout, false);
    ctx->save_for_backward({cos.value_or(Tensor()), sin.value_or(Tensor()), positions.value_or(Tensor()),
                            cu_seqlens.value_or(Tensor())});
    ctx->saved_data["r"] = rotary_dim;
    ctx->saved_data["t"] = theta;
    ctx->saved_data["i"] = interleaved;
    ctx->saved_data["l"] = layout;
    return {q_out, k_out};
  }

  // The gradients (zeros where an output went unused) rotated back.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    auto [dq, dk] = rope_op().call(grads[0], grads[1], present(s[0]), present(s[1]), present(s[2]), present(s[3]),
                                   ctx->saved_data["r"].toInt(), ctx->saved_data["t"].toDouble(),
                                   ctx->saved_data["i"].toBool(), ctx->saved_data["l"].toInt(), true);
    variable_list out(10);
    out[0] = dq;
    out[1] = dk;
    return out;
  }
};

std::tuple<Tensor, Tensor> rope_train_autograd(const Tensor& q, const Tensor& k, const OptTensor& cos,
                                               const OptTensor& sin, const OptTensor& positions,
                                               const OptTensor& cu_seqlens, int64_t rotary_dim, double theta,
                                               bool interleaved, int64_t layout) {
  auto out = RopeFunction::apply(q, k, cos, sin, positions, cu_seqlens, rotary_dim, theta, interleaved, layout);
  return {out[0], out[1]};
}

// Below autograd (no gradient will be asked for): the forward alone.
std::tuple<Tensor, Tensor> rope_train_forward_only(const Tensor& q, const Tensor& k, const OptTensor& cos,
                                                   const OptTensor& sin, const OptTensor& positions,
                                                   const OptTensor& cu_seqlens, int64_t rotary_dim, double theta,
                                                   bool interleaved, int64_t layout) {
  return rope_op().call(q, k, cos, sin, positions, cu_seqlens, rotary_dim, theta, interleaved, layout, false);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("rope_train(Tensor q, Tensor k, Tensor? cos, Tensor? sin, Tensor? positions, Tensor? cu_seqlens, "
        "int rotary_dim, float theta, bool interleaved, int layout) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(primus_turbo, Autograd, m) { m.impl("rope_train", rope_train_autograd); }
TORCH_LIBRARY_IMPL(primus_turbo, CUDA, m) { m.impl("rope_train", rope_train_forward_only); }
