// C API entry points of the MoE token permutation: argument checks, the empty cases, then the JIT
// module's launches.
#include "core/error.h"
#include "core/tensor.h"
#include "ops/moe/permute_kernels.h"
#include "ops/moe/permute_problem.h"
#include "runtime/device.h"  // arch_for_device

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

// The routing workspace (int32 [pt_moe_route_workspace_ints(T, E)]), checked; returns its data.
int32_t* route_workspace(const pt_tensor* workspace, int64_t tokens, int32_t experts) {
  check_vector({workspace, "workspace"}, pt_moe_route_ws_ints(tokens, experts), PT_INT32,
               "pt_moe_route_workspace_ints(num_tokens, num_experts)");
  return static_cast<int32_t*>(workspace->data);
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


// ---- index-based permutation ------------------------------------------------------------------

int dtype_bytes(int32_t dtype) { return dtype_bits(dtype) / 8; }

bool is_row_dtype(int32_t dt) {
  return dt == PT_FLOAT32 || dt == PT_FLOAT16 || dt == PT_BFLOAT16 || dt == PT_FLOAT8_E4M3 ||
         dt == PT_FLOAT8_E5M2 || dt == PT_UINT8;
}

// A 2-D row tensor [rows (any when < 0), cols] of a row dtype; returns its rows.
int64_t check_row_tensor(const pt_tensor* t, const char* name, int64_t rows, int64_t cols, int32_t dtype) {
  PT_CHECK_ARG(t != nullptr, "argument '", name, "' is null");
  PT_CHECK_ARG(t->ndim == 2, "argument '", name, "' has shape ", shape_string(*t), "; expected [rows, hidden]");
  PT_CHECK_ARG(is_row_dtype(t->dtype), "argument '", name, "' has dtype ", dtype_name(t->dtype),
               "; expected float32, float16, bfloat16 or a 1-byte float8/uint8");
  check_matrix({t, name}, rows < 0 ? t->shape[0] : rows, cols < 0 ? t->shape[1] : cols, dtype < 0 ? t->dtype : dtype,
               "rows x hidden");
  return t->shape[0];
}

// The compact map [T + P, 2E + 1]; returns its rows.
int64_t check_compact_map(const pt_tensor* map, int32_t experts) {
  PT_CHECK_ARG(experts >= 1 && experts <= kMaxExperts, "argument 'num_experts' is ", experts, "; expected 1 to ",
               kMaxExperts);
  PT_CHECK_ARG(map != nullptr && map->ndim == 2, "argument 'row_id_map' must be the 2-D map of moe_permute");
  check_matrix({map, "row_id_map"}, map->shape[0], 2 * int64_t{experts} + 1, PT_INT32, "rows x (2 * num_experts + 1)");
  return map->shape[0];
}

// Rows move as 16-byte units when the row bytes and every pointer allow it, else as elements.
bool route_vectorizable(int64_t row_bytes, std::initializer_list<const pt_tensor*> tensors) {
  if (row_bytes % 16) return false;
  for (const pt_tensor* t : tensors) {
    if (t != nullptr && t->data != nullptr && reinterpret_cast<uintptr_t>(t->data) % 16) return false;
  }
  return true;
}

Kernels route_kernels(int32_t dtype, bool vectorized, PtMoeRouteParams& r) {
  PtMoePermuteParams p{};
  Kernels k = kernels_for(dtype, vectorized, p);
  r.num_sms = p.num_sms;
  return k;
}

void run_route(PtMoeRouteFn fn, PtMoeRouteParams& params, void* stream, const char* what) {
  params.stream = stream;
  char err[1024] = {0};
  if (fn(&params, err, sizeof(err)) != 0) PT_THROW(PT_ERROR_CUDA, what, " failed: ", err);
}

void check_probs_rows(const pt_tensor* probs, const char* name, int64_t rows, int64_t cols, int32_t* dtype) {
  PT_CHECK_ARG(is_float_dtype(probs->dtype), "argument '",
               name, "' has dtype ", dtype_name(probs->dtype), "; expected float32, float16 or bfloat16");
  PT_CHECK_ARG(*dtype < 0 || *dtype == probs->dtype, "argument '", name, "' has dtype ", dtype_name(probs->dtype),
               "; expected ", dtype_name(*dtype));
  *dtype = probs->dtype;
  if (cols < 0) {
    check_vector({probs, name}, rows, probs->dtype, "one per row");
  } else {
    check_matrix({probs, name}, rows, cols, probs->dtype, "rows x probability columns");
  }
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
      p.routing_map = routing_map->data;
      p.routing_map_bytes = routing_map->dtype == PT_INT32 ? 4 : 1;
    }
    // The map build needs the workspace; a scatter on an existing map uses it, when given, to count
    // the rows the map references and zero the rest. Without one those rows stay as they are.
    if (routing_map != nullptr || workspace != nullptr) {
      p.workspace = route_workspace(workspace, T, E);
    } else {
      p.num_out = 0;
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
    if (routing_map != nullptr) run(k.build_map, p, stream, "MoE permute map");
    run(k.permute, p, stream, "MoE permute");
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
                               pt_tensor* workspace, void* stream) {
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
    if (workspace != nullptr) p.workspace = route_workspace(workspace, T, E);
    if (T == 0 && (workspace == nullptr || N == 0)) return;
    const bool vec = rows_vectorizable(grad_output->dtype, H, {grad_output, fwd_input, grad_input});
    run(kernels_for(grad_output->dtype, vec, p).unpermute_bwd, p, stream, "MoE unpermute backward");
  });
}

