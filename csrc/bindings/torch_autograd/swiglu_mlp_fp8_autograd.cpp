// swiglu_mlp_fp8's training op with its autograd in C++: primus_turbo::swiglu_mlp_fp8_train(x,
// w_gate_up, w_down, ...) -> y runs swiglu_mlp_fp8_fwd and saves what its backward reads; the
// backward is one swiglu_mlp_fp8_bwd call. The Python SwigluMlpFp8Function does the same where
// this library is not loaded.
#include "autograd_common.h"

#include <tuple>

namespace {

using namespace primus_turbo::torch_autograd;

using FwdSig = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, c10::ScalarType, bool);
using InferSig = Tensor(const Tensor&, const Tensor&, const Tensor&, c10::ScalarType, bool);
using BwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                  const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                  const Tensor&, const Tensor&, c10::ScalarType, bool, bool, bool);

struct SwigluMlpFp8Function : public torch::autograd::Function<SwigluMlpFp8Function> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w_gate_up, const Tensor& w_down,
                        c10::ScalarType fwd_dtype, c10::ScalarType grad_dtype, bool fast_accum) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<FwdSig>("primus_turbo::swiglu_mlp_fp8_fwd");
    auto [y, h, x_bwd, sx_bwd, wgu_bwd, swgu_bwd, a_bwd, sa_bwd, wd_bwd, swd_bwd] =
        fwd.call(x, w_gate_up, w_down, fwd_dtype, fast_accum);
    ctx->save_for_backward({h, x_bwd, sx_bwd, wgu_bwd, swgu_bwd, a_bwd, sa_bwd, wd_bwd, swd_bwd});
    ctx->saved_data["g"] = static_cast<int64_t>(grad_dtype);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = op<BwdSig>("primus_turbo::swiglu_mlp_fp8_bwd");
    const variable_list s = ctx->get_saved_variables();
    const bool need_x = ctx->needs_input_grad(0), need_wgu = ctx->needs_input_grad(1);
    const bool need_wd = ctx->needs_input_grad(2);
    auto [dx, dwgu, dwd] = bwd.call(grads[0], s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8],
                                    static_cast<c10::ScalarType>(ctx->saved_data["g"].toInt()), need_x, need_wgu,
                                    need_wd);
    return {need_x ? dx : Tensor(), need_wgu ? dwgu : Tensor(), need_wd ? dwd : Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor swiglu_mlp_fp8_train_autograd(const Tensor& x, const Tensor& w_gate_up, const Tensor& w_down,
                                     c10::ScalarType fwd_dtype, c10::ScalarType grad_dtype, bool fast_accum) {
  return SwigluMlpFp8Function::apply(x, w_gate_up, w_down, fwd_dtype, grad_dtype, fast_accum);
}

// Below autograd (no gradient will be asked for): the inference op.
Tensor swiglu_mlp_fp8_train_forward_only(const Tensor& x, const Tensor& w_gate_up, const Tensor& w_down,
                                         c10::ScalarType fwd_dtype, c10::ScalarType, bool fast_accum) {
  static const auto infer = op<InferSig>("primus_turbo::swiglu_mlp_fp8");
  return infer.call(x, w_gate_up, w_down, fwd_dtype, fast_accum);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("swiglu_mlp_fp8_train(Tensor x, Tensor w_gate_up, Tensor w_down, ScalarType fwd_dtype, "
        "ScalarType grad_dtype, bool fast_accum=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(primus_turbo, Autograd, m) { m.impl("swiglu_mlp_fp8_train", swiglu_mlp_fp8_train_autograd); }
TORCH_LIBRARY_IMPL(primus_turbo, CUDA, m) { m.impl("swiglu_mlp_fp8_train", swiglu_mlp_fp8_train_forward_only); }
