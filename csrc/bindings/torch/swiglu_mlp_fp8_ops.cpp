// primus_turbo::swiglu_mlp_fp8 (no backward) / swiglu_mlp_fp8_fwd / swiglu_mlp_fp8_bwd: a SwiGLU
// MLP (x [M, H] -> gate/up projection [M, 2I] -> SwiGLU [M, I] -> down projection [M, H]) with both
// projections in TENSORWISE FP8, one native call per direction. The SwiGLU kernels report the amax of what they
// write, and the quantization after them takes it instead of running an amax pass: in the forward
// the down projection's input, in the backward the gradient the gate/up projection quantizes. The
// values are those of the unfused chain (gemm_fp8, swiglu, gemm_fp8), bit for bit. fast_accum: the two
// forward products may accumulate in the fast mode (the config's fast_accum).
#include <optional>
#include <tuple>

#include "bindings/torch/activation_run.h"
#include "bindings/torch/gemm_fp8_run.h"
#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr const char* kOp = "swiglu_mlp_fp8";
constexpr int64_t kSilu = 0;  // the gated activation's act code (activation.h)

// x [M, H], w_gate_up [2I, H], w_down [H, I], one float dtype, one CUDA device. The GEMMs' own checks
// follow (16-element multiples); these name the MLP's arguments.
void check_mlp(const Tensor& x, const Tensor& w_gate_up, const Tensor& w_down) {
  if (x.dim() != 2 || w_gate_up.dim() != 2 || w_down.dim() != 2)
    fail_with(ErrorKind::Value, kOp, ": expected x [M, H], w_gate_up [2I, H] and w_down [H, I]; got x ",
              shape_string(x), ", w_gate_up ", shape_string(w_gate_up), ", w_down ", shape_string(w_down));
  const int64_t hidden = x.sizes()[1], inter2 = w_gate_up.sizes()[0];
  if (w_gate_up.sizes()[1] != hidden || inter2 % 2 || w_down.sizes()[0] != hidden || w_down.sizes()[1] != inter2 / 2)
    fail_with(ErrorKind::Value, kOp, ": expected w_gate_up [2I, H] and w_down [H, I] for x [M, H=", hidden,
              "]; got w_gate_up ", shape_string(w_gate_up), ", w_down ", shape_string(w_down));
  if (!is_float_dtype(x.scalar_type()) || w_gate_up.scalar_type() != x.scalar_type() ||
      w_down.scalar_type() != x.scalar_type())
    fail_with(ErrorKind::Type, kOp, ": x, w_gate_up and w_down must share a float16, bfloat16 or float32 dtype; got ",
              dtype_name(x.scalar_type()), ", ", dtype_name(w_gate_up.scalar_type()), ", ",
              dtype_name(w_down.scalar_type()));
  check_cuda(kOp, {{"x", &x}, {"w_gate_up", &w_gate_up}, {"w_down", &w_down}});
}

// The training forward: (y, h, x_bwd, sx_bwd, wgu_bwd, swgu_bwd, a_bwd, sa_bwd, wd_bwd, swd_bwd), the
// output, the gate/up projection's output h (SwiGLU's backward reads it) and each GEMM's backward
// copies.
using MlpForward = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

MlpForward swiglu_mlp_fp8_fwd(Tensor x, Tensor w_gate_up, Tensor w_down, ScalarType fwd_dtype, bool fast_accum) {
  check_mlp(x, w_gate_up, w_down);
  const ScalarType dtype = x.scalar_type();
  auto [h, x_bwd, sx_bwd, wgu_bwd, swgu_bwd] =
      gemm_fp8_training_forward(x, w_gate_up, false, true, dtype, fwd_dtype, PT_QUANT_TENSORWISE, true, nullptr, fast_accum);
  std::optional<Tensor> a_amax;
  const Tensor a = gated_act_forward(h, std::nullopt, std::nullopt, kSilu, &a_amax);
  auto [y, a_bwd, sa_bwd, wd_bwd, swd_bwd] =
      gemm_fp8_training_forward(a, w_down, false, true, dtype, fwd_dtype, PT_QUANT_TENSORWISE, true, &*a_amax, fast_accum);
  return {y, h, x_bwd, sx_bwd, wgu_bwd, swgu_bwd, a_bwd, sa_bwd, wd_bwd, swd_bwd};
}

// The training forward with both weights given as their TENSORWISE FP8 copies along H and I (a
// layer's per-step cache: wgu_q [2I, H], wd_q [H, I], scales float32 [1]): only x and the SwiGLU output
// are quantized. (y, h, x_bwd, sx_bwd, a_bwd, sa_bwd); the backward is swiglu_mlp_fp8_bwd with the
// weights' copies along 2I and H, which the caller holds.
using MlpForwardQw = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

