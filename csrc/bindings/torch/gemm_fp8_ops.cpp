// primus_turbo::gemm_fp8_fwd / gemm_fp8_bwd: the FP8 training GEMM (TENSORWISE, ROWWISE,
// BLOCKWISE; E4M3 or HYBRID) composed in one native call per direction: quantize both inputs
// (each read once, both copies written), restate the scales in the layout the GEMM reads, pick
// the plan, launch. The forward returns the copies the backward reads (quantized along M and N),
// so nothing is quantized twice. Layouts, with op(a) [M, K] and op(b) [K, N]:
//   forward  out     = op(a)   [M,K] x op(b)^T [N,K]   (both along K)
//   dgrad    d op(a) = grad    [M,N] x op(b)   [K,N]   (both along N)
//   wgrad    d op(b) = op(a)^T [K,M] x grad^T  [N,M]   (both along M)
// MX_BLOCKWISE, E5M2 x E5M2, pre-quantized operands and FP4 stay on the Python path.
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/ops.h>

#include "bindings/torch/fp8_quantize.h"
#include "bindings/torch/gemm_fp8_run.h"
#include "bindings/torch/plan_cache.h"
#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr const char* kOp = "gemm_fp8";

// x [m, k] quantized for the dense GEMM in the scale layouts it reads (no restatement follows): 1x128
// scales blocks-major; 128x128 blocks for a BLOCKWISE weight, their last dim padded to 4. A copy
// this call alone reads (`keep_*` false) lives in the batch's scratch allocation.
QuantRequest request(const Tensor& x, ScalarType dtype, int64_t g, bool weight, bool want_row, bool want_col,
                     bool keep_row, bool keep_col) {
  const bool two_d = weight && g == PT_QUANT_BLOCKWISE;
  return QuantRequest{&x, QuantSpec{dtype, g, two_d, !two_d, two_d}, want_row, want_col, !keep_row, !keep_col};
}

// The quantizer's scales in the layout the GEMM reads (gemm_fp8.h): tensor -> 0-dim, row ->
// [rows] (views of the same memory); 1x128 -> [kb, round_up(rows, 4)], rows contiguous, as the
// quantizer wrote them; 128x128 -> [ceil(rows/128), round_up(kb, 4)], as the quantizer writes them
// here (a small copy where kb % 4 and they came unpadded).
Tensor kernel_scale(const Quantized& x) {
  const int64_t kb = cdiv(x.q.sizes()[1], 128);
  switch (x.scaling) {
    case PT_FP8_SCALING_TENSOR:
    case PT_FP8_SCALING_ROW:  // the descriptor is reshaped in gemm_operand_scale
    case PT_FP8_SCALING_BLOCK_1x128: return x.s;
    default: {
      const int64_t extra = (4 - kb % 4) % 4;
      if (!extra || x.s.sizes()[1] == kb + extra) return x.s;
      const std::vector<int64_t> pad{0, extra};
      return as_contiguous(torch::stable::pad(x.s, pad));
    }
  }
}

pt_tensor scale_descriptor(const Tensor& s, int32_t scaling) {
  pt_tensor p = to_pt(s);
  if (scaling == PT_FP8_SCALING_TENSOR) {
    p.ndim = 0;
  } else if (scaling == PT_FP8_SCALING_ROW) {
    p.ndim = 1;
    p.shape[0] = s.numel();
    p.strides[0] = 1;
  }
  return p;
}

// Cached plans are kept for the process (cheap to keep, costly to rebuild), up to kMaxPlans.
constexpr size_t kMaxPlans = 4096;
PlanCache<pt_gemm_fp8_plan> g_plans;

pt_gemm_fp8_plan make_plan(const pt_tensor& pa, const pt_tensor& psa, int32_t sa, const pt_tensor& pb,
                           const pt_tensor& psb, int32_t sb, const pt_tensor& pd, float beta, int32_t flags,
                           int32_t device) {
  const GemmFp8PlanRequest request{&pa, &psa, sa, &pb, &psb, sb, &pd, beta, flags};
  const Choice c = plan_with_python(kPlanGemmFp8, &request, device, kOp);
  pt_gemm_fp8_plan plan = nullptr;
  check_status(pt_gemm_fp8_plan_create(&pa, &psa, sa, &pb, &psb, sb, &pd, beta, flags, c.backend, c.config, &plan),
               kOp);
  return plan;
}

