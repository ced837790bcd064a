// primus_turbo::moe_routing_fwd / _bwd, indices_to_multihot_fwd / _bwd, tokens_per_expert_to_mask:
// the MoE routing ops (ops/moe_routing.py checks the arguments) as native ops: outputs and the
// launch in one call each, no Python between them.
#include <optional>
#include <tuple>
#include <vector>

#include "bindings/torch/torch_binding.h"
#include "primus_turbo/moe_routing.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr const char* kRouting = "fused_group_topk_routing_with_aux_score";

// Returns (scores, probs, routing_map bool), each of logits' shape.
std::tuple<Tensor, Tensor, Tensor> moe_routing_fwd(Tensor logits_in, int64_t topk, int64_t groups,
                                                   int64_t selected_groups, bool softmax, double scaling) {
  const int32_t device = check_cuda(kRouting, {{"logits", &logits_in}});
  const Tensor logits = as_contiguous(logits_in);
  Tensor scores = torch_binding::empty_like(logits), probs = torch_binding::empty_like(logits);
  Tensor routing_map = torch_binding::empty_like(logits, ScalarType::Bool);
  if (logits.numel() == 0) return {scores, probs, routing_map};
  DeviceScope scope(device);
  const pt_tensor pl = to_pt(logits);
  pt_tensor ps = to_pt(scores), pp = to_pt(probs), pm = mask_to_pt(routing_map);
  check_status(pt_moe_routing_fwd(&pl, &ps, &pp, &pm, static_cast<int32_t>(topk), static_cast<int32_t>(groups),
                                  static_cast<int32_t>(selected_groups), softmax ? 1 : 0, static_cast<float>(scaling),
                                  current_stream(device)),
               "fused_group_topk_routing_with_aux_score forward");
  return {scores, probs, routing_map};
}

// The gradient wrt the logits from those of probs and scores (either absent: zero).
Tensor moe_routing_bwd(Tensor logits_in, Tensor routing_map_in, std::optional<Tensor> grad_probs_in,
                       std::optional<Tensor> grad_scores_in, int64_t topk, bool softmax, double scaling) {
  NamedTensors all{{"logits", &logits_in}, {"routing_map", &routing_map_in}};
  add_present(all, "grad_probs", grad_probs_in);
  add_present(all, "grad_scores", grad_scores_in);
  const int32_t device = check_cuda(kRouting, all);
  const Tensor logits = as_contiguous(logits_in), routing_map = as_contiguous(routing_map_in);
  std::optional<Tensor> grad_probs, grad_scores;
  if (grad_probs_in) grad_probs = as_contiguous(*grad_probs_in);
  if (grad_scores_in) grad_scores = as_contiguous(*grad_scores_in);
  Tensor grad = torch_binding::empty_like(logits);
  if (logits.numel() == 0) return grad;
  DeviceScope scope(device);
  const pt_tensor pl = to_pt(logits), pm = mask_to_pt(routing_map);
  OptionalPt pgp(grad_probs), pgs(grad_scores);
  pt_tensor pg = to_pt(grad);
  check_status(pt_moe_routing_bwd(&pl, &pm, pgp.get(), pgs.get(), &pg, static_cast<int32_t>(topk), softmax ? 1 : 0,
                                  static_cast<float>(scaling), current_stream(device)),
               "fused_group_topk_routing_with_aux_score backward");
  return grad;
}

