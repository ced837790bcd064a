// The autograd of primus_turbo::grouped_gemm in C++ (its Autograd key): the dgrad is the same
// kernel reading b the other way round, the wgrad one grouped_gemm_wgrad call, as the Python
// GroupedGemmFunction does where this library is not loaded.
#include "autograd_common.h"


namespace {

using namespace primus_turbo::torch_autograd;

using Sig = Tensor(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, bool, int64_t);

struct GroupedGemmFunction : public torch::autograd::Function<GroupedGemmFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b, const Tensor& group_lens,
                        const OptTensor& group_offs, bool trans_b, int64_t num_sms) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<Sig>("primus_turbo::grouped_gemm");
    ctx->save_for_backward({a, b, group_lens, group_offs.value_or(Tensor())});
    ctx->saved_data["t"] = trans_b;
    ctx->saved_data["n"] = num_sms;
    return fwd.call(a, b, group_lens, group_offs, trans_b, num_sms);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto mm = op<Sig>("primus_turbo::grouped_gemm");
    static const auto wgrad = op<Sig>("primus_turbo::grouped_gemm_wgrad");
    const variable_list s = ctx->get_saved_variables();
    const OptTensor offs = s[3].defined() ? OptTensor(s[3]) : std::nullopt;
    const bool trans_b = ctx->saved_data["t"].toBool();
    const int64_t num_sms = ctx->saved_data["n"].toInt();
    Tensor grad_a, grad_b;
    if (ctx->needs_input_grad(0)) grad_a = mm.call(grads[0], s[1], s[2], offs, !trans_b, num_sms);
    if (ctx->needs_input_grad(1)) grad_b = wgrad.call(s[0], grads[0], s[2], offs, trans_b, num_sms);
    return {grad_a, grad_b, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor grouped_gemm_autograd(const Tensor& a, const Tensor& b, const Tensor& group_lens, const OptTensor& group_offs,
                             bool trans_b, int64_t num_sms) {
  return GroupedGemmFunction::apply(a, b, group_lens, group_offs, trans_b, num_sms);
}

}  // namespace

TORCH_LIBRARY_IMPL(primus_turbo, Autograd, m) { m.impl("grouped_gemm", grouped_gemm_autograd); }
