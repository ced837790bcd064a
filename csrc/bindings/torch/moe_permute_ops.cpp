// primus_turbo::moe_token_permute / moe_token_unpermute: the routing-mask token permutation
// (token_permute / token_unpermute and each other's backward) in one native call each: outputs,
// workspace and the launch, no Python between them. The core checks shapes, dtypes and the mask.
// primus_turbo::moe_index_permute: moe_permute's forward (map build, sizing, scatter) likewise;
// moe_index_gather (moe_unpermute's forward, moe_permute's backward) and moe_index_scatter
// (moe_unpermute's backward) on its row_id_map.
#include <cuda_runtime_api.h>

#include <optional>
#include <tuple>

#include <torch/csrc/stable/ops.h>

#include "bindings/torch/torch_binding.h"
#include "primus_turbo/moe_permute.h"

namespace primus_turbo::torch_binding {

namespace {

// The routing workspace of T tokens and E experts (the map build; the count of the rows a given
// map references, whose rest the launch zeroes).
Tensor route_workspace(int64_t tokens, int64_t experts, int32_t device) {
  return empty({pt_moe_route_workspace_ints(tokens, static_cast<int32_t>(experts))}, ScalarType::Int, device);
}

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
  Tensor workspace = route_workspace(t, e, device);
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

// token_unpermute's backward without merging probabilities: tokens [N, H] scattered back to the
// permuted rows by row_id_map [T, E], out [num_out, H] (rows no token references stay zero).
Tensor moe_token_scatter(Tensor tokens_in, Tensor row_id_map_in, int64_t num_out) {
  const int32_t device = check_cuda("token_unpermute", {{"grad_output", &tokens_in}, {"row_id_map", &row_id_map_in}});
  if (tokens_in.dim() != 2 || row_id_map_in.dim() != 2)
    fail_with(ErrorKind::Value, "token_unpermute: 'grad_output' and 'row_id_map' must be 2-D, got ",
              shape_string(tokens_in), " and ", shape_string(row_id_map_in));
  if (num_out < 0) fail_with(ErrorKind::Value, "token_unpermute: the permuted row count must be >= 0, got ", num_out);
  const Tensor tokens = as_contiguous(tokens_in), row_id_map = as_contiguous(row_id_map_in);
  DeviceScope scope(device);
  Tensor out = empty({num_out, tokens.sizes()[1]}, tokens.scalar_type(), device);
  // The launch zeroes only the rows the map does not reference (it counts them in the workspace),
  // not the whole output before the scatter overwrites it.
  Tensor ws = route_workspace(row_id_map.sizes()[0], row_id_map.sizes()[1], device);
  const pt_tensor pt_tokens = to_pt(tokens);
  pt_tensor pt_out = to_pt(out), pt_rows = to_pt(row_id_map), pt_ws = to_pt(ws);
  check_status(pt_moe_permute(&pt_tokens, nullptr, nullptr, &pt_out, nullptr, &pt_rows, &pt_ws,
                              current_stream(device)),
               "token_unpermute backward");
  return out;
}

// token_unpermute's backward with merging probabilities: (grad_input like fwd_input, rows no token
// references zero; grad_probs like merging_probs).
std::tuple<Tensor, Tensor> moe_token_unpermute_bwd(Tensor grad_in, Tensor fwd_input_in, Tensor row_id_map_in,
                                                   Tensor merging_probs_in) {
  const int32_t device = check_cuda("token_unpermute", {{"grad_output", &grad_in}, {"input", &fwd_input_in},
                                                        {"row_id_map", &row_id_map_in},
                                                        {"merging_probs", &merging_probs_in}});
  const Tensor grad = as_contiguous(grad_in), fwd_input = as_contiguous(fwd_input_in),
               row_id_map = as_contiguous(row_id_map_in), merging = as_contiguous(merging_probs_in);
  if (row_id_map.dim() != 2)  // its sizes give the workspace's, before the core's checks
    fail_with(ErrorKind::Value, "token_unpermute: 'row_id_map' must be 2-D, got shape ", shape_string(row_id_map));
  DeviceScope scope(device);
  Tensor grad_input = torch_binding::empty_like(fwd_input);  // rows no token references: zeroed by the launch
  Tensor grad_probs = torch_binding::empty_like(merging);
  Tensor ws = route_workspace(row_id_map.sizes()[0], row_id_map.sizes()[1], device);
  const pt_tensor pg = to_pt(grad), pf = to_pt(fwd_input), pr = to_pt(row_id_map), pm = to_pt(merging);
  pt_tensor pgi = to_pt(grad_input), pgp = to_pt(grad_probs), pws = to_pt(ws);
  check_status(pt_moe_unpermute_bwd(&pg, &pf, &pr, &pm, &pgi, &pgp, &pws, current_stream(device)),
               "token_unpermute backward");
  return {grad_input, grad_probs};
}

// A [1] int32 view of element `index` of an int32 buffer, as a descriptor.
pt_tensor element_descriptor(const Tensor& buffer, int64_t index) {
  pt_tensor p = to_pt(buffer);
  p.data = static_cast<int32_t*>(buffer.data_ptr()) + index;
  p.ndim = 1;
  p.shape[0] = 1;
  p.strides[0] = 1;
  return p;
}

// moe_permute by a routing map or top-k expert indices (ops/moe_permute.py checks the arguments):
// builds row_id_map, sizes the output (num_out > 0: as given; else the exact row count, one host
// synchronization) and scatters tokens, probabilities and FP8 scales. Returns (output, row_id_map,
// tokens_per_expert, overflow_flag, num_dispatched, permuted_scales, permuted_probs).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> moe_index_permute(
    Tensor tokens, Tensor expert_map, std::optional<Tensor> probs, std::optional<Tensor> scaling_factor,
    int64_t num_experts, int64_t pad_multiple, int64_t num_out, bool probs_topk) {
  NamedTensors all{{"tokens", &tokens}, {"expert_map", &expert_map}};
  add_present(all, "probs", probs);
  add_present(all, "scaling_factor", scaling_factor);
  const int32_t device = check_cuda("moe_permute", all);
  if (tokens.dim() != 2 || expert_map.dim() != 2)
    fail_with(ErrorKind::Value, "moe_permute: 'tokens' and 'expert_map' must be 2-D, got ", shape_string(tokens),
              " and ", shape_string(expert_map));
  if (scaling_factor && scaling_factor->dim() != 2)
    fail_with(ErrorKind::Value, "moe_permute: 'scaling_factor' must be 2-D [num_tokens, scales_per_token], got ",
              shape_string(*scaling_factor));
  if (num_experts < 1 || num_experts > 1024)
    fail_with(ErrorKind::Value, "moe_permute: num_local_experts must be 1 to 1024, got ", num_experts);
  const int64_t t = tokens.sizes()[0], h = tokens.sizes()[1], e = num_experts, p = pad_multiple > 0 ? pad_multiple : 0;
  const auto e32 = static_cast<int32_t>(e);
  DeviceScope scope(device);
  void* stream = current_stream(device);
  Tensor row_id_map = empty({t + p, 2 * e + 1}, ScalarType::Int, device);
  if (t == 0) torch::stable::zero_(row_id_map);
  Tensor tokens_per_expert = empty({e}, ScalarType::Long, device);
  Tensor overflow = empty({1}, ScalarType::Int, device), dispatched = empty({1}, ScalarType::Int, device);
  const int64_t ws_ints = pt_moe_route_workspace_ints(t, e32);
  Tensor ws = empty({ws_ints}, ScalarType::Int, device);
  const pt_tensor pt_map = mask_to_pt(expert_map);
  pt_tensor pt_rows = to_pt(row_id_map), pt_ws = to_pt(ws), pt_tpe = to_pt(tokens_per_expert);
  pt_tensor pt_ovf = to_pt(overflow), pt_nd = to_pt(dispatched);
  check_status(pt_moe_route_build(&pt_map, e32, static_cast<int32_t>(pad_multiple > 1 ? pad_multiple : 1),
                                  num_out > 0 ? num_out : -1, probs_topk ? 1 : 0, &pt_rows, &pt_ws, &pt_tpe, &pt_ovf,
                                  &pt_nd, stream),
               "moe_permute");
  pt_tensor in_use = element_descriptor(ws, ws_ints - 3);  // the builder's count of rows in use
  int64_t m = num_out;
  if (t == 0) {
    m = 0;  // no tokens, no rows (as the original library)
  } else if (num_out <= 0) {
    if (is_capturing(stream))
      fail_with(ErrorKind::Value, "moe_permute: num_permuted_tokens <= 0 reads the row count on the host, which a "
                "CUDA graph capture cannot do; pass num_permuted_tokens");
    int32_t rows = 0;
    if (cudaMemcpyAsync(&rows, in_use.data, sizeof(rows), cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)) !=
            cudaSuccess ||
        cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) != cudaSuccess)
      fail_with(ErrorKind::Runtime, "moe_permute: could not read the permuted row count back");
    m = rows;
  }
  Tensor out = empty({m, h}, tokens.scalar_type(), device);
  Tensor pprobs = empty({probs ? m : 0}, probs ? probs->scalar_type() : ScalarType::Float, device);
  const int64_t s = scaling_factor ? scaling_factor->sizes()[1] : 0;
  Tensor pscales = empty({scaling_factor ? m : 0, s}, ScalarType::Float, device);
  const pt_tensor pt_tokens = to_pt(tokens);
  pt_tensor pt_out = to_pt(out);
  OptionalPt pt_probs(probs), pt_scales(scaling_factor);
  OptionalPt pt_pprobs(probs ? std::optional<Tensor>(pprobs) : std::nullopt);
  OptionalPt pt_pscales(scaling_factor ? std::optional<Tensor>(pscales) : std::nullopt);
  check_status(pt_moe_rows_scatter(&pt_tokens, &pt_rows, e32, pt_probs.get(), pt_scales.get(), &in_use, 0, &pt_out,
                                   pt_pprobs.get(), pt_pscales.get(), stream),
               "moe_permute");
  return {out, row_id_map, tokens_per_expert, overflow, dispatched, pscales, pprobs};
}

