// gemm_fp8's training op with its autograd in C++: primus_turbo::gemm_fp8_train(a, b, ...) -> out
// runs the native forward (gemm_fp8_fwd: both operands quantized, the GEMM, the copies the backward
// reads) and saves those copies; its backward is one gemm_fp8_bwd call. The Python
// NativeGemmFp8Function does the same where this library is not loaded. Given b_q / b_s (the
// weight's FP8 copy along K and its pt_fp8_scaling code: a layer's per-step cache) the forward
// quantizes a alone (gemm_fp8_fwd_qb) and the dgrad reads d_q / d_s (the copy along N); b still
// receives the wgrad. fast_accum: the forward product may accumulate in the fast mode (the
// config's fast_accum); the backward's GEMMs always promote.
#include "autograd_common.h"

#include <tuple>

namespace {

using namespace primus_turbo::torch_autograd;

using FwdSig = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, bool, bool,
                                                                  c10::ScalarType, c10::ScalarType, int64_t, bool,
                                                                  bool);
using BwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          bool, bool, c10::ScalarType, int64_t, c10::ScalarType, c10::ScalarType, bool,
                                          bool, const std::optional<Tensor>&);
using InferSig = Tensor(const Tensor&, const Tensor&, bool, bool, c10::ScalarType, c10::ScalarType, int64_t, bool);
using FwdQbSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, int64_t, bool,
                                                    c10::ScalarType, c10::ScalarType, int64_t, bool, bool);

struct GemmFp8Function : public torch::autograd::Function<GemmFp8Function> {
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b, bool ta, bool tb,
                        c10::ScalarType out_dtype, c10::ScalarType fwd_dtype, c10::ScalarType grad_dtype,
                        int64_t granularity, const OptTensor& b_q, const OptTensor& b_s, int64_t b_scaling,
                        const OptTensor& d_q, const OptTensor& d_s, bool fast_accum) {
    at::AutoDispatchBelowADInplaceOrView guard;
    if (b_q) {
      static const auto fwd_qb = op<FwdQbSig>("primus_turbo::gemm_fp8_fwd_qb");
      auto [out, a_bwd, sa_bwd] = fwd_qb.call(a, *b_q, b_s.value_or(Tensor()), b_scaling, ta, out_dtype, fwd_dtype,
                                              granularity, true, fast_accum);
      // Without a dgrad copy (a needs no gradient) the backward is asked for the wgrad alone.
      ctx->save_for_backward({a_bwd, sa_bwd, d_q.value_or(a_bwd.new_empty({0})), d_s.value_or(a_bwd.new_empty({0}))});
      save_flags(ctx, a, b, ta, tb, grad_dtype, granularity);
      return out;
    }
    static const auto fwd = op<FwdSig>("primus_turbo::gemm_fp8_fwd");
    auto [out, a_bwd, sa_bwd, b_bwd, sb_bwd] = fwd.call(a, b, ta, tb, out_dtype, fwd_dtype, granularity, true, fast_accum);
    ctx->save_for_backward({a_bwd, sa_bwd, b_bwd, sb_bwd});
    save_flags(ctx, a, b, ta, tb, grad_dtype, granularity);
    return out;
  }

  // The given copies as far as the forward's op does not check them: pairs complete, and the dgrad's
  // copy d_q [K, N] (b_q [N, K] transposed, contiguous, b_q's dtype) with scales of its scaling
  // (b_scaling: one value, one per row of d_q, or [ceil(K/128), ceil(N/128)] blocks, the last dim
  // possibly padded to 4), present whenever a gradient of a will be asked for.
  static void check_given(const Tensor& a, const OptTensor& b_q, const OptTensor& b_s, int64_t b_scaling,
                          const OptTensor& d_q, const OptTensor& d_s) {
    TORCH_CHECK_VALUE(b_q.has_value() == b_s.has_value() && d_q.has_value() == d_s.has_value(),
                      "gemm_fp8: the given weight copies come with their scales (b_q with b_s, d_q with d_s)");
    TORCH_CHECK_VALUE(b_q.has_value() || !d_q.has_value(), "gemm_fp8: d_q is given without b_q");
    if (!b_q) return;
    TORCH_CHECK_VALUE(d_q || !(a.requires_grad() && at::GradMode::is_enabled()), "gemm_fp8: 'a' needs a gradient, so the dgrad's weight copy d_q "
                      "(b_q's copy along N) must be given with b_q");
    if (!d_q) return;
    TORCH_CHECK_VALUE(b_q->dim() == 2, "gemm_fp8: argument 'b_q' must be 2-D [N, K], got ", b_q->sizes());
    const int64_t n = b_q->size(0), k = b_q->size(1);
    TORCH_CHECK_VALUE(d_q->dim() == 2 && d_q->size(0) == k && d_q->size(1) == n && d_q->is_contiguous() &&
                          d_q->scalar_type() == b_q->scalar_type(),
                      "gemm_fp8: argument 'd_q' must be b_q's copy along N: contiguous [", k, ", ", n, "] of ",
                      b_q->scalar_type(), ", got ", d_q->sizes(), " ", d_q->scalar_type());
    const int64_t kb = (k + 127) / 128, nb = (n + 127) / 128;
    const bool ok = d_s->scalar_type() == at::kFloat && d_s->is_contiguous() &&
                    (b_scaling == 0   ? d_s->numel() == 1
                     : b_scaling == 1 ? d_s->numel() == k
                                      : d_s->dim() == 2 && d_s->size(0) == kb &&
                                            (d_s->size(1) == nb || d_s->size(1) == (nb + 3) / 4 * 4));
    TORCH_CHECK_VALUE(ok, "gemm_fp8: argument 'd_s' ", d_s->sizes(), " (", d_s->scalar_type(),
                      ") does not fit d_q [", k, ", ", n, "] with scaling code ", b_scaling);
  }

  // Flags and dtypes in one word: trans_a, trans_b; the gradient's FP8 dtype and a's, b's dtypes.
  static void save_flags(AutogradContext* ctx, const Tensor& a, const Tensor& b, bool ta, bool tb,
                         c10::ScalarType grad_dtype, int64_t granularity) {
    ctx->saved_data["t"] = static_cast<int64_t>(ta) | (static_cast<int64_t>(tb) << 1);
    ctx->saved_data["g"] = granularity;
    ctx->saved_data["d"] = static_cast<int64_t>(grad_dtype) | (static_cast<int64_t>(a.scalar_type()) << 8) |
                           (static_cast<int64_t>(b.scalar_type()) << 16);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = op<BwdSig>("primus_turbo::gemm_fp8_bwd");
    const variable_list s = ctx->get_saved_variables();
    const int64_t t = ctx->saved_data["t"].toInt(), d = ctx->saved_data["d"].toInt();
    const auto dtype = [&](int shift) { return static_cast<c10::ScalarType>((d >> shift) & 0xff); };
    const bool need_a = ctx->needs_input_grad(0), need_b = ctx->needs_input_grad(1);
    auto [grad_a, grad_b] = bwd.call(grads[0], s[0], s[1], s[2], s[3], t & 1, t & 2, dtype(0),
                                     ctx->saved_data["g"].toInt(), dtype(8), dtype(16), need_a, need_b, std::nullopt);
    variable_list out(14);
    out[0] = need_a ? grad_a : Tensor();
    out[1] = need_b ? grad_b : Tensor();
    return out;
  }
};

