// flash attention's training op with its autograd in C++: primus_turbo::attention_train runs the
// native forward (attention_fwd), saves its inputs, out and lse, and the backward is one
// attention_bwd call. The Python FlashAttnFunction does the same where this library is not loaded.
#include "autograd_common.h"

#include <tuple>

namespace {

using namespace primus_turbo::torch_autograd;

using FwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
                                          const OptTensor&, const OptTensor&, int64_t, int64_t, double, int64_t,
                                          int64_t, int64_t);
using BwdSig = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                          const Tensor&, const Tensor&, const OptTensor&,
                                                          const OptTensor&, const OptTensor&, int64_t, int64_t,
                                                          double, int64_t, int64_t, int64_t, bool);

struct AttentionFunction : public torch::autograd::Function<AttentionFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const OptTensor& sink, const OptTensor& cu_q, const OptTensor& cu_k, int64_t max_q,
                               int64_t max_k, double scale, int64_t wl, int64_t wr, int64_t backend,
                               bool deterministic) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<FwdSig>("primus_turbo::attention_fwd");
    auto [out, lse] = fwd.call(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, backend);
    ctx->save_for_backward({q, k, v, out, lse, sink.value_or(Tensor()), cu_q.value_or(Tensor()),
                            cu_k.value_or(Tensor())});
    ctx->saved_data["i"] = std::vector<int64_t>{max_q, max_k, wl, wr, backend, deterministic ? 1 : 0};
    ctx->saved_data["scale"] = scale;
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);  // no zero-filled gradient for lse on every backward
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = op<BwdSig>("primus_turbo::attention_bwd");
    if (!grads[0].defined()) return variable_list(13);  // out was not used
    const variable_list s = ctx->get_saved_variables();
    const auto i = ctx->saved_data["i"].toIntVector();
    auto [dq, dk, dv, dsink] = bwd.call(grads[0], s[0], s[1], s[2], s[3], s[4], present(s[5]), present(s[6]),
                                        present(s[7]), i[0], i[1], ctx->saved_data["scale"].toDouble(), i[2], i[3],
                                        i[4], i[5] != 0);
    variable_list result(13);
    result[0] = dq;
    result[1] = dk;
    result[2] = dv;
    if (s[5].defined()) result[3] = dsink;
    return result;
  }
};

std::tuple<Tensor, Tensor> attention_train_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                                    const OptTensor& sink, const OptTensor& cu_q,
                                                    const OptTensor& cu_k, int64_t max_q, int64_t max_k, double scale,
                                                    int64_t wl, int64_t wr, int64_t backend, bool deterministic) {
  const variable_list r =
      AttentionFunction::apply(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, backend, deterministic);
  return {r[0], r[1]};
}

// Below autograd (no gradient will be asked for): the forward alone.
std::tuple<Tensor, Tensor> attention_train_forward_only(const Tensor& q, const Tensor& k, const Tensor& v,
                                                        const OptTensor& sink, const OptTensor& cu_q,
                                                        const OptTensor& cu_k, int64_t max_q, int64_t max_k,
                                                        double scale, int64_t wl, int64_t wr, int64_t backend, bool) {
  static const auto fwd = op<FwdSig>("primus_turbo::attention_fwd");
  return fwd.call(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, backend);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("attention_train(Tensor q, Tensor k, Tensor v, Tensor? sink, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
        "int max_seqlen_q, int max_seqlen_k, float softmax_scale, int window_left, int window_right, int backend, "
        "bool deterministic) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(primus_turbo, Autograd, m) { m.impl("attention_train", attention_train_autograd); }
TORCH_LIBRARY_IMPL(primus_turbo, CUDA, m) { m.impl("attention_train", attention_train_forward_only); }