// The 2-D rows and map of an index gather / scatter, checked and made contiguous.
std::pair<Tensor, Tensor> rows_and_map(const char* op, const char* src_name, const Tensor& src, const Tensor& map) {
  if (src.dim() != 2 || map.dim() != 2)
    fail_with(ErrorKind::Value, op, ": '", src_name, "' and 'row_id_map' must be 2-D, got ", shape_string(src),
              " and ", shape_string(map));
  if (map.scalar_type() != ScalarType::Int)
    fail_with(ErrorKind::Type, op, ": argument 'row_id_map' must be the int32 map of moe_permute, got dtype ",
              dtype_name(map.scalar_type()));
  return {as_contiguous(src), as_contiguous(map)};
}

// moe_unpermute's forward and moe_permute's backward: out [num_tokens, H], out[t] = the sum of
// src's rows of token t (fp32, expert order); with src_probs [rows], probs [num_tokens, probs_width]
// carries each row's probability back to its column (zero elsewhere), else probs is [0] float32.
std::tuple<Tensor, Tensor> moe_index_gather(Tensor src_in, Tensor row_id_map_in, std::optional<Tensor> src_probs_in,
                                            int64_t num_tokens, int64_t num_experts, int64_t probs_width) {
  NamedTensors all{{"permuted_tokens", &src_in}, {"row_id_map", &row_id_map_in}};
  add_present(all, "permuted_probs", src_probs_in);
  const int32_t device = check_cuda("moe_unpermute", all);
  const auto [src, row_id_map] = rows_and_map("moe_unpermute", "permuted_tokens", src_in, row_id_map_in);
  if (num_tokens < 0 || num_tokens > row_id_map.sizes()[0])
    fail_with(ErrorKind::Value, "moe_unpermute: num_tokens is ", num_tokens, "; expected 0 to ",
              row_id_map.sizes()[0], " (rows of row_id_map)");
  std::optional<Tensor> src_probs;
  if (src_probs_in) src_probs = as_contiguous(*src_probs_in);
  DeviceScope scope(device);
  Tensor out = empty({num_tokens, src.sizes()[1]}, src.scalar_type(), device);
  Tensor probs = src_probs ? empty({num_tokens, probs_width}, src_probs->scalar_type(), device)
                           : empty({0}, ScalarType::Float, device);
  const pt_tensor ps = to_pt(src), pr = to_pt(row_id_map);
  pt_tensor po = to_pt(out);
  OptionalPt psp(src_probs), pp(src_probs ? std::optional<Tensor>(probs) : std::nullopt);
  check_status(pt_moe_rows_gather(&ps, &pr, static_cast<int32_t>(num_experts), psp.get(), &po, pp.get(),
                                  current_stream(device)),
               "moe_unpermute");
  return {out, probs};
}

