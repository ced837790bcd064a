// C API entry points of MoE routing: argument checks (messages name the argument), the empty
// case, then the JIT module's launch.
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/moe_routing/routing_kernels.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::moe_routing;

namespace {

constexpr int64_t kMaxExperts = 1024;
constexpr int64_t kMaxGroups = 64;

bool is_index(int32_t dt) { return dt == PT_INT32 || dt == PT_INT64; }

void check_matrix(const pt_tensor* t, const char* name, const char* dims) {
  check_contiguous(t, name);
  PT_CHECK_ARG(t->ndim == 2, "argument '", name, "' has shape ", shape_string(*t), "; expected ", dims);
}

void check_float(const pt_tensor* t, const char* name) {
  PT_CHECK_ARG(is_float_dtype(t->dtype), "argument '", name, "' has dtype ", dtype_name(t->dtype),
               "; expected float32, float16 or bfloat16");
}

void check_shape_dtype(const pt_tensor* t, const char* name, const pt_tensor& like, const char* like_name,
                       int32_t dtype) {
  check_contiguous(t, name);
  check_same_shape(t, name, like, like_name);
  PT_CHECK_ARG(t->dtype == dtype, "argument '", name, "' has dtype ", dtype_name(t->dtype), "; expected ",
               dtype_name(dtype));
}

// logits: a contiguous float [tokens, experts] matrix with 1 to kMaxExperts experts.
void check_logits(const pt_tensor* logits) {
  check_matrix(logits, "logits", "[tokens, experts]");
  check_float(logits, "logits");
  const int64_t experts = logits->shape[1];
  PT_CHECK_ARG(experts >= 1 && experts <= kMaxExperts, "argument 'logits' has ", experts,
               " experts (last dimension); expected 1 to ", kMaxExperts);
}

void check_topk(int32_t topk, int64_t experts) {
  PT_CHECK_ARG(topk >= 1 && topk <= experts, "argument 'topk' is ", topk, "; expected 1 to the number of experts (",
               experts, ")");
}

void check_softmax(int32_t softmax) {
  PT_CHECK_ARG(softmax == 0 || softmax == 1, "argument 'softmax' is ", softmax, "; expected 0 (sigmoid) or 1");
}

void check_indices(const pt_tensor* indices) {
  check_matrix(indices, "indices", "[tokens, topk]");
  PT_CHECK_ARG(is_index(indices->dtype), "argument 'indices' has dtype ", dtype_name(indices->dtype),
               "; expected int32 or int64");
}

// t: a contiguous float tensor of the shape of `like`.
void check_float_like(const pt_tensor* t, const char* name, const pt_tensor& like, const char* like_name) {
  check_contiguous(t, name);
  check_same_shape(t, name, like, like_name);
  check_float(t, name);
}

// A [tokens, experts] matrix (already checked 2-D) with the rows of indices [tokens, topk].
void check_multihot_rows(const pt_tensor* t, const char* name, const pt_tensor& indices) {
  PT_CHECK_ARG(t->shape[0] == indices.shape[0], "argument '", name, "' has shape ", shape_string(*t),
               "; expected ", indices.shape[0], " rows (the tokens of 'indices')");
  PT_CHECK_ARG(t->shape[1] <= INT32_MAX && indices.shape[1] <= INT32_MAX,
               "indices_to_multihot: too many experts or topk");
}

// Binds the current device and loads its modules (may compile on first use).
RoutingKernels routing_kernels(int32_t dtype) {
  const int device = current_device();
  bind_device_context(device);
  return load_routing(dtype, arch_for_device(device));
}

UtilKernels util_kernels() {
  const int device = current_device();
  bind_device_context(device);
  return load_utils(arch_for_device(device));
}

// What both directions of indices_to_multihot pass: indices [tokens, topk], the expert count
// and the probability dtypes; the caller adds its tensors.
PtMultihotParams multihot_params(const pt_tensor& indices, int64_t experts, int32_t probs_dtype,
                                 int32_t probs_out_dtype, void* stream) {
  PtMultihotParams p{};
  p.indices = indices.data;
  p.tokens = indices.shape[0];
  p.topk = static_cast<int32_t>(indices.shape[1]);
  p.experts = static_cast<int32_t>(experts);
  p.indices_dtype = indices.dtype;
  p.probs_dtype = probs_dtype;
  p.probs_out_dtype = probs_out_dtype;
  p.stream = stream;
  return p;
}

template <class Fn, class Params>
void launch(Fn fn, Params* params, const char* what) {
  char err[1024] = {0};
  if (fn(params, err, sizeof(err)) != 0) PT_THROW(PT_ERROR_CUDA, what, " failed: ", err);
}

}  // namespace