// The forward product; with for_backward, also the copies the backward reads: a along M and b
// along N (as the quantizer wrote them), else none.
struct Forward {
  Tensor out;
  std::optional<Quantized> a_bwd, b_bwd;
};

// a's amax (float32 [1]) from the op that wrote a, for TENSORWISE: its amax pass is skipped.
const Tensor* checked_amax(const Tensor* amax, int64_t granularity, const char* name) {
  if (amax == nullptr) return nullptr;
  if (granularity != PT_QUANT_TENSORWISE)
    fail_with(ErrorKind::Value, kOp, ": argument '", name, "' is given for granularity code ", granularity,
              "; only TENSORWISE takes a precomputed amax");
  return amax;
}

// b given quantized (a layer's per-step weight copy): its copy along K, [N, K] row-major, in the
// scaling the granularity's weights take, on a's device. Checked here since no quantizer wrote it.
void check_prequantized_b(const Quantized& b, int64_t k, ScalarType fwd_dtype, int64_t granularity) {
  const Tensor &q = b.q, &s = b.s;
  if (q.dim() != 2 || q.sizes()[1] != k)
    fail_with(ErrorKind::Value, kOp, ": argument 'b_q' must be [N, K=", k, "] (quantized along K), got ",
              shape_string(q));
  if (q.scalar_type() != fwd_dtype)
    fail_with(ErrorKind::Type, kOp, ": argument 'b_q' has dtype ", dtype_name(q.scalar_type()), "; expected ",
              dtype_name(fwd_dtype), " (the config's forward format)");
  if (!q.is_contiguous()) fail_with(ErrorKind::Value, kOp, ": argument 'b_q' must be contiguous");
  const int32_t wgt = fp8_scalings(granularity, kOp).second;
  if (b.scaling != wgt)
    fail_with(ErrorKind::Value, kOp, ": argument 'b_q' has scaling code ", b.scaling, "; granularity code ",
              granularity, " reads weights with code ", wgt);
  const int64_t n = q.sizes()[0], kb = cdiv(k, 128), nb = cdiv(n, 128);
  const bool ok = s.scalar_type() == ScalarType::Float && s.is_contiguous() &&
                  (wgt == PT_FP8_SCALING_TENSOR  ? s.numel() == 1
                   : wgt == PT_FP8_SCALING_ROW   ? s.numel() == n
                                                 : s.dim() == 2 && s.sizes()[0] == nb &&
                                                     (s.sizes()[1] == kb || s.sizes()[1] == kb + (4 - kb % 4) % 4));
  if (!ok)
    fail_with(ErrorKind::Value, kOp, ": argument 'b_scale_inv' ", shape_string(s), " (", dtype_name(s.scalar_type()),
              ") does not fit b_q ", shape_string(q), " with scaling code ", wgt,
              ": expected contiguous float32, one value / one per row / [ceil(N/128), ceil(K/128)]");
}

