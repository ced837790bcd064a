// RMSNorm, RMSNorm + residual and LayerNorm, forward and backward: one native call each. Inputs
// of any shape [..., hidden] (a non-contiguous one is copied once); the statistics are float32,
// one per row.
#include <cmath>
#include <optional>
#include <tuple>

#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr int64_t kMaxHidden = 65536;

int64_t hidden_of(const Tensor& x) { return x.sizes()[x.dim() - 1]; }
int64_t rows_of(const Tensor& x) {
  const int64_t h = hidden_of(x);
  return h ? x.numel() / h : 0;
}

// Checks x, the tensors shaped like x, the [hidden] weights and eps as the fake implementation
// does (ops/normalization.py: _check_args); returns the device.
int32_t check_norm(const char* op, const Tensor& x, const NamedTensors& like_x, const NamedTensors& params,
                   double eps) {
  if (!is_float_dtype(x.scalar_type()))
    fail_with(ErrorKind::Type, op, ": argument 'x' has dtype ", dtype_name(x.scalar_type()),
              "; expected float32, float16 or bfloat16");
  if (x.dim() < 1) fail_with(ErrorKind::Value, op, ": argument 'x' must have at least 1 dimension, got a scalar");
  const int64_t hidden = hidden_of(x);
  if (hidden < 1 || hidden > kMaxHidden)
    fail_with(ErrorKind::Value, op, ": argument 'x' has shape ", shape_string(x), "; its last dimension must be 1 to ",
              kMaxHidden);
  for (const auto& [name, t] : like_x) {
    const auto ts = t->sizes();
    const auto xs = x.sizes();
    if (ts.size() != xs.size() || !std::equal(ts.begin(), ts.end(), xs.begin()))
      fail_with(ErrorKind::Value, op, ": argument '", name, "' has shape ", shape_string(*t),
                "; expected the shape of 'x' ", shape_string(x));
    if (t->scalar_type() != x.scalar_type())
      fail_with(ErrorKind::Type, op, ": argument '", name, "' has dtype ", dtype_name(t->scalar_type()), "; expected ",
                dtype_name(x.scalar_type()), " (the dtype of 'x')");
  }
  const Tensor* first = nullptr;
  for (const auto& [name, t] : params) {
    if (t->scalar_type() != x.scalar_type() && t->scalar_type() != ScalarType::Float)
      fail_with(ErrorKind::Type, op, ": argument '", name, "' has dtype ", dtype_name(t->scalar_type()), "; expected ",
                dtype_name(x.scalar_type()), " (the dtype of 'x') or float32");
    if (first && t->scalar_type() != first->scalar_type())
      fail_with(ErrorKind::Type, op, ": argument '", name, "' has dtype ", dtype_name(t->scalar_type()),
                "; expected the dtype of the other weight (", dtype_name(first->scalar_type()), ")");
    first = t;
    if (t->dim() != 1 || t->sizes()[0] != hidden)
      fail_with(ErrorKind::Value, op, ": argument '", name, "' has shape ", shape_string(*t), "; expected [", hidden,
                "] (the last dimension of 'x')");
  }
  if (!std::isfinite(eps) || eps < 0)
    fail_with(ErrorKind::Value, op, ": argument 'eps' must be a finite non-negative number, got ", eps);
  NamedTensors all{{"x", &x}};
  all.insert(all.end(), like_x.begin(), like_x.end());
  all.insert(all.end(), params.begin(), params.end());
  return check_cuda(op, all);
}

// [rows, hidden] view of a contiguous tensor of any rank, as the core expects.
pt_tensor rows_view(const Tensor& x) { return rows_descriptor(x); }

Tensor stat(const Tensor& x, int32_t device) { return empty({rows_of(x)}, ScalarType::Float, device); }

Tensor workspace(size_t bytes, int32_t device) { return empty({static_cast<int64_t>(bytes)}, ScalarType::Byte, device); }

void* ptr_or_null(const Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }

