// primus_turbo::grouped_gemm_fp8_fwd / _bwd: the FP8 mixture-of-experts grouped GEMM (TENSORWISE,
// ROWWISE, BLOCKWISE; E4M3, E5M2 or HYBRID) composed in one native call per direction: quantize the
// tokens and the expert weights, state their scales in the layout the kernel reads, orient the
// weight K-major, pick the plan, launch. And primus_turbo::grouped_gemm_fp8_mm / _wgrad_mm: the
// kernel alone on operands quantized elsewhere (pre-quantized tensors, FP4 and MX emulation), and
// primus_turbo::grouped_gemm_fp4_fwd / _bwd: the MXFP4 grouped GEMM emulated on the same kernel.
//
// The kernel (grouped_gemm_fp8.h) reads A [M, K] with scales [M, ceil(K/128)] and B [G, N, K] with
// scales per row or per 128x128 block of each expert, both K-major. With b [G, X, Y] as given
// (trans_b: [G, N, K], else [G, K, N]):
//   forward  out = a    [M,K] x op(b)^T [G,N,K]   (b as it lies with trans_b, else transposed)
//   dgrad    da  = grad [M,N] x op(b)   [G,K,N]   (b transposed with trans_b, else as it lies)
//   wgrad    db  = per-group a^T grad on the bf16/fp16 grouped GEMM (ops/grouped_gemm_fp8.py says why)
// Weights whose experts' rows are a multiple of 128 are quantized once, in both orientations from
// one read (each expert's transposed copy written by the quantizer: a 128x128 block keeps its
// scale when transposed; ROWWISE scales the copy per column of the expert, after an amax pass).
// Other ROWWISE weights are quantized again along N by the backward. Group sizes stay on the device.
#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/csrc/stable/ops.h>

#include "bindings/torch/fp4_quantize.h"
#include "bindings/torch/fp8_quantize.h"
#include "bindings/torch/grouped_gemm_run.h"
#include "bindings/torch/plan_cache.h"
#include "primus_turbo/grouped_gemm_fp8.h"
#include "primus_turbo/layout.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr const char* kOp = "grouped_gemm_fp8";
constexpr int64_t kBlock = 128;

PlanCache<WorkspacePlan> g_plans;

// out = grouped (a * sa) @ (b * sb)^T on the cached plan of the problem. tokens < 0: forward/dgrad;
// else the variable-K wgrad over that many tokens. b_scale_rows 0: row scales (sa [M], sb [G, N]),
// with fast_accum the forward's fast accumulation.
void run_mm(const Tensor& a_in, const Tensor& sa_in, const Tensor& b_in, const Tensor& sb_in, const Tensor& lens_in,
            const std::optional<Tensor>& offs_in, const Tensor& out, int64_t b_scale_rows, int64_t num_sms,
            int64_t tokens, int32_t device, void* stream, bool fast_accum = false) {
  if (out.numel() == 0) return;
  if (num_sms < 0 || num_sms > INT32_MAX)
    fail_with(ErrorKind::Value, kOp, ": num_cu must be a positive int or None, got ", num_sms);
  if (b_scale_rows != 0 && b_scale_rows != 1 && b_scale_rows != 128)
    fail_with(ErrorKind::Value, kOp, ": b_scale_rows must be 1 or 128 (0: row scales), got ", b_scale_rows);
  const int32_t flags = fast_accum && b_scale_rows == 0 ? PT_GEMM_FP8_FAST_ACCUM : 0;
  const Tensor a = as_contiguous(a_in), sa = as_contiguous(sa_in), b = as_contiguous(b_in),
               sb = as_contiguous(sb_in), lens = as_contiguous(lens_in);
  std::optional<Tensor> offs;
  if (offs_in) offs = as_contiguous(*offs_in);
  const pt_tensor pa = to_pt(a), psa = to_pt(sa), pb = to_pt(b), psb = to_pt(sb), pl = to_pt(lens), pd = to_pt(out);
  pt_tensor po{};
  if (offs) po = to_pt(*offs);
  const bool wgrad = tokens >= 0;
  const pt_grouped_gemm_fp8_args args{&pa, &psa, &pb, &psb, &pl, offs ? &po : nullptr, &pd,
                                      static_cast<int32_t>(b_scale_rows), static_cast<int32_t>(num_sms),
                                      wgrad ? 1 : 0, wgrad ? tokens : 0, flags};
  std::vector<int64_t> values{pa.shape[0], pa.shape[1], pb.shape[0], pb.shape[1], pb.ndim > 2 ? pb.shape[2] : -1,
                              pl.shape[0], offs ? 1 : 0, pa.dtype, pb.dtype, pd.dtype, b_scale_rows, tokens,
                              device, alignment(pa.data) >= 16, alignment(pb.data) >= 16, alignment(pd.data) >= 16,
                              num_sms, flags};
  const PlanKey key = plan_key(std::move(values), {"PRIMUS_TURBO_GROUPED_GEMM_BACKEND", "PRIMUS_TURBO_AUTO_TUNE"});
  const WorkspacePlan plan = workspace_plan(
      g_plans, key, kPlanGroupedGemmFp8, &args, device, stream, kOp,
      [&](int32_t backend, int32_t config, size_t* bytes) {
        return pt_grouped_gemm_fp8_workspace_size(&args, backend, config, bytes);
      });
  const Tensor ws = plan_workspace(plan, device);
  check_status(pt_grouped_gemm_fp8(&args, plan.choice.backend, plan.choice.config, ws.data_ptr(),
                                   plan.workspace_bytes, stream),
               kOp);
}

