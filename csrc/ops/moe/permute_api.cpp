// C API entry points of the MoE token permutation: argument checks, the empty cases, then the JIT
// module's launches.
#include "core/error.h"
#include "core/tensor.h"
#include "ops/moe/permute_kernels.h"
#include "ops/moe/permute_problem.h"
#include "runtime/device.h"  // arch_for_device
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::moe;

namespace {

// row_id_map [T, E] int32; returns E.
int32_t check_map(const pt_tensor* row_id_map, int64_t tokens) {
  PT_CHECK_ARG(row_id_map != nullptr, "argument 'row_id_map' is null");
  PT_CHECK_ARG(row_id_map->ndim == 2 && row_id_map->shape[1] >= 1 && row_id_map->shape[1] <= kMaxExperts,
               "argument 'row_id_map' has shape ", shape_string(*row_id_map), "; expected [num_tokens, num_experts] with 1 to ",
               kMaxExperts, " experts");
  check_matrix({row_id_map, "row_id_map"}, tokens, row_id_map->shape[1], PT_INT32, "num_tokens x num_experts");
  return static_cast<int32_t>(row_id_map->shape[1]);
}

void run(PtMoePermuteFn fn, PtMoePermuteParams& params, void* stream, const char* what) {
  params.stream = stream;
  char err[1024] = {0};
  if (fn(&params, err, sizeof(err)) != 0) PT_THROW(PT_ERROR_CUDA, what, " failed: ", err);
}

Kernels kernels_for(int32_t dtype, bool vectorized, PtMoePermuteParams& params) {
  const int device = current_device();
  bind_device_context(device);
  params.num_sms = device_info(device).sm_count;
  return load_kernels(dtype, vectorized, arch_for_device(device));
}

}  // namespace