MlpForwardQw swiglu_mlp_fp8_fwd_qw(Tensor x, Tensor wgu_q, Tensor wgu_s, Tensor wd_q, Tensor wd_s,
                                   ScalarType fwd_dtype, bool fast_accum) {
  if (x.dim() != 2 || wgu_q.dim() != 2 || wd_q.dim() != 2 || wgu_q.sizes()[0] % 2 ||
      wd_q.sizes()[0] != x.sizes()[1] || wd_q.sizes()[1] != wgu_q.sizes()[0] / 2)
    fail_with(ErrorKind::Value, kOp, ": expected x [M, H], w_gate_up [2I, H] and w_down [H, I]; got x ",
              shape_string(x), ", w_gate_up ", shape_string(wgu_q), ", w_down ", shape_string(wd_q));
  const ScalarType dtype = x.scalar_type();
  const Quantized wgu{wgu_q, wgu_s, PT_FP8_SCALING_TENSOR}, wd{wd_q, wd_s, PT_FP8_SCALING_TENSOR};
  auto [h, x_bwd, sx_bwd] =
      gemm_fp8_forward_given_b(x, wgu, false, dtype, fwd_dtype, PT_QUANT_TENSORWISE, true, nullptr, fast_accum);
  std::optional<Tensor> a_amax;
  const Tensor a = gated_act_forward(h, std::nullopt, std::nullopt, kSilu, &a_amax);
  auto [y, a_bwd, sa_bwd] =
      gemm_fp8_forward_given_b(a, wd, false, dtype, fwd_dtype, PT_QUANT_TENSORWISE, true, &*a_amax, fast_accum);
  return {y, h, x_bwd, sx_bwd, a_bwd, sa_bwd};
}

// Without a backward: the output alone (no copies kept, no placeholders to allocate and box).
Tensor swiglu_mlp_fp8(Tensor x, Tensor w_gate_up, Tensor w_down, ScalarType fwd_dtype, bool fast_accum) {
  check_mlp(x, w_gate_up, w_down);
  const ScalarType dtype = x.scalar_type();
  const Tensor h = gemm_fp8_inference(x, w_gate_up, false, true, dtype, fwd_dtype, PT_QUANT_TENSORWISE, nullptr, fast_accum);
  std::optional<Tensor> a_amax;
  const Tensor a = gated_act_forward(h, std::nullopt, std::nullopt, kSilu, &a_amax);
  return gemm_fp8_inference(a, w_down, false, true, dtype, fwd_dtype, PT_QUANT_TENSORWISE, &*a_amax, fast_accum);
}

// (dx, dw_gate_up, dw_down); a gradient not asked for is a placeholder.
std::tuple<Tensor, Tensor, Tensor> swiglu_mlp_fp8_bwd(Tensor dy, Tensor h, Tensor x_bwd, Tensor sx_bwd, Tensor wgu_bwd,
                                                      Tensor swgu_bwd, Tensor a_bwd, Tensor sa_bwd, Tensor wd_bwd,
                                                      Tensor swd_bwd, ScalarType grad_dtype, bool need_x,
                                                      bool need_w_gate_up, bool need_w_down) {
  const ScalarType dtype = h.scalar_type();  // x's, and the weights' (checked in the forward)
  const bool need_da = need_x || need_w_gate_up;  // the gradient through SwiGLU, wanted only below it
  auto [da, dw_down] = gemm_fp8_backward(dy, a_bwd, sa_bwd, wd_bwd, swd_bwd, false, true, grad_dtype,
                                         PT_QUANT_TENSORWISE, dtype, dtype, need_da, need_w_down, std::nullopt, nullptr);
  if (!need_da) {
    const int32_t device = dw_down.get_device();
    return {placeholder(device), placeholder(device), dw_down};
  }
  std::optional<Tensor> dh_amax;
  const Tensor dh = std::get<0>(gated_act_backward(da, h, std::nullopt, std::nullopt, kSilu, false, &dh_amax));
  auto [dx, dw_gate_up] = gemm_fp8_backward(dh, x_bwd, sx_bwd, wgu_bwd, swgu_bwd, false, true, grad_dtype,
                                            PT_QUANT_TENSORWISE, dtype, dtype, need_x, need_w_gate_up, std::nullopt,
                                            &*dh_amax);
  return {dx, dw_gate_up, dw_down};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("swiglu_mlp_fp8(Tensor x, Tensor w_gate_up, Tensor w_down, ScalarType fwd_dtype, bool fast_accum=False) -> "
        "Tensor");
  m.def("swiglu_mlp_fp8_fwd(Tensor x, Tensor w_gate_up, Tensor w_down, ScalarType fwd_dtype, bool fast_accum=False) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("swiglu_mlp_fp8_fwd_qw(Tensor x, Tensor wgu_q, Tensor wgu_s, Tensor wd_q, Tensor wd_s, "
        "ScalarType fwd_dtype, bool fast_accum=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("swiglu_mlp_fp8_bwd(Tensor dy, Tensor h, Tensor x_bwd, Tensor sx_bwd, Tensor wgu_bwd, Tensor swgu_bwd, "
        "Tensor a_bwd, Tensor sa_bwd, Tensor wd_bwd, Tensor swd_bwd, ScalarType grad_dtype, bool need_x, "
        "bool need_w_gate_up, bool need_w_down) -> (Tensor, Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("swiglu_mlp_fp8", TORCH_BOX(&swiglu_mlp_fp8));
  m.impl("swiglu_mlp_fp8_fwd", TORCH_BOX(&swiglu_mlp_fp8_fwd));
  m.impl("swiglu_mlp_fp8_bwd", TORCH_BOX(&swiglu_mlp_fp8_bwd));
  m.impl("swiglu_mlp_fp8_fwd_qw", TORCH_BOX(&swiglu_mlp_fp8_fwd_qw));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