// A scale tensor broadcast into a fresh contiguous [shape] (the kernel reads every block's scale).
Tensor broadcast(const Tensor& s, const std::vector<int64_t>& shape, int32_t device) {
  Tensor out = empty(shape.data(), static_cast<int64_t>(shape.size()), ScalarType::Float, device);
  torch::stable::copy_(out, s);
  return out;
}

// x [G, R, C] (contiguous) -> [G, C, R].
Tensor transpose_last2(const Tensor& x, void* stream) {
  const auto s = x.sizes();
  Tensor y = empty({s[0], s[2], s[1]}, x.scalar_type(), x.get_device());
  const pt_tensor px = to_pt(x);
  pt_tensor py = to_pt(y);
  check_status(pt_transpose_last2(&px, &py, stream), kOp);
  return y;
}

// Tokens x [R, C] to quantize along C (the kernel's A operand), read by this call's launches only.
QuantRequest tokens_request(const Tensor& x, ScalarType dtype, int64_t granularity) {
  return QuantRequest{&x, QuantSpec{dtype, granularity}, true, false, true, false};
}

// A weight operand as the kernel reads B: q [G, n, k] K-major, its scales and b_scale_rows (0: one
// scale per row, s [G, n]: the row-scaled kernel).
struct WeightOperand {
  Tensor q;
  Tensor s;
  int64_t rows;
};

// x's quantization in the kernel's A layout for the weight operand wb it meets: q [R, C] with
// scale [R] (against a row-scaled weight: ROWWISE's own, TENSORWISE's one value repeated) or
// [R, ceil(C/128)] (TENSORWISE / ROWWISE scales repeated over the K blocks they cover).
std::pair<Tensor, Tensor> tokens_operand(const QuantPair& quantized, const Tensor& x, int64_t granularity,
                                         const WeightOperand& wb, int32_t device) {
  const Quantized& row = *quantized.first;
  if (granularity == PT_QUANT_BLOCKWISE) return {row.q, row.s};
  const int64_t rows = x.sizes()[0];
  if (wb.rows == 0)
    return {row.q, granularity == PT_QUANT_ROWWISE ? torch::stable::view(row.s, {rows}) : broadcast(row.s, {rows}, device)};
  return {row.q, broadcast(row.s, {rows, cdiv(x.sizes()[1], kBlock)}, device)};
}

// A weight w [G, X, Y] flattened to [G * X, Y] for its quantization along Y: for ROWWISE in its
// K-major orientation (K = Y, or X with transpose: transposed first), else as it lies.
Tensor weight_rows_source(const Tensor& w, bool transpose, void* stream) {
  const Tensor src = transpose ? transpose_last2(w, stream) : w;
  return torch::stable::view(src, {src.sizes()[0] * src.sizes()[1], src.sizes()[2]});
}

// keep: the op returns the quantized weight (for the backward), else this call alone reads it.
QuantRequest weight_request(const Tensor& flat, ScalarType dtype, int64_t granularity, bool keep) {
  return QuantRequest{&flat, QuantSpec{dtype, granularity, granularity == PT_QUANT_BLOCKWISE}, true, false, !keep,
                      false};
}

// ROWWISE: a weight quantized per row, q [G * N, K] or [G, N, K] K-major with one scale per row
// (G * N of them), as the row-scaled kernel's B.
WeightOperand weight_rows(const Quantized& row, int64_t g) {
  const int64_t k = row.q.sizes()[row.q.dim() - 1], n = row.q.numel() / (g * k);
  return {torch::stable::view(row.q, {g, n, k}), torch::stable::view(as_contiguous(row.s), {g, n}), 0};
}

// A ROWWISE or TENSORWISE weight operand in a block layout (ROWWISE: its per-row scales repeated
// over the K blocks, [G, n, kb], rows 1; TENSORWISE: its one scale over every block, rows 128) as the
// row-scaled kernel's B: one scale a row, [G, n]. The repetition is the layout's contract (the
// library's quantizers and weight caches write it so); it is not checked on the device.
WeightOperand rows_of(const WeightOperand& w, int64_t granularity, int32_t device) {
  if (w.rows == 0 || w.s.dim() != 3) return w;
  const int64_t g = w.q.sizes()[0], n = w.q.sizes()[1];
  if (granularity == PT_QUANT_ROWWISE) {
    if (w.rows != 1)
      fail_with(ErrorKind::Value, kOp, ": a ROWWISE weight's scales are per row (rows 1, [G, N, ceil(K/128)]); got ",
                "rows ", w.rows, " and scales ", shape_string(w.s));
    return {w.q, as_contiguous(torch::stable::select(w.s, 2, 0)), 0};
  }
  Tensor flat = torch::stable::view(as_contiguous(w.s), {w.s.numel()});
  const Tensor one = torch::stable::narrow(flat, 0, 0, 1);
  return {w.q, broadcast(one, {g, n}, device), 0};
}

