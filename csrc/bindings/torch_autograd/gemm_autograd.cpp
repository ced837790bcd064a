// The autograd of primus_turbo::gemm in C++ (the Autograd dispatch key), so that a differentiable
// eager call crosses no Python between the op and its backward: torch's stable C ABI has no
// autograd, so this file uses torch's full C++ API and is built against the installed torch (the
// ops themselves stay in the stable-ABI library). Where it is not loaded, the Python
// autograd.Function (primus_turbo/pytorch/ops/gemm.py) does the same.
#include "autograd_common.h"

namespace {

using namespace primus_turbo::torch_autograd;

Tensor call_gemm(const Tensor& a, const Tensor& b, bool ta, bool tb, c10::ScalarType out_dtype) {
  static const auto gemm = op<Tensor(const Tensor&, const Tensor&, bool, bool, c10::ScalarType)>("primus_turbo::gemm");
  return gemm.call(a, b, ta, tb, out_dtype);
}

// out = op(a) @ op(b); the backward writes each gradient in its operand's own orientation, as
// GemmFunction.backward does.
struct GemmFunction : public torch::autograd::Function<GemmFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b, bool ta, bool tb,
                        c10::ScalarType out_dtype) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({a, b});
    ctx->saved_data["t"] = static_cast<int64_t>(ta) | (static_cast<int64_t>(tb) << 1);
    return call_gemm(a, b, ta, tb, out_dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor& a = saved[0];
    const Tensor& b = saved[1];
    const int64_t t = ctx->saved_data["t"].toInt();
    const bool ta = t & 1, tb = t & 2;
    Tensor g = grads[0];
    if (g.scalar_type() != a.scalar_type()) g = g.to(a.scalar_type());  // fp32 output of 16-bit operands
    Tensor grad_a, grad_b;
    if (ctx->needs_input_grad(0)) {  // d op(a) = grad @ op(b)^T
      grad_a = ta ? call_gemm(b, g, tb, true, a.scalar_type()) : call_gemm(g, b, false, !tb, a.scalar_type());
    }
    if (ctx->needs_input_grad(1)) {  // d op(b) = op(a)^T @ grad
      grad_b = tb ? call_gemm(g, a, true, ta, b.scalar_type()) : call_gemm(a, g, !ta, false, b.scalar_type());
    }
    return {grad_a, grad_b, Tensor(), Tensor(), Tensor()};
  }
};

Tensor gemm_autograd(const Tensor& a, const Tensor& b, bool ta, bool tb, c10::ScalarType out_dtype) {
  return GemmFunction::apply(a, b, ta, tb, out_dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(primus_turbo, Autograd, m) { m.impl("gemm", gemm_autograd); }
