// token_permute's and token_unpermute's training ops with their autograd in C++:
// primus_turbo::token_permute_train / token_unpermute_train run the native forward
// (moe_token_permute / moe_token_unpermute) and their backward is one native call (the other
// direction's op; moe_token_scatter / moe_token_unpermute_bwd for a merging unpermute). The Python
// _Permute / _Unpermute do the same where this library is not loaded. Likewise moe_permute's and
// moe_unpermute's: primus_turbo::moe_permute_train / moe_unpermute_train run moe_index_permute /
// moe_index_gather, and each backward is the other direction's gather or scatter (the Python
// _MoePermute / _MoeUnpermute otherwise).
#include "autograd_common.h"

#include <ATen/ops/zeros.h>

#include <tuple>
#include <vector>

namespace {

using namespace primus_turbo::torch_autograd;

using PermuteSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&, int64_t);
using UnpermuteSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&, const OptTensor&);
using ScatterSig = Tensor(const Tensor&, const Tensor&, int64_t);
using UnpermuteBwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&);
using IndexPermuteSig = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, int64_t, int64_t, int64_t, bool);
using IndexGatherSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&, c10::SymInt, int64_t,
                                                  int64_t);
using IndexScatterSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&, c10::SymInt,
                                                   int64_t);

// A gradient that did not arrive, as zeros of the output it stands for ({rows, cols} and dtype).
Tensor zeros_like_output(const Tensor& like_device, int64_t rows, int64_t cols, int64_t dtype) {
  return at::zeros({rows, cols}, like_device.options().dtype(static_cast<c10::ScalarType>(dtype)));
}

struct TokenPermuteFunction : public torch::autograd::Function<TokenPermuteFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& tokens, const Tensor& routing_map,
                               const OptTensor& probs, int64_t num_out) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<PermuteSig>("primus_turbo::moe_token_permute");
    auto [out, pprobs, row_id_map] = fwd.call(tokens, routing_map, probs, num_out);
    ctx->save_for_backward({row_id_map});
    ctx->saved_data["p"] = probs.has_value();
    // What a gradient one output did not get is made of (only then): out's rows, hidden size and
    // dtype, and the permuted probabilities' dtype.
    ctx->saved_data["o"] = std::vector<int64_t>{out.size(0), out.size(1), static_cast<int64_t>(out.scalar_type()),
                                                static_cast<int64_t>(pprobs.scalar_type())};
    ctx->mark_non_differentiable({row_id_map});
    ctx->set_materialize_grads(false);  // no zero-filled gradient for the map or an unused output
    return {out, pprobs, row_id_map};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto unpermute = op<UnpermuteSig>("primus_turbo::moe_token_unpermute");
    Tensor g_out = grads[0], g_pprobs = grads[1];
    if (!g_out.defined() && !g_pprobs.defined()) return variable_list(4);
    const Tensor row_id_map = ctx->get_saved_variables()[0];
    const bool with_probs = ctx->saved_data["p"].toBool();
    const auto o = ctx->saved_data["o"].toIntVector();
    if (!g_out.defined()) g_out = zeros_like_output(row_id_map, o[0], o[1], o[2]);
    OptTensor pp;
    if (with_probs)
      pp = g_pprobs.defined() ? g_pprobs
                              : at::zeros({o[0]}, row_id_map.options().dtype(static_cast<c10::ScalarType>(o[3])));
    auto [grad_tokens, grad_probs] = unpermute.call(g_out, row_id_map, std::nullopt, pp);
    return {grad_tokens, Tensor(), with_probs ? grad_probs : Tensor(), Tensor()};
  }
};

struct TokenUnpermuteFunction : public torch::autograd::Function<TokenUnpermuteFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& inp, const Tensor& row_id_map,
                        const OptTensor& merging_probs) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<UnpermuteSig>("primus_turbo::moe_token_unpermute");
    Tensor out = std::get<0>(fwd.call(inp, row_id_map, merging_probs, std::nullopt));
    // The input is kept only where the probabilities' gradient reads it.
    ctx->save_for_backward({merging_probs ? inp : Tensor(), row_id_map, merging_probs.value_or(Tensor())});
    ctx->saved_data["rows"] = inp.size(0);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto scatter = op<ScatterSig>("primus_turbo::moe_token_scatter");
    static const auto bwd = op<UnpermuteBwdSig>("primus_turbo::moe_token_unpermute_bwd");
    const variable_list s = ctx->get_saved_variables();
    if (!s[2].defined()) return {scatter.call(grads[0], s[1], ctx->saved_data["rows"].toInt()), Tensor(), Tensor()};
    auto [grad_in, grad_probs] = bwd.call(grads[0], s[0], s[1], s[2]);
    return {grad_in, Tensor(), grad_probs};
  }
};