// TENSORWISE / BLOCKWISE: the weight [G, X, Y] quantized as it lies: (q [G, X, Y], scale: 0-dim or
// [G, X/128, ceil(Y/128)] per 128x128 block; X % 128 == 0, so no block crosses two experts).
std::pair<Tensor, Tensor> weight_blocks(const QuantPair& quantized, int64_t g, int64_t granularity) {
  const Quantized& row = *quantized.first;
  const int64_t x = row.q.sizes()[0] / g, y = row.q.sizes()[1];
  const Tensor q = torch::stable::view(row.q, {g, x, y});
  if (granularity != PT_QUANT_BLOCKWISE) return {q, row.s};
  return {q, torch::stable::view(row.s, {g, x / kBlock, cdiv(y, kBlock)})};
}

// A weight stack w [G, X, Y] (X % 128 == 0) quantized from one read (ROWWISE: after an amax pass
// over it): as it lies (row, [G, X, Y]) and / or each expert transposed (col, [G, Y, X]), for the
// forward's B (trans_b: as it lies) and, with for_backward, the dgrad's (the other; returned, so
// not transient). ROWWISE scales the row output per row of each expert and the column output per
// column, so each orientation has one scale per row of its K-major form.
QuantRequest weight_stack_request(const Tensor& w, ScalarType dtype, int64_t granularity, bool trans_b,
                                  bool for_backward) {
  return QuantRequest{&w, QuantSpec{dtype, granularity, granularity == PT_QUANT_BLOCKWISE},
                      trans_b || for_backward, !trans_b || for_backward, trans_b, !trans_b};
}

// Whether weight_stack_request takes this weight (else: quantized flat, transposed before or after).
// A ROWWISE weight the forward alone reads along its rows keeps the one-pass row quantization (its
// amax inside the kernel); with a transpose or a dgrad copy the stack's amax pass costs less.
bool stack_quantizable(const Tensor& w, int64_t granularity, bool trans_b, bool for_backward) {
  if (w.sizes()[1] % kBlock) return false;
  return granularity != PT_QUANT_ROWWISE || for_backward || !trans_b;
}

// quantize_weight_blocks' result as the kernel's K-major B (K = Y, or X with transpose).
WeightOperand orient_blocks(const Tensor& q, const Tensor& s, bool transpose, int32_t device, void* stream) {
  const Tensor qb = transpose ? transpose_last2(q, stream) : q;
  const int64_t g = qb.sizes()[0], n = qb.sizes()[1], k = qb.sizes()[2];
  if (s.dim() == 0) return {qb, broadcast(s, {g, cdiv(n, kBlock), cdiv(k, kBlock)}, device), kBlock};
  return {qb, transpose ? torch::stable::contiguous(torch::stable::transpose(s, 1, 2)) : s, kBlock};
}

// A weight given already in the kernel's B layout (a per-step cache: GroupedLinear with
// cache_quantized_weight): q [G, N, K] FP8 K-major for this product's N and K, scales in the layout
// b_scale_rows names. Checked against the problem, so a stale or mismatched copy gets an error.
WeightOperand given_weight(const char* what, const Tensor& q, const std::optional<Tensor>& s, int64_t rows,
                           int64_t groups, int64_t n, int64_t k, int64_t granularity) {
  if (!s) fail_with(ErrorKind::Value, kOp, ": ", what, "_q is given without ", what, "_s");
  if (q.dim() != 3 || q.sizes()[0] != groups || q.sizes()[1] != n || q.sizes()[2] != k)
    fail_with(ErrorKind::Value, kOp, ": ", what, "_q has shape ", shape_string(q), "; expected [", groups, ", ", n,
              ", ", k, "] (K-major)");
  if (q.scalar_type() != ScalarType::Float8_e4m3fn && q.scalar_type() != ScalarType::Float8_e5m2)
    fail_with(ErrorKind::Type, kOp, ": ", what, "_q has dtype ", dtype_name(q.scalar_type()),
              "; expected a float8 dtype");
  if (s->scalar_type() != ScalarType::Float)
    fail_with(ErrorKind::Type, kOp, ": ", what, "_s has dtype ", dtype_name(s->scalar_type()), "; expected float32");
  if (rows == 0) {
    // The row-scaled kernel's own form, one scale a row (grouped_weight_rows_fp8's): ROWWISE only.
    if (granularity != PT_QUANT_ROWWISE)
      fail_with(ErrorKind::Value, kOp, ": ", what, "_rows=0 (one scale a row) is a ROWWISE weight's form; granularity ",
                "code ", granularity, " reads rows 1 or 128");
    if (s->dim() != 2 || s->sizes()[0] != groups || s->sizes()[1] != n || !s->is_contiguous())
      fail_with(ErrorKind::Value, kOp, ": ", what, "_s has shape ", shape_string(*s), " with ", what,
                "_rows=0; expected contiguous [", groups, ", ", n, "]");
    return {q, *s, 0};
  }
  const int64_t kb = cdiv(k, kBlock), sn = rows == 1 ? n : cdiv(n, kBlock);
  if ((rows != 1 && rows != kBlock) || s->dim() != 3 || s->sizes()[0] != groups || s->sizes()[1] != sn ||
      s->sizes()[2] != kb)
    fail_with(ErrorKind::Value, kOp, ": ", what, "_s has shape ", shape_string(*s), " with ", what, "_rows=", rows,
              "; expected [", groups, ", ", sn, ", ", kb, "] with rows 1 or 128");
  return {q, *s, rows};
}