extern "C" {

pt_status pt_moe_permute(const pt_tensor* tokens, const pt_tensor* routing_map, const pt_tensor* probs,
                         pt_tensor* output, pt_tensor* permuted_probs, pt_tensor* row_id_map, pt_tensor* workspace,
                         void* stream) {
  return api_guard([&] {
    check_token_tensor(tokens, "tokens");
    const int64_t T = tokens->shape[0], H = tokens->shape[1];
    const int32_t E = check_map(row_id_map, T);
    check_rows({output, "output"}, -1, H, tokens->dtype);
    const int64_t N = output->shape[0];
    PtMoePermuteParams p{};
    p.num_tokens = T, p.num_experts = E, p.hidden = H, p.num_out = N;
    if (routing_map != nullptr) {
      PT_CHECK_ARG(routing_map->dtype == PT_INT32 || routing_map->dtype == PT_UINT8, "argument 'routing_map' has dtype ",
                   dtype_name(routing_map->dtype), "; expected bool/uint8 or int32");
      check_matrix({routing_map, "routing_map"}, T, E, routing_map->dtype, "num_tokens x num_experts");
      check_vector({workspace, "workspace"}, 2 * int64_t{E} + 1, PT_INT32, "2 * num_experts + 1");
      p.routing_map = routing_map->data;
      p.routing_map_bytes = routing_map->dtype == PT_INT32 ? 4 : 1;
      p.workspace = static_cast<int32_t*>(workspace->data);
    }
    PT_CHECK_ARG((probs == nullptr) == (permuted_probs == nullptr), "arguments 'probs' and 'permuted_probs' must be given together");
    if (probs != nullptr) {
      p.probs_dtype = check_probs_dtype(probs, "probs");
      check_matrix({probs, "probs"}, T, E, p.probs_dtype, "num_tokens x num_experts");
      check_vector({permuted_probs, "permuted_probs"}, N, p.probs_dtype, "one per output row");
      p.probs = probs->data, p.permuted_probs = permuted_probs->data;
    }
    p.row_id_map = static_cast<int32_t*>(row_id_map->data);
    p.input = tokens->data, p.output = output->data;
    if (T == 0 && N == 0) return;
    const bool vec = rows_vectorizable(tokens->dtype, H, {tokens, output});
    const Kernels k = kernels_for(tokens->dtype, vec, p);
    if (routing_map != nullptr) {
      run(k.build_map, p, stream, "MoE permute map");
      run(k.permute, p, stream, "MoE permute");
    } else {
      p.num_out = 0;  // an existing map: scatter only, unreferenced rows stay as they are
      run(k.permute, p, stream, "MoE permute");
    }
  });
}

pt_status pt_moe_unpermute(const pt_tensor* input, const pt_tensor* row_id_map, const pt_tensor* merging_probs,
                           pt_tensor* output, const pt_tensor* permuted_probs, pt_tensor* probs_grad, void* stream) {
  return api_guard([&] {
    check_token_tensor(output, "output");
    const int64_t T = output->shape[0], H = output->shape[1];
    const int32_t E = check_map(row_id_map, T);
    check_rows({input, "input"}, -1, H, output->dtype);
    const int64_t N = input->shape[0];
    PtMoePermuteParams p{};
    p.num_tokens = T, p.num_experts = E, p.hidden = H, p.num_out = N;
    if (merging_probs != nullptr) {
      p.probs_dtype = check_probs_dtype(merging_probs, "merging_probs");
      check_matrix({merging_probs, "merging_probs"}, T, E, p.probs_dtype, "num_tokens x num_experts");
      p.probs = merging_probs->data;
    }
    PT_CHECK_ARG((permuted_probs == nullptr) == (probs_grad == nullptr),
                 "arguments 'permuted_probs' and 'probs_grad' must be given together");
    PT_CHECK_ARG(merging_probs == nullptr || permuted_probs == nullptr,
                 "arguments 'merging_probs' and 'permuted_probs' exclude each other");
    if (permuted_probs != nullptr) {
      p.probs_dtype = check_probs_dtype(permuted_probs, "permuted_probs");
      check_vector({permuted_probs, "permuted_probs"}, N, p.probs_dtype, "one per input row");
      check_matrix({probs_grad, "probs_grad"}, T, E, p.probs_dtype, "num_tokens x num_experts");
      p.permuted_probs = const_cast<void*>(permuted_probs->data);
      p.grad_probs = probs_grad->data;
    }
    p.row_id_map = static_cast<int32_t*>(row_id_map->data);
    p.input = input->data, p.output = output->data;
    if (T == 0) return;
    const bool vec = rows_vectorizable(output->dtype, H, {input, output});
    run(kernels_for(output->dtype, vec, p).unpermute, p, stream, "MoE unpermute");
  });
}

pt_status pt_moe_unpermute_bwd(const pt_tensor* grad_output, const pt_tensor* fwd_input, const pt_tensor* row_id_map,
                               const pt_tensor* merging_probs, pt_tensor* grad_input, pt_tensor* grad_probs,
                               void* stream) {
  return api_guard([&] {
    check_token_tensor(grad_output, "grad_output");
    const int64_t T = grad_output->shape[0], H = grad_output->shape[1];
    const int32_t E = check_map(row_id_map, T);
    check_rows({fwd_input, "fwd_input"}, -1, H, grad_output->dtype);
    const int64_t N = fwd_input->shape[0];
    check_rows({grad_input, "grad_input"}, N, H, grad_output->dtype);
    PT_CHECK_ARG(merging_probs != nullptr, "argument 'merging_probs' is null");
    PtMoePermuteParams p{};
    p.num_tokens = T, p.num_experts = E, p.hidden = H, p.num_out = N;
    p.probs_dtype = check_probs_dtype(merging_probs, "merging_probs");
    check_matrix({merging_probs, "merging_probs"}, T, E, p.probs_dtype, "num_tokens x num_experts");
    check_matrix({grad_probs, "grad_probs"}, T, E, p.probs_dtype, "num_tokens x num_experts");
    p.probs = merging_probs->data, p.grad_probs = grad_probs->data;
    p.row_id_map = static_cast<int32_t*>(row_id_map->data);
    p.grad_output = grad_output->data, p.fwd_input = fwd_input->data, p.output = grad_input->data;
    if (T == 0) return;
    const bool vec = rows_vectorizable(grad_output->dtype, H, {grad_output, fwd_input, grad_input});
    run(kernels_for(grad_output->dtype, vec, p).unpermute_bwd, p, stream, "MoE unpermute backward");
  });
}

pt_status pt_moe_permute_prepare(int32_t dtype, int32_t vectorized) {
  return api_guard([&] {
    PT_CHECK_ARG(dtype == PT_FLOAT32 || dtype == PT_FLOAT16 || dtype == PT_BFLOAT16, "argument 'dtype' is ",
                 dtype_name(dtype), "; expected float32, float16 or bfloat16");
    load_kernels(dtype, vectorized != 0, "90a");
  });
}

}  // extern "C"
