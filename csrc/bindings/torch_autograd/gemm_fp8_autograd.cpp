// gemm_fp8's training op with its autograd in C++: primus_turbo::gemm_fp8_train(a, b, ...) -> out
// runs the native forward (gemm_fp8_fwd: both operands quantized, the GEMM, the copies the backward
// reads) and saves those copies; its backward is one gemm_fp8_bwd call. The Python
// NativeGemmFp8Function does the same where this library is not loaded.
#include "autograd_common.h"

#include <tuple>

namespace {

using namespace primus_turbo::torch_autograd;

using FwdSig = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, bool, bool,
                                                                  c10::ScalarType, c10::ScalarType, int64_t, bool);
using BwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          bool, bool, c10::ScalarType, int64_t, c10::ScalarType, c10::ScalarType, bool,
                                          bool, const std::optional<Tensor>&);
using InferSig = Tensor(const Tensor&, const Tensor&, bool, bool, c10::ScalarType, c10::ScalarType, int64_t);

struct GemmFp8Function : public torch::autograd::Function<GemmFp8Function> {
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b, bool ta, bool tb,
                        c10::ScalarType out_dtype, c10::ScalarType fwd_dtype, c10::ScalarType grad_dtype,
                        int64_t granularity) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto fwd = op<FwdSig>("primus_turbo::gemm_fp8_fwd");
    auto [out, a_bwd, sa_bwd, b_bwd, sb_bwd] = fwd.call(a, b, ta, tb, out_dtype, fwd_dtype, granularity, true);
    ctx->save_for_backward({a_bwd, sa_bwd, b_bwd, sb_bwd});
    // Flags and dtypes in one word: trans_a, trans_b; the gradient's FP8 dtype and a's, b's dtypes.
    ctx->saved_data["t"] = static_cast<int64_t>(ta) | (static_cast<int64_t>(tb) << 1);
    ctx->saved_data["g"] = granularity;
    ctx->saved_data["d"] = static_cast<int64_t>(grad_dtype) | (static_cast<int64_t>(a.scalar_type()) << 8) |
                           (static_cast<int64_t>(b.scalar_type()) << 16);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = op<BwdSig>("primus_turbo::gemm_fp8_bwd");
    const variable_list s = ctx->get_saved_variables();
    const int64_t t = ctx->saved_data["t"].toInt(), d = ctx->saved_data["d"].toInt();
    const auto dtype = [&](int shift) { return static_cast<c10::ScalarType>((d >> shift) & 0xff); };
    const bool need_a = ctx->needs_input_grad(0), need_b = ctx->needs_input_grad(1);
    auto [grad_a, grad_b] = bwd.call(grads[0], s[0], s[1], s[2], s[3], t & 1, t & 2, dtype(0),
                                     ctx->saved_data["g"].toInt(), dtype(8), dtype(16), need_a, need_b, std::nullopt);
    return {need_a ? grad_a : Tensor(), need_b ? grad_b : Tensor(), Tensor(), Tensor(), Tensor(), Tensor(),
            Tensor(), Tensor()};
  }
};

Tensor gemm_fp8_train_autograd(const Tensor& a, const Tensor& b, bool ta, bool tb, c10::ScalarType out_dtype,
                               c10::ScalarType fwd_dtype, c10::ScalarType grad_dtype, int64_t granularity) {
  return GemmFp8Function::apply(a, b, ta, tb, out_dtype, fwd_dtype, grad_dtype, granularity);
}

// Below autograd (no gradient will be asked for): the inference op.
Tensor gemm_fp8_train_forward_only(const Tensor& a, const Tensor& b, bool ta, bool tb, c10::ScalarType out_dtype,
                                   c10::ScalarType fwd_dtype, c10::ScalarType, int64_t granularity) {
  static const auto infer = op<InferSig>("primus_turbo::gemm_fp8");
  return infer.call(a, b, ta, tb, out_dtype, fwd_dtype, granularity);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("gemm_fp8_train(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype, ScalarType fwd_dtype, "
        "ScalarType grad_dtype, int granularity) -> Tensor");
}

TORCH_LIBRARY_IMPL(primus_turbo, Autograd, m) { m.impl("gemm_fp8_train", gemm_fp8_train_autograd); }
TORCH_LIBRARY_IMPL(primus_turbo, CUDA, m) { m.impl("gemm_fp8_train", gemm_fp8_train_forward_only); }