// The forward product; b is quantized here with a (b_pre null) or given as its copy along K
// (b_pre: b is then not read). With for_backward, also the copies the backward reads: a along M
// and, when b was quantized here, b along N (as the quantizer wrote them).
Forward forward(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b, ScalarType out_dtype,
                ScalarType fwd_dtype, int64_t granularity, bool for_backward, const Tensor* a_amax,
                bool fast_accum, const Quantized* b_pre = nullptr) {
  int64_t m, k, n;
  NamedTensors inputs{{"a", &a_in}};
  if (b_pre) {
    // b's role is played by b_pre->q [N, K]; check a as the hp operand against itself read as b.
    std::tie(m, k, std::ignore) = check_dense_operands(kOp, a_in, a_in, trans_a, !trans_a, out_dtype, false,
                                                       "FP8 GEMM operands are read in 16-byte rows", "");
    check_prequantized_b(*b_pre, k, fwd_dtype, granularity);
    n = b_pre->q.sizes()[0];
    if (for_backward && (m % 16 || n % 16))
      fail_with(ErrorKind::Value, kOp, ": the backward needs M=", m, " and N=", n,
                " to be multiples of 16 (its transposed FP8 operands have rows of length M and N)");
    inputs.push_back({"b_q", &b_pre->q});
    inputs.push_back({"b_scale_inv", &b_pre->s});
  } else {
    std::tie(m, k, n) = check_dense_operands(kOp, a_in, b_in, trans_a, trans_b, out_dtype, for_backward,
                                             "FP8 GEMM operands are read in 16-byte rows",
                                             "its transposed FP8 operands have rows of length M and N");
    inputs.push_back({"b", &b_in});
  }
  if (a_amax) inputs.push_back({"a_amax", a_amax});
  const int32_t device = check_cuda(kOp, inputs);
  if (m == 0 || n == 0 || k == 0)
    fail_with(ErrorKind::Value, kOp, ": empty problems take the composite path");  // the Python layer's job
  DeviceScope scope(device);
  void* stream = current_stream(device);
  const Tensor a = as_contiguous(a_in);
  // a's copy along K feeds the forward, the one along M the wgrad; b's along K the forward, along
  // N the dgrad. Which of a quantizer's two outputs is which depends on the transposes.
  const bool a_row = !trans_a || for_backward, a_col = trans_a || for_backward;
  // The copies the forward reads are transient; the ones the backward reads are returned.
  const bool keep = for_backward;
  QuantRequest qa = request(a, fwd_dtype, granularity, false, a_row, a_col, keep && trans_a, keep && !trans_a);
  qa.amax = checked_amax(a_amax, granularity, "a_amax");
  Forward f{empty({m, n}, out_dtype, device), std::nullopt, std::nullopt};
  if (b_pre) {
    auto q = quantize_fp8_jobs({qa}, device, stream, "gemm_fp8 quantize", true);
    auto& [qa_row, qa_col] = q[0];
    fp8_mm(trans_a ? *qa_col : *qa_row, *b_pre, f.out, 0.0f, device, stream, fast_accum);
    if (for_backward) f.a_bwd = trans_a ? qa_row : qa_col;
    return f;
  }
  const Tensor b = as_contiguous(b_in);
  const bool b_row = trans_b || for_backward, b_col = !trans_b || for_backward;
  // Both operands in one call (small ones in one launch, their amax reductions included); the copies
  // kept for the backward in one allocation (saved together, freed together).
  auto q = quantize_fp8_jobs(
      {qa, request(b, fwd_dtype, granularity, true, b_row, b_col, keep && !trans_b, keep && trans_b)}, device, stream,
      "gemm_fp8 quantize", true);
  auto& [qa_row, qa_col] = q[0];
  auto& [qb_row, qb_col] = q[1];
  fp8_mm(trans_a ? *qa_col : *qa_row, trans_b ? *qb_row : *qb_col, f.out, 0.0f, device, stream, fast_accum);
  if (for_backward) {
    f.a_bwd = trans_a ? qa_row : qa_col;
    f.b_bwd = trans_b ? qb_col : qb_row;
  }
  return f;
}

}  // namespace

Tensor gemm_fp8_inference(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, ScalarType out_dtype,
                          ScalarType fwd_dtype, int64_t granularity, const Tensor* a_amax, bool fast_accum) {
  return forward(a, b, trans_a, trans_b, out_dtype, fwd_dtype, granularity, false, a_amax, fast_accum).out;
}

