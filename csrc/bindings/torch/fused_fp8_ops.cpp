// primus_turbo::rmsnorm_fp8_fwd / gated_act_fp8_fwd: RMSNorm (optionally with a residual) and the
// gated activations with their output quantized to FP8 in the same kernel (ops/fused_fp8.py checks
// the arguments): outputs and the launch in one native call. The kernels read 16-byte vectors only,
// so an input at a misaligned offset is copied first.
#include <optional>
#include <tuple>

#include "bindings/torch/plan_cache.h"
#include "bindings/torch/torch_binding.h"
#include "primus_turbo/fp8_fusion.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr int64_t kRowwise = 1;  // pt_quant_granularity: ROWWISE, else BLOCKWISE with 128-element blocks

// t contiguous with 16-byte aligned data (a copy where it is not).
Tensor aligned(const Tensor& t) {
  const Tensor c = as_contiguous(t);
  return alignment(c.data_ptr()) >= 16 ? c : fresh_copy(c);
}

int64_t scales_per_row(int64_t granularity, int64_t cols) { return granularity == kRowwise ? 1 : (cols + 127) / 128; }

// Returns (q, scale_inv, y or [0], residual_out or [0], rstd).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> rmsnorm_fp8_fwd(Tensor x_in, std::optional<Tensor> residual_in,
                                                                   Tensor gamma_in, double eps, bool zero_centered,
                                                                   int64_t granularity, ScalarType fp8_dtype,
                                                                   bool return_hp) {
  NamedTensors all{{"x", &x_in}, {"gamma", &gamma_in}};
  add_present(all, "residual", residual_in);
  const int32_t device = check_cuda("rmsnorm_fp8", all);
  if (x_in.dim() != 2) fail_with(ErrorKind::Value, "rmsnorm_fp8: 'x' must be 2-D here, got ", shape_string(x_in));
  const int64_t rows = x_in.sizes()[0], hidden = x_in.sizes()[1];
  const ScalarType dtype = x_in.scalar_type();
  Tensor q = empty({rows, hidden}, fp8_dtype, device);
  Tensor s = empty({rows, scales_per_row(granularity, hidden)}, ScalarType::Float, device);
  Tensor y = return_hp ? empty({rows, hidden}, dtype, device) : empty({0}, dtype, device);
  Tensor s_out = residual_in ? empty({rows, hidden}, dtype, device) : empty({0}, dtype, device);
  Tensor rstd = empty({rows}, ScalarType::Float, device);
  if (rows == 0) return {q, s, y, s_out, rstd};
  const Tensor x = aligned(x_in), gamma = aligned(gamma_in);
  std::optional<Tensor> residual;
  if (residual_in) residual = aligned(*residual_in);
  DeviceScope scope(device);
  const pt_tensor px = to_pt(x), pg = to_pt(gamma);
  OptionalPt pr(residual);
  pt_tensor py = to_pt(y), pso = to_pt(s_out), pq = to_pt(q), ps = to_pt(s), prs = to_pt(rstd);
  check_status(pt_rmsnorm_fp8_fwd(&px, pr.get(), &pg, return_hp ? &py : nullptr, residual ? &pso : nullptr, &pq, &ps,
                                  &prs, static_cast<int32_t>(granularity), static_cast<float>(eps),
                                  zero_centered ? 1 : 0, current_stream(device)),
               "rmsnorm_fp8 forward");
  return {q, s, y, s_out, rstd};
}

// x [rows, 2 * cols] (gate, up) -> (q [rows, cols], scale_inv, out or [0]).
std::tuple<Tensor, Tensor, Tensor> gated_act_fp8_fwd(Tensor x_in, std::optional<Tensor> probs_in,
                                                     std::optional<Tensor> row_mask_in, int64_t act,
                                                     int64_t granularity, ScalarType fp8_dtype, bool return_hp) {
  NamedTensors all{{"x", &x_in}};
  add_present(all, "probs", probs_in);
  add_present(all, "row_mask", row_mask_in);
  const int32_t device = check_cuda("gated activation FP8", all);
  if (x_in.dim() != 2)
    fail_with(ErrorKind::Value, "gated activation FP8: 'x' must be 2-D here, got ", shape_string(x_in));
  const int64_t rows = x_in.sizes()[0], cols = x_in.sizes()[1] / 2;
  Tensor q = empty({rows, cols}, fp8_dtype, device);
  Tensor s = empty({rows, scales_per_row(granularity, cols)}, ScalarType::Float, device);
  Tensor out = return_hp ? empty({rows, cols}, x_in.scalar_type(), device) : empty({0}, x_in.scalar_type(), device);
  if (q.numel() == 0) return {q, s, out};
  const Tensor x = aligned(x_in);
  std::optional<Tensor> probs, row_mask;
  if (probs_in) probs = as_contiguous(*probs_in);
  if (row_mask_in) row_mask = as_contiguous(*row_mask_in);
  DeviceScope scope(device);
  const pt_tensor px = to_pt(x);
  OptionalPt pp(probs);
  pt_tensor pm{};
  if (row_mask) pm = mask_to_pt(*row_mask);
  pt_tensor po = to_pt(out), pq = to_pt(q), ps = to_pt(s);
  check_status(pt_gated_act_fp8_fwd(static_cast<int32_t>(act), &px, pp.get(), row_mask ? &pm : nullptr,
                                    return_hp ? &po : nullptr, &pq, &ps, static_cast<int32_t>(granularity),
                                    current_stream(device)),
               "gated activation FP8 forward");
  return {q, s, out};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("rmsnorm_fp8_fwd(Tensor x, Tensor? residual, Tensor gamma, float eps, bool zero_centered, int granularity, "
        "ScalarType fp8_dtype, bool return_hp) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("gated_act_fp8_fwd(Tensor x, Tensor? probs, Tensor? row_mask, int act, int granularity, ScalarType fp8_dtype, "
        "bool return_hp) -> (Tensor, Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("rmsnorm_fp8_fwd", TORCH_BOX(&rmsnorm_fp8_fwd));
  m.impl("gated_act_fp8_fwd", TORCH_BOX(&gated_act_fp8_fwd));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