std::tuple<Tensor, Tensor, Tensor> token_permute_train_autograd(const Tensor& tokens, const Tensor& routing_map,
                                                                const OptTensor& probs, int64_t num_out) {
  const variable_list r = TokenPermuteFunction::apply(tokens, routing_map, probs, num_out);
  return {r[0], r[1], r[2]};
}

std::tuple<Tensor, Tensor, Tensor> token_permute_train_forward_only(const Tensor& tokens, const Tensor& routing_map,
                                                                    const OptTensor& probs, int64_t num_out) {
  static const auto fwd = op<PermuteSig>("primus_turbo::moe_token_permute");
  return fwd.call(tokens, routing_map, probs, num_out);
}

Tensor token_unpermute_train_autograd(const Tensor& inp, const Tensor& row_id_map, const OptTensor& merging_probs) {
  return TokenUnpermuteFunction::apply(inp, row_id_map, merging_probs);
}

Tensor token_unpermute_train_forward_only(const Tensor& inp, const Tensor& row_id_map,
                                          const OptTensor& merging_probs) {
  static const auto fwd = op<UnpermuteSig>("primus_turbo::moe_token_unpermute");
  return std::get<0>(fwd.call(inp, row_id_map, merging_probs, std::nullopt));
}

// moe_permute (16-bit or fp32 tokens): (out, row_id_map, tokens_per_expert, overflow, dispatched,
// scales, permuted_probs); out and permuted_probs are differentiable, both back through one gather.
struct MoePermuteFunction : public torch::autograd::Function<MoePermuteFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& tokens, const Tensor& expert_map,
                               const OptTensor& probs, int64_t num_experts, int64_t pad_multiple, int64_t num_out,
                               bool probs_topk, int64_t width) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<IndexPermuteSig>("primus_turbo::moe_index_permute");
    auto [out, row_id_map, tpe, overflow, dispatched, scales, pprobs] =
        fwd.call(tokens, expert_map, probs, std::nullopt, num_experts, pad_multiple, num_out, probs_topk);
    ctx->save_for_backward({row_id_map});
    ctx->saved_data["p"] = probs.has_value();
    ctx->saved_data["o"] = std::vector<int64_t>{tokens.size(0), num_experts, width, out.size(0), out.size(1),
                                                static_cast<int64_t>(out.scalar_type())};
    ctx->mark_non_differentiable({row_id_map, tpe, overflow, dispatched, scales});
    ctx->set_materialize_grads(false);  // no zero-filled gradients for the five integer outputs
    return {out, row_id_map, tpe, overflow, dispatched, scales, pprobs};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto gather = op<IndexGatherSig>("primus_turbo::moe_index_gather");
    variable_list result(8);
    Tensor g_out = grads[0], g_probs = grads[6];
    if (!g_out.defined() && !g_probs.defined()) return result;
    const Tensor row_id_map = ctx->get_saved_variables()[0];
    const auto o = ctx->saved_data["o"].toIntVector();  // tokens, experts, width, out rows, hidden, dtype
    if (!g_out.defined()) g_out = zeros_like_output(row_id_map, o[3], o[4], o[5]);
    const bool probs_grad = ctx->saved_data["p"].toBool() && g_probs.defined();
    auto [grad_tokens, grad_probs] = gather.call(g_out, row_id_map, probs_grad ? OptTensor(g_probs) : std::nullopt,
                                                 c10::SymInt(o[0]), o[1], o[2]);
    result[0] = grad_tokens;
    if (probs_grad) result[2] = grad_probs;
    return result;
  }
};