Fp8ForwardResult gemm_fp8_training_forward(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                                           ScalarType out_dtype, ScalarType fwd_dtype, int64_t granularity,
                                           bool for_backward, const Tensor* a_amax, bool fast_accum) {
  Forward f = forward(a, b, trans_a, trans_b, out_dtype, fwd_dtype, granularity, for_backward, a_amax, fast_accum);
  if (!for_backward) {
    const int32_t device = f.out.get_device();
    return {f.out, placeholder(device), placeholder(device), placeholder(device), placeholder(device)};
  }
  return {f.out, f.a_bwd->q, f.a_bwd->s, f.b_bwd->q, f.b_bwd->s};
}

Fp8GivenBResult gemm_fp8_forward_given_b(const Tensor& a, const Quantized& b, bool trans_a, ScalarType out_dtype,
                                         ScalarType fwd_dtype, int64_t granularity, bool for_backward,
                                         const Tensor* a_amax, bool fast_accum) {
  Forward f = forward(a, b.q, trans_a, true, out_dtype, fwd_dtype, granularity, for_backward, a_amax, fast_accum, &b);
  if (!for_backward) {
    const int32_t device = f.out.get_device();
    return {f.out, placeholder(device), placeholder(device)};
  }
  return {f.out, f.a_bwd->q, f.a_bwd->s};
}

std::tuple<Tensor, Tensor> gemm_fp8_backward(const Tensor& grad_in, const Tensor& a_bwd, const Tensor& sa_bwd,
                                             const Tensor& b_bwd, const Tensor& sb_bwd, bool trans_a, bool trans_b,
                                             ScalarType grad_dtype, int64_t granularity, ScalarType a_dtype,
                                             ScalarType b_dtype, bool need_a, bool need_b,
                                             const std::optional<Tensor>& main_grad, const Tensor* grad_amax) {
  NamedTensors tensors{{"grad_out", &grad_in}, {"a_bwd", &a_bwd}, {"b_bwd", &b_bwd}};
  if (main_grad) tensors.push_back({"main_grad", &*main_grad});
  if (grad_amax) tensors.push_back({"grad_amax", grad_amax});
  const int32_t device = check_cuda(kOp, tensors);
  DeviceScope scope(device);
  void* stream = current_stream(device);
  const auto [act, wgt] = fp8_scalings(granularity, kOp);
  const Tensor grad = as_contiguous(grad_in);  // [M, N]
  const bool wgrad = need_b || main_grad.has_value();
  QuantRequest qg = request(grad, grad_dtype, granularity, false, need_a, wgrad, false, false);
  qg.amax = checked_amax(grad_amax, granularity, "grad_amax");
  auto q = quantize_fp8_jobs({qg}, device, stream, "gemm_fp8 quantize");
  auto& [g_row, g_col] = q[0];
  const Quantized a_saved{a_bwd, sa_bwd, act};  // [K, M] along M
  const Quantized b_saved{b_bwd, sb_bwd, wgt};  // [K, N] along N
  const int64_t m = grad.sizes()[0], n = grad.sizes()[1], k = a_bwd.sizes()[0];
  Tensor grad_a = placeholder(device), grad_b = placeholder(device);
  if (need_a) {
    // d op(a) [M, K] = grad [M, N] x op(b) [K, N]^T; with trans_a the operands swap and d a [K, M]
    // comes out directly.
    grad_a = trans_a ? empty({k, m}, a_dtype, device) : empty({m, k}, a_dtype, device);
    if (trans_a)
      fp8_mm(b_saved, *g_row, grad_a, 0.0f, device, stream);
    else
      fp8_mm(*g_row, b_saved, grad_a, 0.0f, device, stream);
  }
  if (wgrad) {
    // d op(b) [K, N] = op(a)^T [K, M] x grad^T [N, M]^T; with trans_b, d b [N, K] directly.
    const Quantized& x = trans_b ? *g_col : a_saved;
    const Quantized& y = trans_b ? a_saved : *g_col;
    if (main_grad) {
      fp8_mm(x, y, *main_grad, 1.0f, device, stream);
    } else {
      grad_b = trans_b ? empty({n, k}, b_dtype, device) : empty({k, n}, b_dtype, device);
      fp8_mm(x, y, grad_b, 0.0f, device, stream);
    }
  }
  return {grad_a, grad_b};
}