int64_t pt_moe_route_workspace_ints(int64_t num_tokens, int32_t num_experts) {
  return num_tokens < 0 || num_experts < 1 ? 0 : pt_moe_route_ws_ints(num_tokens, num_experts);
}

pt_status pt_moe_route_build(const pt_tensor* expert_map, int32_t num_experts, int32_t align, int64_t capacity,
                             int32_t probs_topk, pt_tensor* row_id_map, pt_tensor* workspace,
                             pt_tensor* tokens_per_expert, pt_tensor* overflow_flag, pt_tensor* num_dispatched,
                             void* stream) {
  return api_guard([&] {
    PT_CHECK_ARG(expert_map != nullptr && expert_map->ndim == 2, "argument 'expert_map' must be a 2-D tensor");
    const int32_t dt = expert_map->dtype;
    PT_CHECK_ARG(dt == PT_UINT8 || dt == PT_INT32 || dt == PT_INT64, "argument 'expert_map' has dtype ",
                 dtype_name(dt), "; expected bool (a routing map) or int32/int64 (top-k expert indices)");
    const int64_t T = expert_map->shape[0];
    PT_CHECK_ARG(num_experts >= 1 && num_experts <= kMaxExperts, "argument 'num_experts' is ", num_experts,
                 "; expected 1 to ", kMaxExperts);
    PT_CHECK_ARG(align >= 1, "argument 'align' is ", align, "; expected >= 1");
    PtMoeRouteParams r{};
    r.num_tokens = T, r.num_experts = num_experts;
    if (dt == PT_UINT8) {
      check_matrix({expert_map, "expert_map"}, T, num_experts, dt, "num_tokens x num_experts");
      r.routing_kind = 0;
    } else {
      check_matrix({expert_map, "expert_map"}, T, expert_map->shape[1], dt, "num_tokens x topk");
      PT_CHECK_ARG(expert_map->shape[1] >= 1 && expert_map->shape[1] <= kMaxExperts, "argument 'expert_map' has shape ",
                   shape_string(*expert_map), "; expected 1 to ", kMaxExperts, " columns");
      r.routing_kind = dt == PT_INT32 ? 2 : 3;
      r.topk = static_cast<int32_t>(expert_map->shape[1]);
    }
    const int64_t rows = check_compact_map(row_id_map, num_experts);
    PT_CHECK_ARG(rows >= T, "argument 'row_id_map' has ", rows, " rows; expected num_tokens + padding rows");
    const int64_t bound = T * (r.routing_kind == 0 ? num_experts : r.topk) + int64_t{num_experts} * (align - 1);
    PT_CHECK_ARG(bound < INT32_MAX, "the permuted rows can reach ", bound, "; at most ", INT32_MAX, " are supported");
    int32_t* ws = route_workspace(workspace, T, num_experts);
    if (tokens_per_expert != nullptr) check_vector({tokens_per_expert, "tokens_per_expert"}, num_experts, PT_INT64, "one per expert");
    if (overflow_flag != nullptr) check_vector({overflow_flag, "overflow_flag"}, 1, PT_INT32, "one flag");
    if (num_dispatched != nullptr) check_vector({num_dispatched, "num_dispatched"}, 1, PT_INT32, "one count");
    r.routing = expert_map->data;
    r.align = align, r.capacity = capacity, r.pad_rows = static_cast<int32_t>(rows - T);
    r.probs_topk = probs_topk, r.compact = 1;
    r.row_id_map = static_cast<int32_t*>(row_id_map->data);
    r.workspace = ws;
    r.tokens_per_expert = tokens_per_expert != nullptr ? static_cast<int64_t*>(tokens_per_expert->data) : nullptr;
    r.overflow_flag = overflow_flag != nullptr ? static_cast<int32_t*>(overflow_flag->data) : nullptr;
    r.num_dispatched = num_dispatched != nullptr ? static_cast<int32_t*>(num_dispatched->data) : nullptr;
    run_route(route_kernels(PT_BFLOAT16, true, r).route_build, r, stream, "MoE route map");
  });
}

