// rmsnorm's, rmsnorm_residual's and layernorm's training ops with their autograd in C++:
// primus_turbo::rmsnorm_train / rmsnorm_residual_train / layernorm_train run the native forward
// (rmsnorm_fwd / rmsnorm_residual_fwd / layernorm_fwd), save what its backward reads, and the
// backward is one native call. The Python RmsNormFunction / RmsNormResidualFunction /
// LayerNormFunction do the same where this library is not loaded.
#include "autograd_common.h"

#include <tuple>

namespace {

using namespace primus_turbo::torch_autograd;

using RmsFwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, double, bool);
using RmsBwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool);
using ResFwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, double, bool);
using ResBwd = std::tuple<Tensor, Tensor>(const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&,
                                          bool);
using LnFwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, double);
using LnBwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                 const Tensor&);

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& gamma, double eps, bool zero_centered) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<RmsFwd>("primus_turbo::rmsnorm_fwd");
    auto [y, rstd] = fwd.call(x, gamma, eps, zero_centered);
    ctx->save_for_backward({x, gamma, rstd});
    ctx->saved_data["z"] = zero_centered;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = op<RmsBwd>("primus_turbo::rmsnorm_bwd");
    const variable_list s = ctx->get_saved_variables();
    auto [dx, dgamma] = bwd.call(grads[0], s[0], s[1], s[2], ctx->saved_data["z"].toBool());
    return {dx, dgamma, Tensor(), Tensor()};
  }
};

// (norm(s), s) with s = x + residual; both outputs differentiable, either may go unused (its
// gradient is then not materialized: an unused s costs no zero-filled read).
struct RmsNormResidualFunction : public torch::autograd::Function<RmsNormResidualFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& residual, const Tensor& gamma,
                               double eps, bool zero_centered) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<ResFwd>("primus_turbo::rmsnorm_residual_fwd");
    auto [y, s, rstd] = fwd.call(x, residual, gamma, eps, zero_centered);
    ctx->save_for_backward({s, gamma, rstd});
    ctx->set_materialize_grads(false);
    ctx->saved_data["z"] = zero_centered;
    return {y, s};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = op<ResBwd>("primus_turbo::rmsnorm_residual_bwd");
    const variable_list saved = ctx->get_saved_variables();
    const Tensor& s = saved[0];
    const Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(s);
    auto [ds, dgamma] = bwd.call(dy, present(grads[1]), s, saved[1], saved[2], ctx->saved_data["z"].toBool());
    // d(x + residual)/dx = d/dresidual = 1: both inputs receive ds.
    return {ds, ds, dgamma, Tensor(), Tensor()};
  }
};

struct LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<LnFwd>("primus_turbo::layernorm_fwd");
    auto [y, mean, rstd] = fwd.call(x, gamma, beta, eps);
    ctx->save_for_backward({x, gamma, mean, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = op<LnBwd>("primus_turbo::layernorm_bwd");
    const variable_list s = ctx->get_saved_variables();
    auto [dx, dgamma, dbeta] = bwd.call(grads[0], s[0], s[1], s[2], s[3]);
    return {dx, dgamma, dbeta, Tensor()};
  }
};

Tensor rmsnorm_train_autograd(const Tensor& x, const Tensor& gamma, double eps, bool zero_centered) {
  return RmsNormFunction::apply(x, gamma, eps, zero_centered);
}

std::tuple<Tensor, Tensor> rmsnorm_residual_train_autograd(const Tensor& x, const Tensor& residual, const Tensor& gamma,
                                                           double eps, bool zero_centered) {
  auto out = RmsNormResidualFunction::apply(x, residual, gamma, eps, zero_centered);
  return {out[0], out[1]};
}

Tensor layernorm_train_autograd(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  return LayerNormFunction::apply(x, gamma, beta, eps);
}

// Below autograd (no gradient will be asked for): the forward alone.
Tensor rmsnorm_train_forward_only(const Tensor& x, const Tensor& gamma, double eps, bool zero_centered) {
  static const auto fwd = op<RmsFwd>("primus_turbo::rmsnorm_fwd");
  return std::get<0>(fwd.call(x, gamma, eps, zero_centered));
}

std::tuple<Tensor, Tensor> rmsnorm_residual_train_forward_only(const Tensor& x, const Tensor& residual,
                                                               const Tensor& gamma, double eps, bool zero_centered) {
  static const auto fwd = op<ResFwd>("primus_turbo::rmsnorm_residual_fwd");
  auto [y, s, rstd] = fwd.call(x, residual, gamma, eps, zero_centered);
  return {y, s};
}

Tensor layernorm_train_forward_only(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  static const auto fwd = op<LnFwd>("primus_turbo::layernorm_fwd");
  return std::get<0>(fwd.call(x, gamma, beta, eps));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("rmsnorm_train(Tensor x, Tensor gamma, float eps, bool zero_centered) -> Tensor");
  m.def("rmsnorm_residual_train(Tensor x, Tensor residual, Tensor gamma, float eps, bool zero_centered) -> "
        "(Tensor, Tensor)");
  m.def("layernorm_train(Tensor x, Tensor gamma, Tensor beta, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(primus_turbo, Autograd, m) {
  m.impl("rmsnorm_train", rmsnorm_train_autograd);
  m.impl("rmsnorm_residual_train", rmsnorm_residual_train_autograd);
  m.impl("layernorm_train", layernorm_train_autograd);
}

TORCH_LIBRARY_IMPL(primus_turbo, CUDA, m) {
  m.impl("rmsnorm_train", rmsnorm_train_forward_only);
  m.impl("rmsnorm_residual_train", rmsnorm_residual_train_forward_only);
  m.impl("layernorm_train", layernorm_train_forward_only);
}