namespace {

Fp8ForwardResult gemm_fp8_fwd(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype,
                              ScalarType fwd_dtype, int64_t granularity, bool for_backward, bool fast_accum) {
  return gemm_fp8_training_forward(a, b, trans_a, trans_b, out_dtype, fwd_dtype, granularity, for_backward, nullptr,
                                   fast_accum);
}

// The forward with b given as its FP8 copy along K (b_q [N, K], b_scale_inv, its pt_fp8_scaling
// code), e.g. a layer's per-step weight cache: only a is quantized. (out, a_bwd, sa_bwd); the
// backward is gemm_fp8_bwd with the weight's copy along N, which the caller holds.
Fp8GivenBResult gemm_fp8_fwd_qb(Tensor a, Tensor b_q, Tensor b_scale_inv, int64_t b_scaling, bool trans_a,
                                ScalarType out_dtype, ScalarType fwd_dtype, int64_t granularity, bool for_backward,
                                bool fast_accum) {
  const Quantized b{b_q, b_scale_inv, static_cast<int32_t>(b_scaling)};
  return gemm_fp8_forward_given_b(a, b, trans_a, out_dtype, fwd_dtype, granularity, for_backward, nullptr,
                                  fast_accum);
}

// Inference (no backward follows): the product only, with no placeholder outputs.
Tensor gemm_fp8(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype, ScalarType fwd_dtype,
                int64_t granularity, bool fast_accum) {
  return gemm_fp8_inference(a, b, trans_a, trans_b, out_dtype, fwd_dtype, granularity, nullptr, fast_accum);
}

std::tuple<Tensor, Tensor> gemm_fp8_bwd(Tensor grad_in, Tensor a_bwd, Tensor sa_bwd, Tensor b_bwd, Tensor sb_bwd,
                                        bool trans_a, bool trans_b, ScalarType grad_dtype, int64_t granularity,
                                        ScalarType a_dtype, ScalarType b_dtype, bool need_a, bool need_b,
                                        std::optional<Tensor> main_grad) {
  return gemm_fp8_backward(grad_in, a_bwd, sa_bwd, b_bwd, sb_bwd, trans_a, trans_b, grad_dtype, granularity, a_dtype,
                           b_dtype, need_a, need_b, main_grad, nullptr);
}

}  // namespace


std::tuple<int64_t, int64_t, int64_t> check_dense_operands(const char* op, const Tensor& a, const Tensor& b, bool ta,
                                                           bool tb, ScalarType out_dtype, bool backward,
                                                           const char* k_reason, const char* bwd_reason) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"a", &a}, {"b", &b}}) {
    if (t->dim() != 2)
      fail_with(ErrorKind::Value, op, ": argument '", name, "' must be 2-D, got shape ", shape_string(*t));
    if (!is_float_dtype(t->scalar_type()))
      fail_with(ErrorKind::Type, op, ": argument '", name, "' has dtype ", dtype_name(t->scalar_type()),
                "; expected float16, bfloat16 or float32");
  }
  if (b.scalar_type() != a.scalar_type())
    fail_with(ErrorKind::Type, op, ": argument 'b' has dtype ", dtype_name(b.scalar_type()),
              "; expected the dtype of 'a' (", dtype_name(a.scalar_type()), ")");
  if (!is_float_dtype(out_dtype))
    fail_with(ErrorKind::Type, op, ": out_dtype ", dtype_name(out_dtype),
              " is not supported; expected float32, float16 or bfloat16");
  const auto as = a.sizes(), bs = b.sizes();
  const int64_t m = ta ? as[1] : as[0], k = ta ? as[0] : as[1];
  const int64_t kb = tb ? bs[1] : bs[0], n = tb ? bs[0] : bs[1];
  if (k != kb)
    fail_with(ErrorKind::Value, op, ": inner dimensions do not match: op(a) is [", m, ", ", k, "] (a ",
              shape_string(a), ", trans_a=", ta ? "True" : "False", ") but op(b) is [", kb, ", ", n, "] (b ",
              shape_string(b), ", trans_b=", tb ? "True" : "False", ")");
  if (k % 16)
    fail_with(ErrorKind::Value, op, ": K=", k, " must be a multiple of 16 (", k_reason, ")");
  if (backward && (m % 16 || n % 16))
    fail_with(ErrorKind::Value, op, ": the backward needs M=", m, " and N=", n,
              " to be multiples of 16 (", bwd_reason, ")");
  return {m, k, n};
}

