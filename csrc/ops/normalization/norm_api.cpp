// C API entry points of the normalizations: argument checks, the empty cases, then the JIT
// module's launch. One forward and one backward runner serve every kind.
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/normalization/norm_kernels.h"
#include "ops/normalization/norm_problem.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::norm;

namespace {

const void* data_or_null(const pt_tensor* t) { return t != nullptr ? t->data : nullptr; }

void run_fwd(Kind kind, const pt_tensor* x, const pt_tensor* residual, const pt_tensor* gamma, const pt_tensor* beta,
             pt_tensor* y, pt_tensor* residual_out, pt_tensor* rstd, pt_tensor* mean, float eps,
             int32_t zero_centered, void* stream) {
  const Problem p = make_fwd_problem(kind, x, residual, gamma, beta, y, residual_out, rstd, mean, eps);
  if (p.rows == 0) return;
  const int device = current_device();
  bind_device_context(device);
  const Kernels k = load_kernels(p, arch_for_device(device));
  PtNormFwdParams params{};
  params.rows = p.rows;
  params.hidden = p.hidden;
  params.x = x->data;
  params.residual = p.residual() ? residual->data : nullptr;
  params.gamma = gamma->data;
  params.beta = p.layernorm() ? beta->data : nullptr;
  params.y = y->data;
  params.residual_out = p.residual() ? residual_out->data : nullptr;
  params.rstd = static_cast<float*>(rstd->data);
  params.mean = p.layernorm() ? static_cast<float*>(mean->data) : nullptr;
  params.eps = eps;
  params.zero_centered = zero_centered != 0;
  params.stream = stream;
  params.num_sms = device_info(device).sm_count;
  char err[1024] = {0};
  if (k.forward(&params, err, sizeof(err)) != 0) {
    PT_THROW(PT_ERROR_CUDA, kind_name(kind), " forward (", p.rows, " x ", p.hidden, ", ", dtype_name(p.x_dtype),
             ") failed: ", err);
  }
}

void run_bwd(Kind kind, const pt_tensor* dy, const pt_tensor* dsum, const pt_tensor* x, const pt_tensor* gamma,
             const pt_tensor* mean, const pt_tensor* rstd, pt_tensor* dx, pt_tensor* dgamma, pt_tensor* dbeta,
             void* workspace, size_t workspace_bytes, int32_t zero_centered, void* stream) {
  const Problem p = make_bwd_problem(kind, dy, x, gamma, rstd, mean, dsum, dx, dgamma, dbeta);
  const size_t need = bwd_workspace_bytes(p.rows, p.hidden, p.layernorm());
  PT_CHECK_ARG(workspace_bytes >= need, "argument 'workspace' has ", workspace_bytes, " bytes; this problem needs ",
               need, " (pt_", kind_name(kind), "_bwd_workspace_bytes)");
  PT_CHECK_ARG(need == 0 || (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0),
               "argument 'workspace' must be a non-null, 16-byte aligned pointer");
  const int device = current_device();
  bind_device_context(device);
  auto s = static_cast<cudaStream_t>(stream);
  if (p.rows == 0) {
    // No rows: the parameter gradients are empty sums.
    const size_t bytes = p.hidden * (dtype_bits(p.gamma_dtype) / 8);
    PT_CHECK_CUDA(cudaMemsetAsync(dgamma->data, 0, bytes, s));
    if (p.layernorm()) PT_CHECK_CUDA(cudaMemsetAsync(dbeta->data, 0, bytes, s));
    return;
  }
  const Kernels k = load_kernels(p, arch_for_device(device));
  PtNormBwdParams params{};
  params.rows = p.rows;
  params.hidden = p.hidden;
  params.dy = dy->data;
  params.x = x->data;
  params.gamma = gamma->data;
  params.rstd = static_cast<const float*>(rstd->data);
  params.mean = p.layernorm() ? static_cast<const float*>(mean->data) : nullptr;
  params.dsum = p.residual() ? data_or_null(dsum) : nullptr;
  params.dx = dx->data;
  params.dgamma = dgamma->data;
  params.dbeta = p.layernorm() ? dbeta->data : nullptr;
  params.partials = static_cast<float*>(workspace);
  params.num_partials = num_partials(p.rows, p.hidden);
  params.zero_centered = zero_centered != 0;
  params.stream = stream;
  params.num_sms = device_info(device).sm_count;
  char err[1024] = {0};
  if (k.backward(&params, err, sizeof(err)) != 0) {
    PT_THROW(PT_ERROR_CUDA, kind_name(kind), " backward (", p.rows, " x ", p.hidden, ", ", dtype_name(p.x_dtype),
             ") failed: ", err);
  }
}

}  // namespace