// The backward's inputs as the forward left them: grad [M, N] and a [M, K] 2-D with M rows each,
// b [G, ...] 3-D (a direct call through torch.ops gets the error, not a bad read).
void check_backward_operands(const char* op, const Tensor& grad, const Tensor& a, const Tensor& b) {
  if (grad.dim() != 2 || a.dim() != 2 || b.dim() != 3 || grad.sizes()[0] != a.sizes()[0])
    fail_with(ErrorKind::Value, op, ": backward operands grad_out ", shape_string(grad), ", a ", shape_string(a),
              ", b ", shape_string(b), " are not the forward's ([M, N], [M, K], [G, ...])");
}

// The weight gradient of a low-precision grouped GEMM: the bf16/fp16 variable-K grouped GEMM of a
// and the output gradient (in a's dtype), [G, N, K] with trans_b, else [G, K, N].
Tensor hp_wgrad(const Tensor& a, const Tensor& grad, const Tensor& lens, const std::optional<Tensor>& offs,
                bool trans_b, int64_t k, int64_t num_sms, int32_t device) {
  const int64_t groups = lens.sizes()[0], n = grad.sizes()[1];
  Tensor out = trans_b ? empty({groups, n, k}, a.scalar_type(), device) : empty({groups, k, n}, a.scalar_type(), device);
  grouped_gemm_run(a, contiguous_as(grad, a.scalar_type()), lens, offs, out, true, trans_b, num_sms, device);
  return out;
}

bool is_hp(ScalarType t) { return t == ScalarType::Half || t == ScalarType::BFloat16; }
bool is_out(ScalarType t) { return is_hp(t) || t == ScalarType::Float; }

// The checks of ops/grouped_gemm_fp8.py's check_hp_operands, in the same order and words, then K
// and N multiples of `multiple` (why: `reason`) and a non-empty problem. Returns (M, K, N).
std::tuple<int64_t, int64_t, int64_t> check_hp_operands(const char* op, const Tensor& a, const Tensor& b,
                                                        const Tensor& lens, const std::optional<Tensor>& offs,
                                                        bool trans_b, ScalarType out_dtype, int64_t multiple,
                                                        const char* reason) {
  for (const auto& [name, t, nd] : {std::tuple<const char*, const Tensor*, int64_t>{"a", &a, 2}, {"b", &b, 3}}) {
    if (t->dim() != nd)
      fail_with(ErrorKind::Value, op, ": argument '", name, "' must be ", nd, "-D, got shape ", shape_string(*t));
    if (!is_hp(t->scalar_type()))
      fail_with(ErrorKind::Type, op, ": argument '", name, "' has dtype ", dtype_name(t->scalar_type()),
                "; expected bfloat16 or float16");
  }
  if (b.scalar_type() != a.scalar_type())
    fail_with(ErrorKind::Type, op, ": argument 'b' has dtype ", dtype_name(b.scalar_type()),
              "; expected the dtype of 'a' (", dtype_name(a.scalar_type()), ")");
  if (!is_out(out_dtype))
    fail_with(ErrorKind::Type, op, ": out_dtype ", dtype_name(out_dtype),
              " is not supported; expected bfloat16, float16 or float32");
  check_group_tensors(lens, offs, b.sizes()[0]);
  const int64_t k = a.sizes()[1];
  const int64_t kb = trans_b ? b.sizes()[2] : b.sizes()[1], n = trans_b ? b.sizes()[1] : b.sizes()[2];
  if (kb != k)
    fail_with(ErrorKind::Value, op, ": inner dimensions do not match: 'a' is ", shape_string(a), " but 'b' ",
              shape_string(b), " has K = ", kb, " (trans_b=", trans_b, ")");
  if (k % multiple || n % multiple)
    fail_with(ErrorKind::Value, op, ": K=", k, " and N=", n, " must be multiples of ", multiple, " (", reason, ")");
  if (a.sizes()[0] == 0 || n == 0 || k == 0)
    fail_with(ErrorKind::Value, op, ": empty problems take the composite path");  // the Python layer's job
  return {a.sizes()[0], k, n};
}

// The FP8 operands' checks: row lengths, and the granularities the native path composes.
std::tuple<int64_t, int64_t, int64_t> check_operands(const Tensor& a, const Tensor& b, const Tensor& lens,
                                                     const std::optional<Tensor>& offs, bool trans_b,
                                                     ScalarType out_dtype, int64_t granularity) {
  const auto mkn = check_hp_operands(kOp, a, b, lens, offs, trans_b, out_dtype, 16,
                                     "FP8 operands are read in 16-byte rows, and the dgrad reads rows of length N");
  if (granularity == PT_QUANT_BLOCKWISE && b.sizes()[1] % kBlock)
    fail_with(ErrorKind::NotImplemented, kOp, ": BLOCKWISE weights natively need b.shape[1] % 128 == 0, got ",
              shape_string(b));
  fp8_scalings(granularity, kOp);  // raises for granularities without a native path
  return mkn;
}

// given: a weight's copies passed in the kernel's layout (b_q / b_s, d_q / d_s), checked with the rest.
int32_t check_devices(const char* first, const Tensor& x, const Tensor& b, const Tensor& lens,
                      const std::optional<Tensor>& offs, const char* op = kOp,
                      std::initializer_list<std::pair<const char*, const std::optional<Tensor>*>> given = {}) {
  NamedTensors all{{first, &x}, {"b", &b}, {"group_lens", &lens}};
  add_present(all, "group_offs", offs);
  for (const auto& [name, t] : given) add_present(all, name, *t);
  return check_cuda(op, all);
}

