// primus_turbo::gemm_fp4_fwd / gemm_fp4_bwd: the MXFP4 training GEMM (E2M1 + E8M0 per 32, the
// recipe of ops/gemm_fp4.py: 32x32 weight blocks, Hadamard-transformed wgrad operands, stochastic
// rounding of the gradient) emulated on Hopper's FP8 tensor cores, one native call per direction:
// quantize to FP4, restate each FP4 operand as E4M3 with one power-of-two scale per 1x128 K block
// (pt_mx_to_blocks_mn_major, written in the layout the GEMM reads), run the planned 1x128 FP8 GEMM.
// With op(a) [M, K], op(b) [K, N]:
//   forward  out     = op(a)   along K, 1-D         x op(b)^T along K, 32x32 blocks
//   dgrad    d op(a) = grad    along N, SR          x op(b)   along N, the same 32x32 blocks
//   wgrad    d op(b) = op(a)^T along M, RHT         x grad^T  along M, RHT + SR
// The forward keeps the backward's copies in FP4 (packed, E8M0 scales as uint8).
#include <optional>
#include <tuple>
#include <utility>

#include "bindings/torch/fp4_quantize.h"
#include "bindings/torch/gemm_fp8_run.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr const char* kOp = "gemm_fp4";

// out = x @ y^T for K-major FP4 operands; their E4M3 restatements come from scratch.
void fp4_mm(const Fp4& x, const Fp4& y, const Tensor& out, Scratch& scratch, int32_t device, void* stream) {
  if (out.numel() == 0) return;
  fp8_mm(restate(x, true, device, stream, &scratch), restate(y, true, device, stream, &scratch), out, 0.0f, device,
         stream);
}

// Scratch bytes of fp4_mm's restatements: x [rx, k] and y [ry, k].
size_t fp4_mm_scratch_bytes(int64_t rx, int64_t ry, int64_t k) {
  return restated_scratch_bytes(rx, k, true) + restated_scratch_bytes(ry, k, true);
}

// x @ y^T [rows of x, rows of y] in a new tensor, or with swap its transpose, y @ x^T.
Tensor fp4_product(const Fp4& x, const Fp4& y, bool swap, ScalarType dtype, Scratch& scratch, int32_t device,
                   void* stream) {
  const int64_t rx = x.q.sizes()[0], ry = y.q.sizes()[0];
  Tensor out = swap ? empty({ry, rx}, dtype, device) : empty({rx, ry}, dtype, device);
  if (swap)
    fp4_mm(y, x, out, scratch, device, stream);
  else
    fp4_mm(x, y, out, scratch, device, stream);
  return out;
}

int32_t recipe_flags(bool two_d, bool rht, bool sr) {
  return (two_d ? PT_QUANT_2D_BLOCK : 0) | (rht ? PT_QUANT_RHT : 0) | (sr ? PT_QUANT_SR : 0);
}

// Returns (out, b along N (q, s), op(a)^T along M (q, s)): the backward's FP4 copies, placeholders
// for a gradient not asked for.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> gemm_fp4_fwd(Tensor a_in, Tensor b_in, bool trans_a, bool trans_b,
                                                                ScalarType out_dtype, bool two_d, bool rht,
                                                                bool need_a, bool need_b) {
  const auto [m, k, n] = check_dense_operands(
      kOp, a_in, b_in, trans_a, trans_b, out_dtype, need_a || need_b, "expanded FP8 rows are read 16 bytes at a time",
      "its transposed operands have rows of length M and N; the Hadamard transform works on groups of 16 along M");
  const int32_t device = check_cuda(kOp, {{"a", &a_in}, {"b", &b_in}});
  if (m == 0 || n == 0 || k == 0)
    fail_with(ErrorKind::Value, kOp, ": empty problems take the composite path");  // the Python layer's job
  DeviceScope scope(device);
  void* stream = current_stream(device);
  const Tensor a = as_contiguous(a_in), b = as_contiguous(b_in);
  // The forward's copies along K and their restatements are read by this call alone: one scratch.
  Scratch scratch(device, fp4_scratch_bytes(m, k, false) + fp4_scratch_bytes(n, k, two_d) +
                              fp4_mm_scratch_bytes(m, n, k));
  // a: op(a) along K is a's row output (its col output with trans_a); the wgrad's op(a)^T along M
  // is the other one, Hadamard-transformed when the recipe says so (then a call of its own).
  const bool a_both = need_b && !rht;  // the wgrad copy without a transform: one pass writes both
  auto [a_row, a_col] = quantize_fp4(a, !trans_a || a_both, trans_a || a_both, 0, 0, device, stream,
                                     trans_a ? nullptr : &scratch, trans_a ? &scratch : nullptr);
  const Fp4& a_fwd = trans_a ? *a_col : *a_row;
  // b: 32x32 blocks serve both orientations (one call writes both copies).
  auto [b_row, b_col] = quantize_fp4(b, trans_b || need_a, !trans_b || need_a, recipe_flags(two_d, false, false),
                                     0, device, stream, trans_b ? &scratch : nullptr, trans_b ? nullptr : &scratch);
  const Fp4& b_fwd = trans_b ? *b_row : *b_col;
  Tensor out = empty({m, n}, out_dtype, device);
  fp4_mm(a_fwd, b_fwd, out, scratch, device, stream);
  Tensor qbn = placeholder(device), sbn = placeholder(device), qam = placeholder(device), sam = placeholder(device);
  if (need_a) {
    const Fp4& bn = trans_b ? *b_col : *b_row;  // op(b) [K, N] along N
    qbn = bn.q;
    sbn = bn.s;
  }
  if (need_b) {
    std::optional<Fp4> am;
    if (!a_both) {
      auto [r, c] = quantize_fp4(a, trans_a, !trans_a, recipe_flags(false, true, false), 0, device, stream);
      am = trans_a ? r : c;
    } else {
      am = trans_a ? a_row : a_col;
    }
    qam = am->q;
    sam = am->s;
  }
  return {out, qbn, sbn, qam, sam};
}