extern "C" {

pt_status pt_rmsnorm_fwd(const pt_tensor* x, const pt_tensor* gamma, pt_tensor* y, pt_tensor* rstd, float eps,
                         int32_t zero_centered, void* stream) {
  return api_guard([&] {
    run_fwd(Kind::kRmsNorm, x, nullptr, gamma, nullptr, y, nullptr, rstd, nullptr, eps, zero_centered, stream);
  });
}

pt_status pt_rmsnorm_bwd(const pt_tensor* dy, const pt_tensor* x, const pt_tensor* gamma, const pt_tensor* rstd,
                         pt_tensor* dx, pt_tensor* dgamma, void* workspace, size_t workspace_bytes,
                         int32_t zero_centered, void* stream) {
  return api_guard([&] {
    run_bwd(Kind::kRmsNorm, dy, nullptr, x, gamma, nullptr, rstd, dx, dgamma, nullptr, workspace, workspace_bytes,
            zero_centered, stream);
  });
}

size_t pt_rmsnorm_bwd_workspace_bytes(int64_t rows, int64_t hidden) {
  return bwd_workspace_bytes(rows, hidden, false);
}

pt_status pt_rmsnorm_residual_fwd(const pt_tensor* x, const pt_tensor* residual, const pt_tensor* gamma, pt_tensor* y,
                                  pt_tensor* residual_out, pt_tensor* rstd, float eps, int32_t zero_centered,
                                  void* stream) {
  return api_guard([&] {
    run_fwd(Kind::kRmsNormResidual, x, residual, gamma, nullptr, y, residual_out, rstd, nullptr, eps, zero_centered,
            stream);
  });
}

pt_status pt_rmsnorm_residual_bwd(const pt_tensor* dy, const pt_tensor* dsum, const pt_tensor* residual_out,
                                  const pt_tensor* gamma, const pt_tensor* rstd, pt_tensor* dx, pt_tensor* dgamma,
                                  void* workspace, size_t workspace_bytes, int32_t zero_centered, void* stream) {
  return api_guard([&] {
    run_bwd(Kind::kRmsNormResidual, dy, dsum, residual_out, gamma, nullptr, rstd, dx, dgamma, nullptr, workspace,
            workspace_bytes, zero_centered, stream);
  });
}

pt_status pt_layernorm_fwd(const pt_tensor* x, const pt_tensor* gamma, const pt_tensor* beta, pt_tensor* y,
                           pt_tensor* mean, pt_tensor* rstd, float eps, void* stream) {
  return api_guard([&] {
    run_fwd(Kind::kLayerNorm, x, nullptr, gamma, beta, y, nullptr, rstd, mean, eps, 0, stream);
  });
}

pt_status pt_layernorm_bwd(const pt_tensor* dy, const pt_tensor* x, const pt_tensor* gamma, const pt_tensor* mean,
                           const pt_tensor* rstd, pt_tensor* dx, pt_tensor* dgamma, pt_tensor* dbeta, void* workspace,
                           size_t workspace_bytes, void* stream) {
  return api_guard([&] {
    run_bwd(Kind::kLayerNorm, dy, nullptr, x, gamma, mean, rstd, dx, dgamma, dbeta, workspace, workspace_bytes, 0,
            stream);
  });
}

size_t pt_layernorm_bwd_workspace_bytes(int64_t rows, int64_t hidden) {
  return bwd_workspace_bytes(rows, hidden, true);
}

pt_status pt_norm_prepare(int32_t kind, int32_t dtype, int32_t gamma_dtype, int64_t hidden) {
  return api_guard([&] {
    PT_CHECK_ARG(kind >= 0 && kind <= 2, "argument 'kind' is ", kind,
                 "; expected 0 (rmsnorm), 1 (rmsnorm_residual) or 2 (layernorm)");
    PT_CHECK_ARG(is_float_dtype(dtype), "argument 'dtype' is ",
                 dtype_name(dtype), "; expected float32, float16 or bfloat16");
    PT_CHECK_ARG(gamma_dtype == dtype || gamma_dtype == PT_FLOAT32, "argument 'gamma_dtype' is ",
                 dtype_name(gamma_dtype), "; expected the dtype of x (", dtype_name(dtype), ") or float32");
    PT_CHECK_ARG(hidden >= 1 && hidden <= kMaxHidden, "argument 'hidden' is ", hidden, "; expected 1 to ",
                 kMaxHidden);
    Problem p;
    p.kind = static_cast<Kind>(kind);
    p.rows = 1;
    p.hidden = hidden;
    p.x_dtype = dtype;
    p.gamma_dtype = gamma_dtype;
    p.vectorized = hidden % vector_width(dtype) == 0;  // as for aligned, contiguous tensors
    load_kernels(p, "90a");
  });
}

pt_status pt_rmsnorm_prepare(int32_t dtype, int32_t gamma_dtype, int64_t hidden) {
  return pt_norm_prepare(0, dtype, gamma_dtype, hidden);
}

}  // extern "C"