// moe_unpermute's backward: each token's row of src [T, H] copied to its permuted rows of out
// [num_rows, H] (padding and unused rows zero); with src_probs [T, width], probs [num_rows] takes
// each row's entry, else probs is [0] float32.
std::tuple<Tensor, Tensor> moe_index_scatter(Tensor src_in, Tensor row_id_map_in, std::optional<Tensor> src_probs_in,
                                             int64_t num_rows, int64_t num_experts) {
  NamedTensors all{{"grad_output", &src_in}, {"row_id_map", &row_id_map_in}};
  add_present(all, "grad_probs", src_probs_in);
  const int32_t device = check_cuda("moe_unpermute", all);
  const auto [src, row_id_map] = rows_and_map("moe_unpermute", "grad_output", src_in, row_id_map_in);
  if (num_rows < 0) fail_with(ErrorKind::Value, "moe_unpermute: the permuted row count must be >= 0, got ", num_rows);
  std::optional<Tensor> src_probs;
  if (src_probs_in) src_probs = as_contiguous(*src_probs_in);
  DeviceScope scope(device);
  Tensor out = empty({num_rows, src.sizes()[1]}, src.scalar_type(), device);
  Tensor probs = empty({src_probs ? num_rows : 0}, src_probs ? src_probs->scalar_type() : ScalarType::Float, device);
  Tensor in_use = empty({1}, ScalarType::Int, device);  // the rows the map lists, counted by the launch
  const pt_tensor ps = to_pt(src);
  pt_tensor pr = to_pt(row_id_map), po = to_pt(out), pu = to_pt(in_use);
  OptionalPt psp(src_probs), pp(src_probs ? std::optional<Tensor>(probs) : std::nullopt);
  check_status(pt_moe_rows_scatter(&ps, &pr, static_cast<int32_t>(num_experts), psp.get(), nullptr, &pu, 1, &po,
                                   pp.get(), nullptr, current_stream(device)),
               "moe_unpermute backward");
  return {out, probs};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("moe_token_permute(Tensor tokens, Tensor routing_map, Tensor? probs, int num_out) -> (Tensor, Tensor, Tensor)");
  m.def("moe_token_unpermute(Tensor input, Tensor row_id_map, Tensor? merging_probs, Tensor? permuted_probs) -> "
        "(Tensor, Tensor)");
  m.def("moe_token_scatter(Tensor tokens, Tensor row_id_map, int num_out) -> Tensor");
  m.def("moe_token_unpermute_bwd(Tensor grad_output, Tensor fwd_input, Tensor row_id_map, Tensor merging_probs) -> "
        "(Tensor, Tensor)");
  m.def("moe_index_permute(Tensor tokens, Tensor expert_map, Tensor? probs, Tensor? scaling_factor, int num_experts, "
        "int pad_multiple, int num_out, bool probs_topk) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("moe_index_gather(Tensor src, Tensor row_id_map, Tensor? src_probs, SymInt num_tokens, int num_experts, "
        "int probs_width) -> (Tensor, Tensor)");
  m.def("moe_index_scatter(Tensor src, Tensor row_id_map, Tensor? src_probs, SymInt num_rows, int num_experts) -> "
        "(Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("moe_token_permute", TORCH_BOX(&moe_token_permute));
  m.impl("moe_token_unpermute", TORCH_BOX(&moe_token_unpermute));
  m.impl("moe_token_scatter", TORCH_BOX(&moe_token_scatter));
  m.impl("moe_token_unpermute_bwd", TORCH_BOX(&moe_token_unpermute_bwd));
  m.impl("moe_index_permute", TORCH_BOX(&moe_index_permute));
  m.impl("moe_index_gather", TORCH_BOX(&moe_index_gather));
  m.impl("moe_index_scatter", TORCH_BOX(&moe_index_scatter));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