// Returns (grad_a, grad_b) or placeholders. seeds: the gradient's stochastic rounding for the dgrad
// and the wgrad copies.
std::tuple<Tensor, Tensor> gemm_fp4_bwd(Tensor grad_in, Tensor qbn, Tensor sbn, Tensor qam, Tensor sam, bool trans_a,
                                        bool trans_b, bool rht, bool sr, int64_t seed_dgrad, int64_t seed_wgrad,
                                        ScalarType a_dtype, ScalarType b_dtype, bool need_a, bool need_b) {
  const int32_t device = check_cuda(kOp, {{"grad_out", &grad_in}});
  DeviceScope scope(device);
  void* stream = current_stream(device);
  const Tensor grad = as_contiguous(grad_in);  // [M, N]
  const int64_t m = grad.sizes()[0], n = grad.sizes()[1];
  const int64_t k = need_a ? qbn.sizes()[0] : need_b ? qam.sizes()[0] : 0;
  // The gradient's copies and every restatement are read by this call alone: one scratch.
  Scratch scratch(device, (need_a ? fp4_scratch_bytes(m, n, false) + fp4_mm_scratch_bytes(m, k, n) : 0) +
                              (need_b ? fp4_scratch_bytes(n, m, false) + fp4_mm_scratch_bytes(k, n, m) : 0));
  Tensor grad_a = placeholder(device), grad_b = placeholder(device);
  if (need_a) {
    // d op(a) [M, K] = grad [M, N] x op(b) [K, N]^T, both along N; with trans_a, d a [K, M].
    const Fp4 g = *quantize_fp4(grad, true, false, recipe_flags(false, false, sr), seed_dgrad, device, stream,
                                &scratch)
                       .first;
    grad_a = fp4_product(g, Fp4{qbn, sbn}, trans_a, a_dtype, scratch, device, stream);
  }
  if (need_b) {
    // d op(b) [K, N] = op(a)^T [K, M] x grad^T [N, M]^T, both along M; with trans_b, d b [N, K].
    const Fp4 gm = *quantize_fp4(grad, false, true, recipe_flags(false, rht, sr), seed_wgrad, device, stream,
                                 nullptr, &scratch)
                        .second;
    grad_b = fp4_product(Fp4{qam, sam}, gm, trans_b, b_dtype, scratch, device, stream);
  }
  return {grad_a, grad_b};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("gemm_fp4_fwd(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype, bool two_d, bool rht, "
        "bool need_a, bool need_b) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("gemm_fp4_bwd(Tensor grad_out, Tensor qbn, Tensor sbn, Tensor qam, Tensor sam, bool trans_a, bool trans_b, "
        "bool rht, bool sr, int seed_dgrad, int seed_wgrad, ScalarType a_dtype, ScalarType b_dtype, bool need_a, "
        "bool need_b) -> (Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("gemm_fp4_fwd", TORCH_BOX(&gemm_fp4_fwd));
  m.impl("gemm_fp4_bwd", TORCH_BOX(&gemm_fp4_bwd));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