// Returns (out [M, N], wq, ws): with for_backward, the dgrad's B (op(b) [G, K, N], K-major along N)
// and its scales (TENSORWISE 0-dim, ROWWISE [G, K, 1], BLOCKWISE [G, K/128, ceil(N/128)]); else,
// and for ROWWISE experts whose rows are not a multiple of 128, placeholders. b_q / b_s / b_rows: the weight already in the kernel's B layout (given_weight), so
// only the tokens are quantized. ROWWISE, and TENSORWISE with fast_accum, run the row-scaled kernel
// (scales in the epilogue; a given weight's repeated scales taken once a row), accumulating in the
// fast mode with fast_accum.
std::tuple<Tensor, Tensor, Tensor> grouped_gemm_fp8_fwd(Tensor a_in, Tensor b_in, Tensor group_lens,
                                                        std::optional<Tensor> group_offs, bool trans_b,
                                                        ScalarType out_dtype, ScalarType fwd_dtype,
                                                        int64_t granularity, int64_t num_sms, bool for_backward,
                                                        std::optional<Tensor> b_q, std::optional<Tensor> b_s,
                                                        int64_t b_rows, bool fast_accum) {
  const auto [m, k, n] = check_operands(a_in, b_in, group_lens, group_offs, trans_b, out_dtype, granularity);
  const int32_t device = check_devices("a", a_in, b_in, group_lens, group_offs, kOp, {{"b_q", &b_q}, {"b_s", &b_s}});
  DeviceScope scope(device);
  void* stream = current_stream(device);
  check_group_lens_on_host(kOp, group_lens, m, stream);
  const int64_t groups = b_in.sizes()[0];
  const bool rowwise = granularity == PT_QUANT_ROWWISE;
  // The row-scaled kernel for ROWWISE, and for TENSORWISE when its fast accumulation is asked for
  // (promoted, the block-scaled kernel runs it as fast).
  const bool row_scaled = rowwise || (granularity == PT_QUANT_TENSORWISE && fast_accum);
  std::optional<WeightOperand> given;
  if (b_q) given = given_weight("b", *b_q, b_s, b_rows, groups, n, k, granularity);
  if (given && row_scaled) given = rows_of(*given, granularity, device);  // checked before the quantization
  const Tensor a = as_contiguous(a_in);
  // Tokens and (unless given) weight in one call (small ones in one launch, their amax reductions
  // included).
  const QuantRequest tokens = tokens_request(a, fwd_dtype, granularity);
  const bool stack = !given && stack_quantizable(b_in, granularity, trans_b, for_backward);
  std::optional<Tensor> b;
  if (!given) b = stack ? as_contiguous(b_in) : weight_rows_source(as_contiguous(b_in), rowwise && !trans_b, stream);
  std::optional<QuantRequest> weight;
  if (b) {
    weight = stack ? weight_stack_request(*b, fwd_dtype, granularity, trans_b, for_backward)
                   : weight_request(*b, fwd_dtype, granularity, for_backward && !rowwise);
  }
  const auto q = weight ? quantize_fp8_jobs({tokens, *weight}, device, stream, kOp)
                        : quantize_fp8_jobs({tokens}, device, stream, kOp);
  Tensor out = empty({m, n}, out_dtype, device);
  const auto product = [&](WeightOperand wb) {
    if (row_scaled) wb = rows_of(wb, granularity, device);
    const auto [qa, sa] = tokens_operand(q[0], a, granularity, wb, device);
    run_mm(qa, sa, wb.q, wb.s, group_lens, group_offs, out, wb.rows, num_sms, -1, device, stream, fast_accum);
  };
  if (given || (rowwise && !stack)) {
    product(given ? *given : weight_rows(*q[1].first, groups));
    return {out, placeholder(device), placeholder(device)};
  }
  if (stack) {
    const Quantized& fwd = trans_b ? *q[1].first : *q[1].second;
    product(rowwise ? weight_rows(fwd, groups) : orient_blocks(fwd.q, fwd.s, false, device, stream));
    if (!for_backward) return {out, placeholder(device), placeholder(device)};
    const Quantized& dgrad = trans_b ? *q[1].second : *q[1].first;
    return {out, dgrad.q, dgrad.s};
  }
  // A TENSORWISE weight whose experts' rows are not a multiple of 128: quantized flat, each
  // orientation transposed from that copy.
  const auto [wq, ws] = weight_blocks(q[1], groups, granularity);
  product(orient_blocks(wq, ws, !trans_b, device, stream));
  if (!for_backward) return {out, placeholder(device), placeholder(device)};
  return {out, orient_blocks(wq, ws, trans_b, device, stream).q, ws};
}