void fp8_mm(const Quantized& x, const Quantized& y, const Tensor& out, float beta, int32_t device, void* stream,
            bool fast_accum) {
  if (out.numel() == 0) return;
  const Tensor sx = kernel_scale(x), sy = kernel_scale(y);
  const pt_tensor pa = to_pt(x.q), pb = to_pt(y.q), pd = to_pt(out);
  const pt_tensor psa = scale_descriptor(sx, x.scaling), psb = scale_descriptor(sy, y.scaling);
  std::vector<int64_t> values{pa.shape[0], pa.shape[1], pb.shape[0], pa.dtype,     pb.dtype,
                              pd.dtype,    pd.strides[0], x.scaling, y.scaling, beta != 0.0f,
                              device,      alignment(pa.data), alignment(pb.data), alignment(pd.data),
                              fast_accum};
  const PlanKey key = plan_key(std::move(values), {"PRIMUS_TURBO_GEMM_BACKEND", "PRIMUS_TURBO_AUTO_TUNE"});
  OwnedPlan<pt_gemm_fp8_plan> owned(nullptr, pt_gemm_fp8_plan_destroy);
  const pt_gemm_fp8_plan plan = cached_plan(
      g_plans, key, stream, owned,
      [&] {
        return make_plan(pa, psa, x.scaling, pb, psb, y.scaling, pd, beta, fast_accum ? PT_GEMM_FP8_FAST_ACCUM : 0,
                         device);
      },
      kMaxPlans);
  // The workspace comes from the caching allocator per call (graph-pool safe), and only where the
  // plan's algorithm reads one.
  std::optional<Tensor> ws;
  size_t ws_bytes = 0;
  if (pt_gemm_fp8_plan_needs_workspace(plan)) {
    ws_bytes = pt_gemm_workspace_bytes();
    ws = empty({static_cast<int64_t>(ws_bytes)}, ScalarType::Byte, device);
  }
  check_status(pt_gemm_fp8_plan_run(plan, pa.data, psa.data, pb.data, psb.data, pd.data, ws ? ws->data_ptr() : nullptr,
                                    ws_bytes, stream),
               kOp);
}

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("gemm_fp8_fwd(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype, ScalarType fwd_dtype, "
        "int granularity, bool for_backward, bool fast_accum=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("gemm_fp8_fwd_qb(Tensor a, Tensor b_q, Tensor b_scale_inv, int b_scaling, bool trans_a, "
        "ScalarType out_dtype, ScalarType fwd_dtype, int granularity, bool for_backward, bool fast_accum=False) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("gemm_fp8(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype, ScalarType fwd_dtype, "
        "int granularity, bool fast_accum=False) -> Tensor");
  m.def("gemm_fp8_bwd(Tensor grad_out, Tensor a_bwd, Tensor sa_bwd, Tensor b_bwd, Tensor sb_bwd, bool trans_a, "
        "bool trans_b, ScalarType grad_dtype, int granularity, ScalarType a_dtype, ScalarType b_dtype, bool need_a, "
        "bool need_b, Tensor(a!)? main_grad) -> (Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("gemm_fp8_fwd", TORCH_BOX(&gemm_fp8_fwd));
  m.impl("gemm_fp8", TORCH_BOX(&gemm_fp8));
  m.impl("gemm_fp8_fwd_qb", TORCH_BOX(&gemm_fp8_fwd_qb));
  m.impl("gemm_fp8_bwd", TORCH_BOX(&gemm_fp8_bwd));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
