// primus_turbo::gemm and primus_turbo::gemm_accum_: argument checks, the plan cache and the launch,
// in one native call. A plan (the core's pt_gemm_plan: one backend config bound to a problem's
// sizes, layouts, dtypes and alignment) is looked up by the problem; on a miss the planner the
// Python layer registered (autotune, backend settings, fallbacks, distributed agreement) picks the
// backend and config once, and the plan is kept.
#include <algorithm>
#include <memory>
#include <vector>

#include "bindings/torch/plan_cache.h"
#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

namespace {

PlanCache<pt_gemm_plan> g_plans;

pt_gemm_plan make_plan(const pt_tensor& a, const pt_tensor& b, const pt_tensor& d, bool ta, bool tb, float beta,
                       int32_t device) {
  const GemmPlanRequest request{&a, &b, &d, ta ? 1 : 0, tb ? 1 : 0, beta};
  const Choice c = plan_with_python(kPlanGemm, &request, device, "gemm");
  pt_gemm_plan plan = nullptr;
  check_status(pt_gemm_plan_create(&a, &b, &d, ta, tb, 1.0f, beta, c.backend, c.config, &plan), "gemm");
  return plan;
}

// A row- or column-major view (unit stride along one dim, the other at least that dim's length)
// is read in place; any other strides are copied once, broadcast ones (stride 0) included: the
// GEMMs read a leading dimension, which must cover a row.
Tensor matrix_operand(const Tensor& t) {
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const bool row_major = strides[1] == 1 && strides[0] >= std::max<int64_t>(sizes[1], 1);
  const bool col_major = strides[0] == 1 && strides[1] >= std::max<int64_t>(sizes[0], 1);
  if (row_major || col_major) return t;
  return fresh_copy(t);  // standard strides even where torch calls the view contiguous (size-1 dims)
}

void check_float(const char* name, ScalarType t) {
  if (t != ScalarType::Float && t != ScalarType::Half && t != ScalarType::BFloat16)
    fail_with(ErrorKind::Type, "gemm: argument '", name, "' has dtype ", dtype_name(t),
              "; expected float32, float16 or bfloat16");
}

// Validates like the fake implementation (ops/gemm.py: _gemm_shape); returns (m, n).
std::pair<int64_t, int64_t> check_gemm(const Tensor& a, const Tensor& b, bool ta, bool tb, ScalarType out_dtype) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"a", &a}, {"b", &b}}) {
    if (t->dim() != 2)
      fail_with(ErrorKind::Value, "gemm: argument '", name, "' must be 2-D, got shape ", shape_string(*t));
    check_float(name, t->scalar_type());
  }
  if (b.scalar_type() != a.scalar_type())
    fail_with(ErrorKind::Type, "gemm: argument 'b' has dtype ", dtype_name(b.scalar_type()),
              "; expected the dtype of 'a' (", dtype_name(a.scalar_type()), ")");
  if (out_dtype != ScalarType::Float && out_dtype != ScalarType::Half && out_dtype != ScalarType::BFloat16)
    fail_with(ErrorKind::Type, "gemm: out_dtype ", dtype_name(out_dtype),
              " is not supported; expected float32, float16 or bfloat16");
  if (a.scalar_type() == ScalarType::Float && out_dtype != ScalarType::Float)
    fail_with(ErrorKind::Type, "gemm: out_dtype ", dtype_name(out_dtype),
              " is not supported for float32 inputs; expected float32");
  const auto as = a.sizes();
  const auto bs = b.sizes();
  const int64_t m = ta ? as[1] : as[0], k = ta ? as[0] : as[1];
  const int64_t kb = tb ? bs[1] : bs[0], n = tb ? bs[0] : bs[1];
  if (k != kb)
    fail_with(ErrorKind::Value, "gemm: inner dimensions do not match: op(a) is [", m, ", ", k, "] (a ",
              shape_string(a), ", trans_a=", ta ? "True" : "False", ") but op(b) is [", kb, ", ", n, "] (b ",
              shape_string(b), ", trans_b=", tb ? "True" : "False", ")");
  return {m, n};
}

void run_gemm(const Tensor& a_in, const Tensor& b_in, const Tensor& out, bool ta, bool tb, float beta,
              int32_t device) {
  if (out.numel() == 0 && beta == 0.0f) return;
  const Tensor a = matrix_operand(a_in);
  const Tensor b = matrix_operand(b_in);
  const pt_tensor pa = to_pt(a), pb = to_pt(b), pd = to_pt(out);
  DeviceScope scope(device);
  void* stream = current_stream(device);
  std::vector<int64_t> values;
  values.reserve(24);
  for (const pt_tensor* t : {&pa, &pb, &pd})
    values.insert(values.end(), {t->shape[0], t->shape[1], t->strides[0], t->strides[1], t->dtype, alignment(t->data)});
  values.insert(values.end(), {(ta ? 1 : 0) | (tb ? 2 : 0) | (beta != 0.0f ? 4 : 0), device});
  const PlanKey key = plan_key(std::move(values), {"PRIMUS_TURBO_GEMM_BACKEND", "PRIMUS_TURBO_AUTO_TUNE"});
  OwnedPlan<pt_gemm_plan> owned(nullptr, pt_gemm_plan_destroy);
  const pt_gemm_plan plan =
      cached_plan(g_plans, key, stream, owned, [&] { return make_plan(pa, pb, pd, ta, tb, beta, device); });
  // cuBLASLt's workspace comes from the caching allocator per call: a cached buffer would be an
  // untracked allocation to CUDA-graph pools.
  std::optional<Tensor> ws;
  void* ws_ptr = nullptr;
  size_t ws_bytes = 0;
  if (pt_gemm_plan_needs_workspace(plan)) {
    ws_bytes = pt_gemm_workspace_bytes();
    ws = empty({static_cast<int64_t>(ws_bytes)}, ScalarType::Byte, device);
    ws_ptr = ws->data_ptr();
  }
  const pt_status status = pt_gemm_plan_run(plan, pa.data, pb.data, pd.data, ws_ptr, ws_bytes, stream);
  check_status(status, "gemm");
}

Tensor gemm(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype) {
  const auto [m, n] = check_gemm(a, b, trans_a, trans_b, out_dtype);
  const int32_t device = check_cuda("gemm", {{"a", &a}, {"b", &b}});
  Tensor out = empty({m, n}, out_dtype, device);
  run_gemm(a, b, out, trans_a, trans_b, 0.0f, device);
  return out;
}

void gemm_accum(Tensor a, Tensor b, Tensor out, bool trans_a, bool trans_b) {
  const auto [m, n] = check_gemm(a, b, trans_a, trans_b, out.scalar_type());
  const auto os = out.sizes();
  if (out.dim() != 2 || os[0] != m || os[1] != n)
    fail_with(ErrorKind::Value, "gemm: accumulation target has shape ", shape_string(out), "; expected [", m, ", ", n,
              "]");
  const int32_t device = check_cuda("gemm", {{"a", &a}, {"b", &b}, {"out", &out}});
  run_gemm(a, b, out, trans_a, trans_b, 1.0f, device);
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("gemm(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype) -> Tensor");
  m.def("gemm_accum_(Tensor a, Tensor b, Tensor(a!) out, bool trans_a, bool trans_b) -> ()");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("gemm", TORCH_BOX(&gemm));
  m.impl("gemm_accum_", TORCH_BOX(&gemm_accum));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding

extern "C" __attribute__((visibility("default"))) void pt_torch_clear_gemm_plans(void) {
  // Plans are not destroyed: a captured graph may still replay one's kernel with its state.
  primus_turbo::torch_binding::g_plans.clear();
}
