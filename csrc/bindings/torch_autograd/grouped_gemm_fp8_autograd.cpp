// grouped_gemm_fp8's training op with its autograd in C++: primus_turbo::grouped_gemm_fp8_train
// runs the native forward (grouped_gemm_fp8_fwd: tokens and expert weights quantized, the grouped
// GEMM, the quantized weight the dgrad reads) and saves what the backward needs; the backward is
// one grouped_gemm_fp8_bwd call (FP8 dgrad, bf16/fp16 wgrad). The Python
// NativeGroupedGemmFp8Function does the same where this library is not loaded, and takes the FP8
// wgrad (PRIMUS_TURBO_GROUPED_GEMM_FP8_WGRAD=1), which this op does not. fast_accum: the forward's
// fast accumulation (ROWWISE, the row-scaled kernel); the dgrad always promotes.
#include "autograd_common.h"

#include <tuple>

namespace {

using namespace primus_turbo::torch_autograd;

using FwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, bool,
                                                  c10::ScalarType, c10::ScalarType, int64_t, int64_t, bool,
                                                  const OptTensor&, const OptTensor&, int64_t, bool);
using BwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&, const OptTensor&, bool, c10::ScalarType, c10::ScalarType,
                                          int64_t, int64_t, bool, bool, const OptTensor&, const OptTensor&, int64_t);

// b_q / b_s / b_rows and d_q / d_s / d_rows: the weight's forward and dgrad operands already in the
// kernel's layout (a per-step cache), passed through to the native ops; b still receives the wgrad.
struct GroupedGemmFp8Function : public torch::autograd::Function<GroupedGemmFp8Function> {
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b, const Tensor& group_lens,
                        const OptTensor& group_offs, bool trans_b, c10::ScalarType out_dtype,
                        c10::ScalarType fwd_dtype, c10::ScalarType grad_dtype, int64_t granularity, int64_t num_sms,
                        const OptTensor& b_q, const OptTensor& b_s, int64_t b_rows, const OptTensor& d_q,
                        const OptTensor& d_s, int64_t d_rows, bool fast_accum) {
    // The quantized weight is kept only where a dgrad will read it (and was not given).
    const bool dgrad = a.requires_grad();
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<FwdSig>("primus_turbo::grouped_gemm_fp8_fwd");
    auto [out, wq, ws] = fwd.call(a, b, group_lens, group_offs, trans_b, out_dtype, fwd_dtype, granularity, num_sms,
                                  dgrad && !d_q, b_q, b_s, b_rows, fast_accum);
    ctx->save_for_backward({a, b, group_lens, group_offs.value_or(Tensor()), wq, ws, d_q.value_or(Tensor()),
                            d_s.value_or(Tensor())});
    ctx->saved_data["t"] = trans_b;
    ctx->saved_data["g"] = granularity;
    ctx->saved_data["n"] = num_sms;
    ctx->saved_data["r"] = d_rows;
    ctx->saved_data["d"] = static_cast<int64_t>(fwd_dtype) | (static_cast<int64_t>(grad_dtype) << 8);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = op<BwdSig>("primus_turbo::grouped_gemm_fp8_bwd");
    const variable_list s = ctx->get_saved_variables();
    const OptTensor offs = s[3].defined() ? OptTensor(s[3]) : std::nullopt;
    const OptTensor d_q = s[6].defined() ? OptTensor(s[6]) : std::nullopt;
    const OptTensor d_s = s[7].defined() ? OptTensor(s[7]) : std::nullopt;
    const int64_t d = ctx->saved_data["d"].toInt();
    const bool need_a = ctx->needs_input_grad(0), need_b = ctx->needs_input_grad(1);
    auto [grad_a, grad_b] = bwd.call(grads[0], s[0], s[1], s[4], s[5], s[2], offs, ctx->saved_data["t"].toBool(),
                                     static_cast<c10::ScalarType>((d >> 8) & 0xff),
                                     static_cast<c10::ScalarType>(d & 0xff), ctx->saved_data["g"].toInt(),
                                     ctx->saved_data["n"].toInt(), need_a, need_b, d_q, d_s,
                                     ctx->saved_data["r"].toInt());
    variable_list out(17);
    out[0] = need_a ? grad_a : Tensor();
    out[1] = need_b ? grad_b : Tensor();
    return out;
  }
};

Tensor grouped_gemm_fp8_train_autograd(const Tensor& a, const Tensor& b, const Tensor& group_lens,
                                       const OptTensor& group_offs, bool trans_b, c10::ScalarType out_dtype,
                                       c10::ScalarType fwd_dtype, c10::ScalarType grad_dtype, int64_t granularity,
                                       int64_t num_sms, const OptTensor& b_q, const OptTensor& b_s, int64_t b_rows,
                                       const OptTensor& d_q, const OptTensor& d_s, int64_t d_rows, bool fast_accum) {
  return GroupedGemmFp8Function::apply(a, b, group_lens, group_offs, trans_b, out_dtype, fwd_dtype, grad_dtype,
                                       granularity, num_sms, b_q, b_s, b_rows, d_q, d_s, d_rows, fast_accum);
}

// Below autograd (no gradient will be asked for): the forward alone, nothing kept for a backward.
Tensor grouped_gemm_fp8_train_forward_only(const Tensor& a, const Tensor& b, const Tensor& group_lens,
                                           const OptTensor& group_offs, bool trans_b, c10::ScalarType out_dtype,
                                           c10::ScalarType fwd_dtype, c10::ScalarType, int64_t granularity,
                                           int64_t num_sms, const OptTensor& b_q, const OptTensor& b_s, int64_t b_rows,
                                           const OptTensor&, const OptTensor&, int64_t, bool fast_accum) {
  static const auto fwd = op<FwdSig>("primus_turbo::grouped_gemm_fp8_fwd");
  return std::get<0>(fwd.call(a, b, group_lens, group_offs, trans_b, out_dtype, fwd_dtype, granularity, num_sms,
                              false, b_q, b_s, b_rows, fast_accum));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("grouped_gemm_fp8_train(Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs, bool trans_b, "
        "ScalarType out_dtype, ScalarType fwd_dtype, ScalarType grad_dtype, int granularity, int num_sms, "
        "Tensor? b_q=None, Tensor? b_s=None, int b_rows=0, Tensor? d_q=None, Tensor? d_s=None, int d_rows=0, "
        "bool fast_accum=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(primus_turbo, Autograd, m) { m.impl("grouped_gemm_fp8_train", grouped_gemm_fp8_train_autograd); }
TORCH_LIBRARY_IMPL(primus_turbo, CUDA, m) { m.impl("grouped_gemm_fp8_train", grouped_gemm_fp8_train_forward_only); }