// Returns (grad_a [M, K] or a placeholder, grad_b like b or a placeholder). need_b: the bf16/fp16
// variable-K wgrad from a and grad_out (in a's dtype). d_q / d_s / d_rows: the dgrad's B (op(b)
// [G, K, N], K-major along N) already in the kernel's layout, so only the gradient is quantized.
std::tuple<Tensor, Tensor> grouped_gemm_fp8_bwd(Tensor grad_in, Tensor a, Tensor b_in, Tensor wq, Tensor ws,
                                                Tensor group_lens, std::optional<Tensor> group_offs, bool trans_b,
                                                ScalarType grad_dtype, ScalarType fwd_dtype, int64_t granularity,
                                                int64_t num_sms, bool need_a, bool need_b, std::optional<Tensor> d_q,
                                                std::optional<Tensor> d_s, int64_t d_rows) {
  const int32_t device =
      check_devices("grad_out", grad_in, b_in, group_lens, group_offs, kOp, {{"d_q", &d_q}, {"d_s", &d_s}});
  check_backward_operands(kOp, grad_in, a, b_in);
  const ScalarType a_dtype = a.scalar_type();
  const int64_t m = grad_in.sizes()[0], n = grad_in.sizes()[1], k = trans_b ? b_in.sizes()[2] : b_in.sizes()[1];
  const int64_t groups = b_in.sizes()[0];
  // The forward's dgrad copy of the weight (a ROWWISE one only where the forward made it: a
  // placeholder means quantize again here).
  const bool oriented = wq.dim() == 3 && wq.sizes()[0] == groups && wq.sizes()[1] == k && wq.sizes()[2] == n;
  if (need_a && !d_q && (granularity != PT_QUANT_ROWWISE || wq.numel() != 0) && !oriented)
    fail_with(ErrorKind::Value, kOp, ": the dgrad needs the forward's quantized weight [G, K, N] = [", groups, ", ", k,
              ", ", n, "], got ", shape_string(wq));
  if (need_a && !d_q && granularity == PT_QUANT_ROWWISE && oriented && ws.numel() != groups * k)
    fail_with(ErrorKind::Value, kOp, ": the forward's ROWWISE weight scales have shape ", shape_string(ws),
              "; expected ", groups * k, " of them (one per row of [G, K, N])");
  std::optional<WeightOperand> wb;
  if (need_a && d_q) wb = given_weight("d", *d_q, d_s, d_rows, b_in.sizes()[0], k, n, granularity);
  DeviceScope scope(device);
  void* stream = current_stream(device);
  // A given ROWWISE copy's scales once a row (the row-scaled kernel), on the op's device.
  if (wb && granularity == PT_QUANT_ROWWISE) wb = rows_of(*wb, granularity, device);
  const Tensor grad = as_contiguous(grad_in);
  Tensor grad_a = placeholder(device), grad_b = placeholder(device);
  if (need_a) {
    // A ROWWISE weight the forward did not quantize along N (its experts' rows not a multiple of
    // 128) is quantized again here, unless given: with the gradient, in one call.
    std::vector<QuantPair> q;
    if (!wb && granularity == PT_QUANT_ROWWISE && !oriented) {
      const Tensor flat_b = weight_rows_source(as_contiguous(b_in), trans_b, stream);
      q = quantize_fp8_jobs({tokens_request(grad, grad_dtype, granularity),
                             weight_request(flat_b, fwd_dtype, granularity, false)},
                            device, stream, kOp);
      wb = weight_rows(*q[1].first, groups);
    } else {
      q = quantize_fp8_jobs({tokens_request(grad, grad_dtype, granularity)}, device, stream, kOp);
      if (!wb) {  // the forward returned it oriented
        wb = granularity == PT_QUANT_ROWWISE ? weight_rows(Quantized{wq, ws, PT_FP8_SCALING_ROW}, groups)
                                             : orient_blocks(wq, ws, false, device, stream);
      }
    }
    const auto [qg, sg] = tokens_operand(q[0], grad, granularity, *wb, device);
    grad_a = empty({m, k}, a_dtype, device);
    run_mm(qg, sg, wb->q, wb->s, group_lens, group_offs, grad_a, wb->rows, num_sms, -1, device, stream);
  }
  if (need_b) grad_b = hp_wgrad(a, grad, group_lens, group_offs, trans_b, k, num_sms, device);
  return {grad_a, grad_b};
}

// A ROWWISE weight stack w [G, N, K] (used with trans_b; N a multiple of 128) quantized for a layer's
// per-step cache from one amax pass and one quantize pass: (q [G, N, K], s [G, N]) the forward's B
// and (q_t [G, K, N], s_t [G, K]) the dgrad's, each one scale a row as the row-scaled kernel reads
// them (b_rows / d_rows 0). The values are the uncached training forward's, bit for bit.
std::tuple<Tensor, Tensor, Tensor, Tensor> grouped_weight_rows_fp8(Tensor w_in, ScalarType dtype) {
  constexpr const char* op = "grouped_weight_rows_fp8";
  if (w_in.dim() != 3) fail_with(ErrorKind::Value, op, ": expected w [G, N, K], got ", shape_string(w_in));
  if (!is_hp(w_in.scalar_type()))
    fail_with(ErrorKind::Type, op, ": w has dtype ", dtype_name(w_in.scalar_type()), "; expected bfloat16 or float16");
  if (dtype != ScalarType::Float8_e4m3fn && dtype != ScalarType::Float8_e5m2)
    fail_with(ErrorKind::Type, op, ": out_dtype is ", dtype_name(dtype), "; expected float8_e4m3fn or float8_e5m2");
  const int64_t g = w_in.sizes()[0], n = w_in.sizes()[1], k = w_in.sizes()[2];
  if (g == 0 || n == 0 || k == 0 || n % kBlock || k % 16)
    fail_with(ErrorKind::Value, op, ": w ", shape_string(w_in), " must be non-empty with N a multiple of 128 (each ",
              "expert's 128-row blocks) and K of 16 (FP8 rows are read 16 bytes at a time)");
  const int32_t device = check_cuda(op, {{"w", &w_in}});
  DeviceScope scope(device);
  void* stream = current_stream(device);
  const Tensor w = as_contiguous(w_in);
  // Both copies kept (returned), each in its own allocation: a cache may drop one before the other.
  const QuantRequest request{&w, QuantSpec{dtype, PT_QUANT_ROWWISE}, true, true};
  const auto q = quantize_fp8_jobs({request}, device, stream, op);
  const WeightOperand fwd = weight_rows(*q[0].first, g);
  const Quantized& dgrad = *q[0].second;  // [G, K, N], one scale a row of it
  return {fwd.q, fwd.s, dgrad.q, torch::stable::view(as_contiguous(dgrad.s), {g, k})};
}