extern "C" {

pt_status pt_moe_routing_fwd(const pt_tensor* logits, pt_tensor* scores, pt_tensor* probs, pt_tensor* routing_map,
                             int32_t topk, int32_t groups, int32_t selected_groups, int32_t softmax, float scaling,
                             void* stream) {
  return api_guard([&] {
    check_logits(logits);
    const int64_t tokens = logits->shape[0], experts = logits->shape[1];
    check_topk(topk, experts);
    PT_CHECK_ARG(groups >= 1 && groups <= kMaxGroups, "argument 'groups' is ", groups, "; expected 1 to ", kMaxGroups);
    PT_CHECK_ARG(experts % groups == 0, "argument 'groups' (", groups, ") must divide the number of experts (", experts,
                 ")");
    PT_CHECK_ARG(selected_groups >= 1 && selected_groups <= groups, "argument 'selected_groups' is ", selected_groups,
                 "; expected 1 to groups (", groups, ")");
    PT_CHECK_ARG(topk >= selected_groups, "argument 'topk' (", topk, ") must be at least selected_groups (",
                 selected_groups, "): a group's score sums its top topk // selected_groups experts");
    PT_CHECK_ARG(topk <= selected_groups * (experts / groups), "argument 'topk' (", topk,
                 ") exceeds the experts of the selected groups (selected_groups * experts / groups = ",
                 selected_groups * (experts / groups), ")");
    check_softmax(softmax);
    check_shape_dtype(scores, "scores", *logits, "logits", logits->dtype);
    check_shape_dtype(probs, "probs", *logits, "logits", logits->dtype);
    check_shape_dtype(routing_map, "routing_map", *logits, "logits", PT_UINT8);
    if (tokens == 0) return;
    const RoutingKernels k = routing_kernels(logits->dtype);
    PtRoutingFwdParams p{};
    p.logits = logits->data;
    p.scores = scores->data;
    p.probs = probs->data;
    p.routing_map = static_cast<uint8_t*>(routing_map->data);
    p.tokens = tokens;
    p.experts = static_cast<int32_t>(experts);
    p.topk = topk;
    p.groups = groups;
    p.selected_groups = selected_groups;
    p.softmax = softmax;
    p.scaling = scaling;
    p.stream = stream;
    launch(k.forward, &p, "MoE routing forward");
  });
}

pt_status pt_moe_routing_bwd(const pt_tensor* logits, const pt_tensor* routing_map, const pt_tensor* grad_probs,
                             const pt_tensor* grad_scores, pt_tensor* grad_logits, int32_t topk, int32_t softmax,
                             float scaling, void* stream) {
  return api_guard([&] {
    check_logits(logits);
    const int64_t tokens = logits->shape[0], experts = logits->shape[1];
    check_topk(topk, experts);
    check_softmax(softmax);
    check_shape_dtype(routing_map, "routing_map", *logits, "logits", PT_UINT8);
    if (grad_probs) check_shape_dtype(grad_probs, "grad_probs", *logits, "logits", logits->dtype);
    if (grad_scores) check_shape_dtype(grad_scores, "grad_scores", *logits, "logits", logits->dtype);
    check_shape_dtype(grad_logits, "grad_logits", *logits, "logits", logits->dtype);
    if (tokens == 0) return;
    const RoutingKernels k = routing_kernels(logits->dtype);
    PtRoutingBwdParams p{};
    p.logits = logits->data;
    p.routing_map = static_cast<const uint8_t*>(routing_map->data);
    p.grad_probs = grad_probs ? grad_probs->data : nullptr;
    p.grad_scores = grad_scores ? grad_scores->data : nullptr;
    p.grad_logits = grad_logits->data;
    p.tokens = tokens;
    p.experts = static_cast<int32_t>(experts);
    p.topk = topk;
    p.softmax = softmax;
    p.scaling = scaling;
    p.stream = stream;
    launch(k.backward, &p, "MoE routing backward");
  });
}

pt_status pt_indices_to_multihot_fwd(const pt_tensor* indices, const pt_tensor* probs, pt_tensor* multihot,
                                     pt_tensor* probs_out, void* stream) {
  return api_guard([&] {
    check_indices(indices);
    check_float_like(probs, "probs", *indices, "indices");
    check_matrix(multihot, "multihot", "[tokens, experts]");
    PT_CHECK_ARG(multihot->dtype == PT_UINT8, "argument 'multihot' has dtype ", dtype_name(multihot->dtype),
                 "; expected uint8");
    check_multihot_rows(multihot, "multihot", *indices);
    check_float_like(probs_out, "probs_out", *multihot, "multihot");
    if (numel(*multihot) == 0) return;
    const UtilKernels k = util_kernels();
    PtMultihotParams p = multihot_params(*indices, multihot->shape[1], probs->dtype, probs_out->dtype, stream);
    p.probs = probs->data;
    p.multihot = static_cast<uint8_t*>(multihot->data);
    p.probs_out = probs_out->data;
    launch(k.multihot_forward, &p, "indices_to_multihot forward");
  });
}

pt_status pt_indices_to_multihot_bwd(const pt_tensor* indices, const pt_tensor* grad_probs_out, pt_tensor* grad_probs,
                                     void* stream) {
  return api_guard([&] {
    check_indices(indices);
    check_matrix(grad_probs_out, "grad_probs_out", "[tokens, experts]");
    check_float(grad_probs_out, "grad_probs_out");
    check_multihot_rows(grad_probs_out, "grad_probs_out", *indices);
    check_float_like(grad_probs, "grad_probs", *indices, "indices");
    if (numel(*grad_probs) == 0) return;
    const UtilKernels k = util_kernels();
    PtMultihotParams p =
        multihot_params(*indices, grad_probs_out->shape[1], grad_probs->dtype, grad_probs_out->dtype, stream);
    p.grad_multihot = grad_probs_out->data;
    p.grad_probs = grad_probs->data;
    launch(k.multihot_backward, &p, "indices_to_multihot backward");
  });
}

pt_status pt_tokens_per_expert_to_mask(const pt_tensor* tokens_per_expert, pt_tensor* mask, void* stream) {
  return api_guard([&] {
    check_contiguous(tokens_per_expert, "tokens_per_expert");
    PT_CHECK_ARG(tokens_per_expert->ndim == 1, "argument 'tokens_per_expert' has shape ",
                 shape_string(*tokens_per_expert), "; expected [experts]");
    PT_CHECK_ARG(is_index(tokens_per_expert->dtype), "argument 'tokens_per_expert' has dtype ",
                 dtype_name(tokens_per_expert->dtype), "; expected int32 or int64");
    check_contiguous(mask, "mask");
    PT_CHECK_ARG(mask->ndim == 1 && mask->dtype == PT_INT64, "argument 'mask' (", dtype_name(mask->dtype), " ",
                 shape_string(*mask), ") must be int64 [num_tokens]");
    if (mask->shape[0] == 0) return;
    const UtilKernels k = util_kernels();
    PtTokensMaskParams p{};
    p.tokens_per_expert = tokens_per_expert->data;
    p.mask = static_cast<int64_t*>(mask->data);
    p.experts = tokens_per_expert->shape[0];
    p.num_tokens = mask->shape[0];
    p.counts_dtype = tokens_per_expert->dtype;
    p.stream = stream;
    launch(k.tokens_mask, &p, "tokens_per_expert_to_mask");
  });
}

pt_status pt_moe_routing_prepare(int32_t dtype) {
  return api_guard([&] {
    if (dtype < 0) {
      load_utils("90a");
      return;
    }
    PT_CHECK_ARG(is_float_dtype(dtype), "argument 'dtype' is ", dtype_name(dtype), "; expected float32, float16 or bfloat16");
    load_routing(dtype, "90a");
  });
}

}  // extern "C"