pt_status pt_moe_rows_scatter(const pt_tensor* src, const pt_tensor* row_id_map, int32_t num_experts,
                              const pt_tensor* src_probs, const pt_tensor* src_scales, pt_tensor* rows_in_use,
                              int32_t count_rows, pt_tensor* dst, pt_tensor* dst_probs, pt_tensor* dst_scales,
                              void* stream) {
  return api_guard([&] {
    const int64_t T = check_row_tensor(src, "src", -1, -1, -1);
    const int64_t H = src->shape[1];
    const int64_t rows = check_compact_map(row_id_map, num_experts);
    PT_CHECK_ARG(rows >= T, "argument 'row_id_map' has ", rows, " rows; expected at least ", T, " (one per token)");
    const int64_t M = check_row_tensor(dst, "dst", -1, H, src->dtype);
    PT_CHECK_ARG(rows_in_use != nullptr && rows_in_use->dtype == PT_INT32 && rows_in_use->ndim == 1 &&
                     rows_in_use->shape[0] >= 1 && rows_in_use->data != nullptr,
                 "argument 'rows_in_use' must be an int32 tensor of at least one element");
    PtMoeRouteParams r{};
    r.num_tokens = T, r.num_experts = num_experts, r.pad_rows = static_cast<int32_t>(rows - T), r.num_rows = M;
    r.row_id_map = static_cast<int32_t*>(row_id_map->data);
    r.src = src->data, r.dst = dst->data;
    r.probs_dtype = -1;
    PT_CHECK_ARG((src_probs == nullptr) == (dst_probs == nullptr), "arguments 'src_probs' and 'dst_probs' must be given together");
    if (src_probs != nullptr) {
      PT_CHECK_ARG(src_probs->ndim == 2, "argument 'src_probs' has shape ", shape_string(*src_probs), "; expected [", T,
                   ", columns]");
      check_probs_rows(src_probs, "src_probs", T, src_probs->shape[1], &r.probs_dtype);
      check_probs_rows(dst_probs, "dst_probs", M, -1, &r.probs_dtype);
      r.src_probs = src_probs->data, r.dst_probs = dst_probs->data;
      r.probs_width = static_cast<int32_t>(src_probs->shape[1]);
    }
    PT_CHECK_ARG((src_scales == nullptr) == (dst_scales == nullptr), "arguments 'src_scales' and 'dst_scales' must be given together");
    if (src_scales != nullptr) {
      PT_CHECK_ARG(src_scales->ndim == 2, "argument 'scaling_factor' has shape ", shape_string(*src_scales),
                   "; expected [", T, ", scales_per_token]");
      check_matrix({src_scales, "scaling_factor"}, T, src_scales->shape[1], PT_FLOAT32, "num_tokens x scales_per_token");
      check_matrix({dst_scales, "permuted_scaling_factor"}, M, src_scales->shape[1], PT_FLOAT32, "rows x scales_per_token");
      r.src_scales = static_cast<const float*>(src_scales->data), r.dst_scales = static_cast<float*>(dst_scales->data);
      r.scales_per_row = static_cast<int32_t>(src_scales->shape[1]);
    }
    r.rows_in_use = static_cast<int32_t*>(rows_in_use->data), r.count_rows = count_rows;
    if (T + r.pad_rows == 0 && M == 0) return;
    const int64_t row_bytes = H * dtype_bytes(src->dtype);
    const bool vec = route_vectorizable(row_bytes, {src, dst});
    int32_t module_dtype = src->dtype;
    if (dtype_bytes(src->dtype) == 1) {
      PT_CHECK_ARG(vec, "1-byte tokens need a hidden size that is a multiple of 16 and 16-byte aligned rows");
      module_dtype = PT_BFLOAT16;  // 16-byte units: the bytes move whatever their type
    }
    r.row_units = vec ? row_bytes / 16 : H;
    run_route(route_kernels(module_dtype, vec, r).rows_scatter, r, stream, "MoE rows scatter");
  });
}