std::tuple<Tensor, Tensor> rmsnorm_fwd(Tensor x_in, Tensor gamma_in, double eps, bool zero_centered) {
  const int32_t device = check_norm("rmsnorm", x_in, {}, {{"gamma", &gamma_in}}, eps);
  const Tensor x = as_contiguous(x_in), gamma = as_contiguous(gamma_in);
  Tensor y = empty_like(x), rstd = stat(x, device);
  if (rows_of(x) == 0) return {y, rstd};
  DeviceScope scope(device);
  pt_tensor px = rows_view(x), pg = to_pt(gamma), py = rows_view(y), pr = to_pt(rstd);
  check_status(pt_rmsnorm_fwd(&px, &pg, &py, &pr, static_cast<float>(eps), zero_centered, current_stream(device)),
               "rmsnorm forward");
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rmsnorm_bwd(Tensor dy_in, Tensor x_in, Tensor gamma_in, Tensor rstd, bool zero_centered) {
  const int32_t device = check_norm("rmsnorm", x_in, {{"dy", &dy_in}}, {{"gamma", &gamma_in}}, 0.0);
  // The autograd function saves the caller's gamma, which may be a strided view.
  const Tensor dy = as_contiguous(dy_in), x = as_contiguous(x_in), gamma = as_contiguous(gamma_in);
  Tensor dx = empty_like(x), dgamma = empty_like(gamma);
  DeviceScope scope(device);
  const Tensor ws = workspace(pt_rmsnorm_bwd_workspace_bytes(rows_of(x), hidden_of(x)), device);
  pt_tensor pdy = rows_view(dy), px = rows_view(x), pg = to_pt(gamma), pr = to_pt(rstd), pdx = rows_view(dx),
            pdg = to_pt(dgamma);
  check_status(pt_rmsnorm_bwd(&pdy, &px, &pg, &pr, &pdx, &pdg, ptr_or_null(ws), ws.numel(), zero_centered,
                              current_stream(device)),
               "rmsnorm backward");
  return {dx, dgamma};
}

std::tuple<Tensor, Tensor, Tensor> rmsnorm_residual_fwd(Tensor x_in, Tensor residual_in, Tensor gamma_in, double eps,
                                                        bool zero_centered) {
  const int32_t device =
      check_norm("rmsnorm_residual", x_in, {{"residual", &residual_in}}, {{"gamma", &gamma_in}}, eps);
  const Tensor x = as_contiguous(x_in), residual = as_contiguous(residual_in), gamma = as_contiguous(gamma_in);
  Tensor y = empty_like(x), s = empty_like(x), rstd = stat(x, device);
  if (rows_of(x) == 0) return {y, s, rstd};
  DeviceScope scope(device);
  pt_tensor px = rows_view(x), pres = rows_view(residual), pg = to_pt(gamma), py = rows_view(y), ps = rows_view(s),
            pr = to_pt(rstd);
  check_status(pt_rmsnorm_residual_fwd(&px, &pres, &pg, &py, &ps, &pr, static_cast<float>(eps), zero_centered,
                                       current_stream(device)),
               "rmsnorm_residual forward");
  return {y, s, rstd};
}

std::tuple<Tensor, Tensor> rmsnorm_residual_bwd(Tensor dy_in, std::optional<Tensor> dsum_in, Tensor s_in,
                                                Tensor gamma_in, Tensor rstd, bool zero_centered) {
  const int32_t device = check_norm("rmsnorm_residual", s_in, {{"dy", &dy_in}}, {{"gamma", &gamma_in}}, 0.0);
  const Tensor dy = as_contiguous(dy_in), s = as_contiguous(s_in), gamma = as_contiguous(gamma_in);
  std::optional<Tensor> dsum;
  if (dsum_in) dsum = as_contiguous(*dsum_in);
  Tensor dx = empty_like(s), dgamma = empty_like(gamma);
  DeviceScope scope(device);
  const Tensor ws = workspace(pt_rmsnorm_bwd_workspace_bytes(rows_of(s), hidden_of(s)), device);
  pt_tensor pdy = rows_view(dy), ps = rows_view(s), pg = to_pt(gamma), pr = to_pt(rstd), pdx = rows_view(dx),
            pdg = to_pt(dgamma);
  pt_tensor pds{};
  if (dsum) pds = rows_view(*dsum);
  check_status(pt_rmsnorm_residual_bwd(&pdy, dsum ? &pds : nullptr, &ps, &pg, &pr, &pdx, &pdg, ptr_or_null(ws),
                                       ws.numel(), zero_centered, current_stream(device)),
               "rmsnorm_residual backward");
  return {dx, dgamma};
}

std::tuple<Tensor, Tensor, Tensor> layernorm_fwd(Tensor x_in, Tensor gamma_in, Tensor beta_in, double eps) {
  const int32_t device = check_norm("layernorm", x_in, {}, {{"gamma", &gamma_in}, {"beta", &beta_in}}, eps);
  const Tensor x = as_contiguous(x_in), gamma = as_contiguous(gamma_in), beta = as_contiguous(beta_in);
  Tensor y = empty_like(x), mean = stat(x, device), rstd = stat(x, device);
  if (rows_of(x) == 0) return {y, mean, rstd};
  DeviceScope scope(device);
  pt_tensor px = rows_view(x), pg = to_pt(gamma), pb = to_pt(beta), py = rows_view(y), pm = to_pt(mean),
            pr = to_pt(rstd);
  check_status(pt_layernorm_fwd(&px, &pg, &pb, &py, &pm, &pr, static_cast<float>(eps), current_stream(device)),
               "layernorm forward");
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layernorm_bwd(Tensor dy_in, Tensor x_in, Tensor gamma_in, Tensor mean,
                                                  Tensor rstd) {
  const int32_t device = check_norm("layernorm", x_in, {{"dy", &dy_in}}, {{"gamma", &gamma_in}}, 0.0);
  const Tensor dy = as_contiguous(dy_in), x = as_contiguous(x_in), gamma = as_contiguous(gamma_in);
  Tensor dx = empty_like(x), dgamma = empty_like(gamma), dbeta = empty_like(gamma);
  DeviceScope scope(device);
  const Tensor ws = workspace(pt_layernorm_bwd_workspace_bytes(rows_of(x), hidden_of(x)), device);
  pt_tensor pdy = rows_view(dy), px = rows_view(x), pg = to_pt(gamma), pm = to_pt(mean), pr = to_pt(rstd),
            pdx = rows_view(dx), pdg = to_pt(dgamma), pdb = to_pt(dbeta);
  check_status(pt_layernorm_bwd(&pdy, &px, &pg, &pm, &pr, &pdx, &pdg, &pdb, ptr_or_null(ws), ws.numel(),
                                current_stream(device)),
               "layernorm backward");
  return {dx, dgamma, dbeta};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("rmsnorm_fwd(Tensor x, Tensor gamma, float eps, bool zero_centered) -> (Tensor, Tensor)");
  m.def("rmsnorm_bwd(Tensor dy, Tensor x, Tensor gamma, Tensor rstd, bool zero_centered) -> (Tensor, Tensor)");
  m.def("rmsnorm_residual_fwd(Tensor x, Tensor residual, Tensor gamma, float eps, bool zero_centered)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("rmsnorm_residual_bwd(Tensor dy, Tensor? dsum, Tensor s, Tensor gamma, Tensor rstd, bool zero_centered)"
        " -> (Tensor, Tensor)");
  m.def("layernorm_fwd(Tensor x, Tensor gamma, Tensor beta, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("layernorm_bwd(Tensor dy, Tensor x, Tensor gamma, Tensor mean, Tensor rstd) -> (Tensor, Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("rmsnorm_fwd", TORCH_BOX(&rmsnorm_fwd));
  m.impl("rmsnorm_bwd", TORCH_BOX(&rmsnorm_bwd));
  m.impl("rmsnorm_residual_fwd", TORCH_BOX(&rmsnorm_residual_fwd));
  m.impl("rmsnorm_residual_bwd", TORCH_BOX(&rmsnorm_residual_bwd));
  m.impl("layernorm_fwd", TORCH_BOX(&layernorm_fwd));
  m.impl("layernorm_bwd", TORCH_BOX(&layernorm_bwd));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