// ---- MXFP4, emulated on the FP8 kernel (ops/grouped_gemm_fp4.py) --------------------------------

constexpr const char* kOpFp4 = "grouped_gemm_fp4";

// Scratch bytes of an MXFP4 operand [rows, k] (32x32 blocks with two_d) and its restatement.
size_t fp4_operand_bytes(int64_t rows, int64_t k, bool two_d) {
  return fp4_scratch_bytes(rows, k, two_d) + restated_scratch_bytes(rows, k, false);
}

// x [R, C] -> MXFP4 along C, restated: the kernel's A (E4M3 [R, C], scales [R, ceil(C/128)]). The
// FP4 copy and its restatement come from scratch (this call's launches alone read them).
Quantized fp4_tokens(const Tensor& x, int32_t flags, int64_t seed, Scratch& scratch, int32_t device, void* stream) {
  return restate(*quantize_fp4(x, true, false, flags, seed, device, stream, &scratch).first, false, device, stream,
                 &scratch);
}

// w [G, X, Y] -> the kernel's K-major B (K = Y, or X with transpose), MXFP4 per expert (X and Y are
// multiples of 32, so no block spans two experts) and restated with one scale per row and 128-block.
std::pair<Tensor, Tensor> fp4_weight(const Tensor& w, bool transpose, bool two_d, Scratch& scratch, int32_t device,
                                     void* stream) {
  const Tensor src = transpose ? transpose_last2(w, stream) : w;
  const int64_t g = src.sizes()[0], n = src.sizes()[1], k = src.sizes()[2];
  const Quantized r = restate(*quantize_fp4(torch::stable::view(src, {g * n, k}), true, false,
                                            two_d ? PT_QUANT_2D_BLOCK : 0, 0, device, stream, &scratch)
                                   .first,
                              false, device, stream, &scratch);
  return {torch::stable::view(r.q, {g, n, k}), torch::stable::view(r.s, {g, n, cdiv(k, kBlock)})};
}

Tensor grouped_gemm_fp4_fwd(Tensor a_in, Tensor b_in, Tensor group_lens, std::optional<Tensor> group_offs,
                            bool trans_b, ScalarType out_dtype, bool two_d, int64_t num_sms) {
  const auto [m, k, n] = check_hp_operands(kOpFp4, a_in, b_in, group_lens, group_offs, trans_b, out_dtype, 32,
                                           "MXFP4 blocks of 32, and 32x32 weight blocks that must not span two "
                                           "experts in either orientation");
  const int32_t device = check_devices("a", a_in, b_in, group_lens, group_offs, kOpFp4);
  DeviceScope scope(device);
  void* stream = current_stream(device);
  check_group_lens_on_host(kOpFp4, group_lens, m, stream);
  Scratch scratch(device, fp4_operand_bytes(m, k, false) + fp4_operand_bytes(b_in.sizes()[0] * n, k, two_d));
  const Quantized qa = fp4_tokens(as_contiguous(a_in), 0, 0, scratch, device, stream);
  const auto [qb, sb] = fp4_weight(as_contiguous(b_in), !trans_b, two_d, scratch, device, stream);
  Tensor out = empty({m, n}, out_dtype, device);
  run_mm(qa.q, qa.s, qb, sb, group_lens, group_offs, out, 1, num_sms, -1, device, stream);
  return out;
}

// Returns (grad_a, grad_b) or placeholders: the dgrad through the MXFP4 emulation (the gradient
// stochastically rounded with sr), the wgrad on the bf16/fp16 grouped GEMM.
std::tuple<Tensor, Tensor> grouped_gemm_fp4_bwd(Tensor grad_in, Tensor a, Tensor b_in, Tensor group_lens,
                                                std::optional<Tensor> group_offs, bool trans_b, bool two_d, bool sr,
                                                int64_t seed, int64_t num_sms, bool need_a, bool need_b) {
  const int32_t device = check_devices("grad_out", grad_in, b_in, group_lens, group_offs, kOpFp4);
  check_backward_operands(kOpFp4, grad_in, a, b_in);
  DeviceScope scope(device);
  void* stream = current_stream(device);
  const ScalarType a_dtype = a.scalar_type();
  const Tensor grad = as_contiguous(grad_in), b = as_contiguous(b_in);
  const int64_t m = grad.sizes()[0], k = trans_b ? b.sizes()[2] : b.sizes()[1];
  Tensor grad_a = placeholder(device), grad_b = placeholder(device);
  if (need_a) {
    const int64_t n = grad.sizes()[1];
    Scratch scratch(device, fp4_operand_bytes(m, n, false) + fp4_operand_bytes(b.sizes()[0] * k, n, two_d));
    const Quantized qg = fp4_tokens(grad, sr ? PT_QUANT_SR : 0, seed, scratch, device, stream);
    const auto [qd, sd] = fp4_weight(b, trans_b, two_d, scratch, device, stream);  // op(b) [G, K, N] along N
    grad_a = empty({m, k}, a_dtype, device);
    run_mm(qg.q, qg.s, qd, sd, group_lens, group_offs, grad_a, 1, num_sms, -1, device, stream);
  }
  if (need_b) grad_b = hp_wgrad(a, grad, group_lens, group_offs, trans_b, k, num_sms, device);
  return {grad_a, grad_b};
}