pt_status pt_moe_rows_gather(const pt_tensor* src, const pt_tensor* row_id_map, int32_t num_experts,
                             const pt_tensor* src_probs, pt_tensor* dst, pt_tensor* dst_probs, void* stream) {
  return api_guard([&] {
    check_token_tensor(src, "src");
    const int64_t M = src->shape[0], H = src->shape[1];
    check_token_tensor(dst, "dst");
    check_rows({dst, "dst"}, -1, H, src->dtype);
    const int64_t T = dst->shape[0];
    const int64_t rows = check_compact_map(row_id_map, num_experts);
    PT_CHECK_ARG(rows >= T, "argument 'row_id_map' has ", rows, " rows; expected at least ", T, " (one per token)");
    PtMoeRouteParams r{};
    r.num_tokens = T, r.num_experts = num_experts, r.num_rows = M, r.num_out_tokens = T;
    r.row_id_map = static_cast<int32_t*>(row_id_map->data);
    r.src = src->data, r.dst = dst->data;
    r.probs_dtype = -1;
    PT_CHECK_ARG((src_probs == nullptr) == (dst_probs == nullptr), "arguments 'src_probs' and 'dst_probs' must be given together");
    if (src_probs != nullptr) {
      PT_CHECK_ARG(dst_probs->ndim == 2, "argument 'dst_probs' has shape ", shape_string(*dst_probs), "; expected [", T,
                   ", columns]");
      check_probs_rows(src_probs, "src_probs", M, -1, &r.probs_dtype);
      check_probs_rows(dst_probs, "dst_probs", T, dst_probs->shape[1], &r.probs_dtype);
      r.src_probs = src_probs->data, r.dst_probs = dst_probs->data;
      r.probs_width = static_cast<int32_t>(dst_probs->shape[1]);
    }
    if (T == 0) return;
    const bool vec = rows_vectorizable(src->dtype, H, {src, dst});
    r.row_units = vec ? H / (16 / dtype_bytes(src->dtype)) : H;
    run_route(route_kernels(src->dtype, vec, r).rows_gather, r, stream, "MoE rows gather");
  });
}

pt_status pt_moe_permute_prepare(int32_t dtype, int32_t vectorized) {
  return api_guard([&] {
    PT_CHECK_ARG(is_float_dtype(dtype), "argument 'dtype' is ",
                 dtype_name(dtype), "; expected float32, float16 or bfloat16");
    load_kernels(dtype, vectorized != 0, "90a");
  });
}

}  // extern "C"
