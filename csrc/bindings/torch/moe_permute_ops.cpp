// primus_turbo::moe_token_permute / moe_token_unpermute: the routing-mask token permutation
// (token_permute / token_unpermute and each other's backward) in one native call each: outputs,
// workspace and the launch, no Python between them. The core checks shapes, dtypes and the mask.
#include <optional>
#include <tuple>

#include "bindings/torch/torch_binding.h"
#include "primus_turbo/moe_permute.h"

namespace primus_turbo::torch_binding {

namespace {

// Returns (output [num_out, H], permuted_probs [num_out] or [0], row_id_map [T, E] int32).
std::tuple<Tensor, Tensor, Tensor> moe_token_permute(Tensor tokens_in, Tensor routing_map_in,
                                                     std::optional<Tensor> probs_in, int64_t num_out) {
  NamedTensors all{{"tokens", &tokens_in}, {"routing_map", &routing_map_in}};
  add_present(all, "probs", probs_in);
  const int32_t device = check_cuda("token_permute", all);
  if (tokens_in.dim() != 2 || routing_map_in.dim() != 2)
    fail_with(ErrorKind::Value, "token_permute: 'tokens' and 'routing_map' must be 2-D, got ", shape_string(tokens_in),
              " and ", shape_string(routing_map_in));
  if (num_out < 0) fail_with(ErrorKind::Value, "token_permute: num_out_tokens must be >= 0, got ", num_out);
  const Tensor tokens = as_contiguous(tokens_in), routing_map = as_contiguous(routing_map_in);
  std::optional<Tensor> probs;
  if (probs_in) probs = as_contiguous(*probs_in);
  const int64_t t = tokens.sizes()[0], h = tokens.sizes()[1], e = routing_map.sizes()[1];
  Tensor out = empty({num_out, h}, tokens.scalar_type(), device);
  Tensor row_id_map = empty({t, e}, ScalarType::Int, device);
  Tensor pprobs = empty({probs ? num_out : 0}, probs ? probs->scalar_type() : ScalarType::Float, device);
  Tensor workspace = empty({pt_moe_route_workspace_ints(t, static_cast<int32_t>(e))}, ScalarType::Int, device);
  pt_tensor pt_tokens = to_pt(tokens), pt_map = mask_to_pt(routing_map), pt_out = to_pt(out);
  pt_tensor pt_rows = to_pt(row_id_map), pt_ws = to_pt(workspace);
  OptionalPt pt_probs(probs), pt_pprobs(probs ? std::optional<Tensor>(pprobs) : std::nullopt);
  DeviceScope scope(device);
  check_status(pt_moe_permute(&pt_tokens, &pt_map, pt_probs.get(), &pt_out, pt_pprobs.get(), &pt_rows, &pt_ws,
                              current_stream(device)),
               "token_permute");
  return {out, pprobs, row_id_map};
}

// Returns (output [T, H], probs_grad [T, E] with permuted_probs, else [0] float32).
std::tuple<Tensor, Tensor> moe_token_unpermute(Tensor input_in, Tensor row_id_map_in,
                                               std::optional<Tensor> merging_probs_in,
                                               std::optional<Tensor> permuted_probs_in) {
  NamedTensors all{{"input", &input_in}, {"row_id_map", &row_id_map_in}};
  add_present(all, "merging_probs", merging_probs_in);
  add_present(all, "permuted_probs", permuted_probs_in);
  const int32_t device = check_cuda("token_unpermute", all);
  if (input_in.dim() != 2 || row_id_map_in.dim() != 2)
    fail_with(ErrorKind::Value, "token_unpermute: 'input' and 'row_id_map' must be 2-D, got ", shape_string(input_in),
              " and ", shape_string(row_id_map_in));
  const Tensor input = as_contiguous(input_in), row_id_map = as_contiguous(row_id_map_in);
  std::optional<Tensor> merging, permuted;
  if (merging_probs_in) merging = as_contiguous(*merging_probs_in);
  if (permuted_probs_in) permuted = as_contiguous(*permuted_probs_in);
  const int64_t t = row_id_map.sizes()[0], e = row_id_map.sizes()[1];
  Tensor out = empty({t, input.sizes()[1]}, input.scalar_type(), device);
  Tensor probs_grad = permuted ? empty({t, e}, permuted->scalar_type(), device) : empty({0}, ScalarType::Float, device);
  pt_tensor pt_in = to_pt(input), pt_rows = to_pt(row_id_map), pt_out = to_pt(out);
  OptionalPt pt_merge(merging), pt_perm(permuted), pt_grad(permuted ? std::optional<Tensor>(probs_grad) : std::nullopt);
  DeviceScope scope(device);
  check_status(pt_moe_unpermute(&pt_in, &pt_rows, pt_merge.get(), &pt_out, pt_perm.get(), pt_grad.get(),
                                current_stream(device)),
               "token_unpermute");
  return {out, probs_grad};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("moe_token_permute(Tensor tokens, Tensor routing_map, Tensor? probs, int num_out) -> (Tensor, Tensor, Tensor)");
  m.def("moe_token_unpermute(Tensor input, Tensor row_id_map, Tensor? merging_probs, Tensor? permuted_probs) -> "
        "(Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("moe_token_permute", TORCH_BOX(&moe_token_permute));
  m.impl("moe_token_unpermute", TORCH_BOX(&moe_token_unpermute));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