// Returns (multihot bool [tokens, experts], probs_out [tokens, experts]: float32 or probs' dtype).
std::tuple<Tensor, Tensor> indices_to_multihot_fwd(Tensor indices_in, Tensor probs_in, int64_t num_experts,
                                                   bool float32_out) {
  const int32_t device = check_cuda("indices_to_multihot", {{"indices", &indices_in}, {"probs_indices", &probs_in}});
  if (indices_in.dim() != 2)
    fail_with(ErrorKind::Value, "indices_to_multihot: 'indices' must be 2-D, got ", shape_string(indices_in));
  const Tensor indices = as_contiguous(indices_in), probs = as_contiguous(probs_in);
  const int64_t t = indices.sizes()[0];
  Tensor multihot = empty({t, num_experts}, ScalarType::Bool, device);
  Tensor probs_out = empty({t, num_experts}, float32_out ? ScalarType::Float : probs.scalar_type(), device);
  if (multihot.numel() == 0) return {multihot, probs_out};
  DeviceScope scope(device);
  const pt_tensor pi = to_pt(indices), pp = to_pt(probs);
  pt_tensor pm = mask_to_pt(multihot), po = to_pt(probs_out);
  check_status(pt_indices_to_multihot_fwd(&pi, &pp, &pm, &po, current_stream(device)), "indices_to_multihot forward");
  return {multihot, probs_out};
}

// grad_probs [tokens, topk] of dtype from the gradient of probs_out.
Tensor indices_to_multihot_bwd(Tensor indices_in, Tensor grad_in, ScalarType dtype) {
  const int32_t device = check_cuda("indices_to_multihot", {{"indices", &indices_in}, {"grad_probs_out", &grad_in}});
  const Tensor indices = as_contiguous(indices_in), grad_out = as_contiguous(grad_in);
  Tensor grad = torch_binding::empty_like(indices, dtype);
  if (grad.numel() == 0) return grad;
  DeviceScope scope(device);
  const pt_tensor pi = to_pt(indices), pg = to_pt(grad_out);
  pt_tensor pr = to_pt(grad);
  check_status(pt_indices_to_multihot_bwd(&pi, &pg, &pr, current_stream(device)), "indices_to_multihot backward");
  return grad;
}

// mask [num_tokens] int64: 1 for the first sum(tokens_per_expert) tokens.
Tensor tokens_per_expert_to_mask(Tensor tokens_per_expert_in, int64_t num_tokens) {
  const int32_t device = check_cuda("tokens_per_expert_to_mask", {{"tokens_per_expert", &tokens_per_expert_in}});
  if (num_tokens < 0)
    fail_with(ErrorKind::Value, "tokens_per_expert_to_mask: num_tokens must be >= 0, got ", num_tokens);
  const Tensor tokens_per_expert = as_contiguous(tokens_per_expert_in);
  Tensor mask = empty({num_tokens}, ScalarType::Long, device);
  if (num_tokens == 0) return mask;
  DeviceScope scope(device);
  const pt_tensor pt = to_pt(tokens_per_expert);
  pt_tensor pm = to_pt(mask);
  check_status(pt_tokens_per_expert_to_mask(&pt, &pm, current_stream(device)), "tokens_per_expert_to_mask");
  return mask;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("moe_routing_fwd(Tensor logits, int topk, int groups, int selected_groups, bool softmax, float scaling) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("moe_routing_bwd(Tensor logits, Tensor routing_map, Tensor? grad_probs, Tensor? grad_scores, int topk, "
        "bool softmax, float scaling) -> Tensor");
  m.def("indices_to_multihot_fwd(Tensor indices, Tensor probs, int num_experts, bool float32_out) -> (Tensor, Tensor)");
  m.def("indices_to_multihot_bwd(Tensor indices, Tensor grad_probs_out, ScalarType dtype) -> Tensor");
  m.def("tokens_per_expert_to_mask(Tensor tokens_per_expert, int num_tokens) -> Tensor");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("moe_routing_fwd", TORCH_BOX(&moe_routing_fwd));
  m.impl("moe_routing_bwd", TORCH_BOX(&moe_routing_bwd));
  m.impl("indices_to_multihot_fwd", TORCH_BOX(&indices_to_multihot_fwd));
  m.impl("indices_to_multihot_bwd", TORCH_BOX(&indices_to_multihot_bwd));
  m.impl("tokens_per_expert_to_mask", TORCH_BOX(&tokens_per_expert_to_mask));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