// Every tensor of a kernel-only call on one CUDA device (the C API's descriptors carry no device).
int32_t check_mm_devices(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                         const Tensor& lens, const std::optional<Tensor>& offs) {
  NamedTensors all{{"a", &a}, {"a_scale", &a_scale}, {"b", &b}, {"b_scale", &b_scale}, {"group_lens", &lens}};
  add_present(all, "group_offs", offs);
  return check_cuda(kOp, all);
}

Tensor grouped_gemm_fp8_mm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor group_lens,
                           std::optional<Tensor> group_offs, int64_t b_scale_rows, ScalarType out_dtype,
                           int64_t num_sms) {
  const int32_t device = check_mm_devices(a, a_scale, b, b_scale, group_lens, group_offs);
  if (a.dim() != 2 || b.dim() != 3)
    fail_with(ErrorKind::Value, kOp, ": 'a' must be 2-D and 'b' 3-D, got ", shape_string(a), " and ", shape_string(b));
  Tensor out = empty({a.sizes()[0], b.sizes()[1]}, out_dtype, device);
  DeviceScope scope(device);
  run_mm(a, a_scale, b, b_scale, group_lens, group_offs, out, b_scale_rows, num_sms, -1, device,
         current_stream(device));
  return out;
}

Tensor grouped_gemm_fp8_wgrad_mm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor group_lens,
                                 std::optional<Tensor> group_offs, int64_t tokens, ScalarType out_dtype,
                                 int64_t num_sms) {
  const int32_t device = check_mm_devices(a, a_scale, b, b_scale, group_lens, group_offs);
  if (a.dim() != 2 || b.dim() != 2 || group_lens.dim() != 1)
    fail_with(ErrorKind::Value, kOp, ": wgrad operands must be 2-D and group_lens 1-D, got ", shape_string(a), ", ",
              shape_string(b), " and ", shape_string(group_lens));
  if (tokens < 0) fail_with(ErrorKind::Value, kOp, ": tokens must be >= 0, got ", tokens);
  Tensor out = empty({group_lens.sizes()[0], a.sizes()[0], b.sizes()[0]}, out_dtype, device);
  DeviceScope scope(device);
  run_mm(a, a_scale, b, b_scale, group_lens, group_offs, out, 1, num_sms, tokens, device, current_stream(device));
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("grouped_gemm_fp8_fwd(Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs, bool trans_b, "
        "ScalarType out_dtype, ScalarType fwd_dtype, int granularity, int num_sms, bool for_backward, "
        "Tensor? b_q=None, Tensor? b_s=None, int b_rows=0, bool fast_accum=False) -> (Tensor, Tensor, Tensor)");
  m.def("grouped_gemm_fp8_bwd(Tensor grad_out, Tensor a, Tensor b, Tensor wq, Tensor ws, Tensor group_lens, "
        "Tensor? group_offs, bool trans_b, ScalarType grad_dtype, ScalarType fwd_dtype, int granularity, int num_sms, "
        "bool need_a, bool need_b, Tensor? d_q=None, Tensor? d_s=None, int d_rows=0) -> (Tensor, Tensor)");
  m.def("grouped_gemm_fp4_fwd(Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs, bool trans_b, "
        "ScalarType out_dtype, bool two_d, int num_sms) -> Tensor");
  m.def("grouped_gemm_fp4_bwd(Tensor grad_out, Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs, "
        "bool trans_b, bool two_d, bool sr, int seed, int num_sms, bool need_a, bool need_b) -> (Tensor, Tensor)");
  m.def("grouped_gemm_fp8_mm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor group_lens, "
        "Tensor? group_offs, int b_scale_rows, ScalarType out_dtype, int num_sms) -> Tensor");
  m.def("grouped_gemm_fp8_wgrad_mm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor group_lens, "
        "Tensor? group_offs, int tokens, ScalarType out_dtype, int num_sms) -> Tensor");
  m.def("grouped_weight_rows_fp8(Tensor w, ScalarType out_dtype) -> (Tensor, Tensor, Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("grouped_gemm_fp8_fwd", TORCH_BOX(&grouped_gemm_fp8_fwd));
  m.impl("grouped_gemm_fp8_bwd", TORCH_BOX(&grouped_gemm_fp8_bwd));
  m.impl("grouped_gemm_fp4_fwd", TORCH_BOX(&grouped_gemm_fp4_fwd));
  m.impl("grouped_gemm_fp4_bwd", TORCH_BOX(&grouped_gemm_fp4_bwd));
  m.impl("grouped_gemm_fp8_mm", TORCH_BOX(&grouped_gemm_fp8_mm));
  m.impl("grouped_gemm_fp8_wgrad_mm", TORCH_BOX(&grouped_gemm_fp8_wgrad_mm));
  m.impl("grouped_weight_rows_fp8", TORCH_BOX(&grouped_weight_rows_fp8));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