Tensor gemm_fp8_train_autograd(const Tensor& a, const Tensor& b, bool ta, bool tb, c10::ScalarType out_dtype,
                               c10::ScalarType fwd_dtype, c10::ScalarType grad_dtype, int64_t granularity,
                               const OptTensor& b_q, const OptTensor& b_s, int64_t b_scaling, const OptTensor& d_q,
                               const OptTensor& d_s, bool fast_accum) {
  // Before apply: its forward runs with grad mode off, so whether a gradient will be asked for is
  // known only here.
  GemmFp8Function::check_given(a, b_q, b_s, b_scaling, d_q, d_s);
  return GemmFp8Function::apply(a, b, ta, tb, out_dtype, fwd_dtype, grad_dtype, granularity, b_q, b_s, b_scaling, d_q,
                                d_s, fast_accum);
}

// Below autograd (no gradient will be asked for): the inference op, or the forward reading b_q.
Tensor gemm_fp8_train_forward_only(const Tensor& a, const Tensor& b, bool ta, bool tb, c10::ScalarType out_dtype,
                                   c10::ScalarType fwd_dtype, c10::ScalarType, int64_t granularity,
                                   const OptTensor& b_q, const OptTensor& b_s, int64_t b_scaling, const OptTensor&,
                                   const OptTensor&, bool fast_accum) {
  GemmFp8Function::check_given(a, b_q, b_s, b_scaling, std::nullopt, std::nullopt);
  if (b_q) {
    static const auto fwd_qb = op<FwdQbSig>("primus_turbo::gemm_fp8_fwd_qb");
    return std::get<0>(
        fwd_qb.call(a, *b_q, b_s.value_or(Tensor()), b_scaling, ta, out_dtype, fwd_dtype, granularity, false,
                    fast_accum));
  }
  static const auto infer = op<InferSig>("primus_turbo::gemm_fp8");
  return infer.call(a, b, ta, tb, out_dtype, fwd_dtype, granularity, fast_accum);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("gemm_fp8_train(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype, ScalarType fwd_dtype, "
        "ScalarType grad_dtype, int granularity, Tensor? b_q=None, Tensor? b_s=None, int b_scaling=0, "
        "Tensor? d_q=None, Tensor? d_s=None, bool fast_accum=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(primus_turbo, Autograd, m) { m.impl("gemm_fp8_train", gemm_fp8_train_autograd); }
TORCH_LIBRARY_IMPL(primus_turbo, CUDA, m) { m.impl("gemm_fp8_train", gemm_fp8_train_forward_only); }