// moe_unpermute: (out [num_tokens, H], probs [num_tokens, width] or [0]); both differentiable, back
// through one scatter.
struct MoeUnpermuteFunction : public torch::autograd::Function<MoeUnpermuteFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& inp, const Tensor& row_id_map,
                               const OptTensor& permuted_probs, int64_t num_tokens, int64_t num_experts,
                               int64_t width) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<IndexGatherSig>("primus_turbo::moe_index_gather");
    auto [out, probs] = fwd.call(inp, row_id_map, permuted_probs, c10::SymInt(num_tokens), num_experts, width);
    ctx->save_for_backward({row_id_map});
    ctx->saved_data["p"] = permuted_probs.has_value();
    ctx->saved_data["o"] = std::vector<int64_t>{inp.size(0), num_experts, out.size(0), out.size(1),
                                                static_cast<int64_t>(out.scalar_type())};
    ctx->set_materialize_grads(false);  // no zero-filled gradient for an unused output
    return {out, probs};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto scatter = op<IndexScatterSig>("primus_turbo::moe_index_scatter");
    variable_list result(6);
    Tensor g_out = grads[0], g_probs = grads[1];
    if (!g_out.defined() && !g_probs.defined()) return result;
    const Tensor row_id_map = ctx->get_saved_variables()[0];
    const auto o = ctx->saved_data["o"].toIntVector();  // rows, experts, out rows, hidden, dtype
    if (!g_out.defined()) g_out = zeros_like_output(row_id_map, o[2], o[3], o[4]);
    const bool probs_grad = ctx->saved_data["p"].toBool() && g_probs.defined();
    auto [grad_in, grad_probs] =
        scatter.call(g_out, row_id_map, probs_grad ? OptTensor(g_probs) : std::nullopt, c10::SymInt(o[0]), o[1]);
    result[0] = grad_in;
    if (probs_grad) result[2] = grad_probs;
    return result;
  }
};

using MoePermuteOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

MoePermuteOut moe_permute_train_autograd(const Tensor& tokens, const Tensor& expert_map, const OptTensor& probs,
                                         int64_t num_experts, int64_t pad_multiple, int64_t num_out, bool probs_topk,
                                         int64_t width) {
  const variable_list r = MoePermuteFunction::apply(tokens, expert_map, probs, num_experts, pad_multiple, num_out,
                                                    probs_topk, width);
  return {r[0], r[1], r[2], r[3], r[4], r[5], r[6]};
}

MoePermuteOut moe_permute_train_forward_only(const Tensor& tokens, const Tensor& expert_map, const OptTensor& probs,
                                             int64_t num_experts, int64_t pad_multiple, int64_t num_out,
                                             bool probs_topk, int64_t) {
  static const auto fwd = op<IndexPermuteSig>("primus_turbo::moe_index_permute");
  return fwd.call(tokens, expert_map, probs, std::nullopt, num_experts, pad_multiple, num_out, probs_topk);
}

std::tuple<Tensor, Tensor> moe_unpermute_train_autograd(const Tensor& inp, const Tensor& row_id_map,
                                                        const OptTensor& permuted_probs, int64_t num_tokens,
                                                        int64_t num_experts, int64_t width) {
  const variable_list r = MoeUnpermuteFunction::apply(inp, row_id_map, permuted_probs, num_tokens, num_experts, width);
  return {r[0], r[1]};
}

std::tuple<Tensor, Tensor> moe_unpermute_train_forward_only(const Tensor& inp, const Tensor& row_id_map,
                                                            const OptTensor& permuted_probs, int64_t num_tokens,
                                                            int64_t num_experts, int64_t width) {
  static const auto fwd = op<IndexGatherSig>("primus_turbo::moe_index_gather");
  return fwd.call(inp, row_id_map, permuted_probs, c10::SymInt(num_tokens), num_experts, width);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("token_permute_train(Tensor tokens, Tensor routing_map, Tensor? probs, int num_out) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("token_unpermute_train(Tensor input, Tensor row_id_map, Tensor? merging_probs) -> Tensor");
  m.def("moe_permute_train(Tensor tokens, Tensor expert_map, Tensor? probs, int num_experts, int pad_multiple, "
        "int num_out, bool probs_topk, int width) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("moe_unpermute_train(Tensor input, Tensor row_id_map, Tensor? permuted_probs, int num_tokens, "
        "int num_experts, int width) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(primus_turbo, Autograd, m) {
  m.impl("token_permute_train", token_permute_train_autograd);
  m.impl("token_unpermute_train", token_unpermute_train_autograd);
  m.impl("moe_permute_train", moe_permute_train_autograd);
  m.impl("moe_unpermute_train", moe_unpermute_train_autograd);
}

TORCH_LIBRARY_IMPL(primus_turbo, CUDA, m) {
  m.impl("token_permute_train", token_permute_train_forward_only);
  m.impl("token_unpermute_train", token_unpermute_train_forward_only);
  m.impl("moe_permute_train", moe_permute_train_forward_only);
  m.impl("moe_unpermute_train", moe_unpermute_train_forward_only);
}
