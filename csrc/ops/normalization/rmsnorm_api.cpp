// C API entry points of RMSNorm: argument checks, the empty cases, then the JIT module's launch.
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/normalization/rmsnorm_kernels.h"
#include "ops/normalization/rmsnorm_problem.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::rmsnorm;

extern "C" {

pt_status pt_rmsnorm_fwd(const pt_tensor* x, const pt_tensor* gamma, pt_tensor* y, pt_tensor* rstd,
                         float eps, int32_t zero_centered, void* stream) {
  return api_guard([&] {
    const Problem p = make_fwd_problem(x, gamma, y, rstd, eps);
    if (p.rows == 0) return;
    const int device = current_device();
    bind_device_context(device);
    const Kernels k = load_kernels(p, arch_for_device(device));
    PtRmsNormFwdParams params{};
    params.rows = p.rows;
    params.hidden = p.hidden;
    params.x = x->data;
    params.gamma = gamma->data;
    params.y = y->data;
    params.rstd = static_cast<float*>(rstd->data);
    params.eps = eps;
    params.zero_centered = zero_centered != 0;
    params.stream = stream;
    params.num_sms = device_info(device).sm_count;
    char err[1024] = {0};
    if (k.forward(&params, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "RMSNorm forward (", p.rows, " x ", p.hidden, ", ", dtype_name(p.x_dtype),
               ") failed: ", err);
    }
  });
}

pt_status pt_rmsnorm_bwd(const pt_tensor* dy, const pt_tensor* x, const pt_tensor* gamma,
                         const pt_tensor* rstd, pt_tensor* dx, pt_tensor* dgamma, void* workspace,
                         size_t workspace_bytes, int32_t zero_centered, void* stream) {
  return api_guard([&] {
    const Problem p = make_bwd_problem(dy, x, gamma, rstd, dx, dgamma);
    const size_t need = bwd_workspace_bytes(p.rows, p.hidden);
    PT_CHECK_ARG(workspace_bytes >= need, "argument 'workspace' has ", workspace_bytes,
                 " bytes; this problem needs ", need, " (pt_rmsnorm_bwd_workspace_bytes)");
    PT_CHECK_ARG(need == 0 || (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0),
                 "argument 'workspace' must be a non-null, 16-byte aligned pointer");
    const int device = current_device();
    bind_device_context(device);
    auto s = static_cast<cudaStream_t>(stream);
    if (p.rows == 0) {
      // No rows: dgamma is an empty sum.
      PT_CHECK_CUDA(cudaMemsetAsync(dgamma->data, 0, p.hidden * (dtype_bits(p.gamma_dtype) / 8), s));
      return;
    }
    const Kernels k = load_kernels(p, arch_for_device(device));
    PtRmsNormBwdParams params{};
    params.rows = p.rows;
    params.hidden = p.hidden;
    params.dy = dy->data;
    params.x = x->data;
    params.gamma = gamma->data;
    params.rstd = static_cast<const float*>(rstd->data);
    params.dx = dx->data;
    params.dgamma = dgamma->data;
    params.partials = static_cast<float*>(workspace);
    params.num_partials = num_partials(p.rows, p.hidden);
    params.zero_centered = zero_centered != 0;
    params.stream = stream;
    params.num_sms = device_info(device).sm_count;
    char err[1024] = {0};
    if (k.backward(&params, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "RMSNorm backward (", p.rows, " x ", p.hidden, ", ", dtype_name(p.x_dtype),
               ") failed: ", err);
    }
  });
}

size_t pt_rmsnorm_bwd_workspace_bytes(int64_t rows, int64_t hidden) {
  return bwd_workspace_bytes(rows, hidden);
}

pt_status pt_rmsnorm_prepare(int32_t dtype, int32_t gamma_dtype, int64_t hidden) {
  return api_guard([&] {
    PT_CHECK_ARG(dtype == PT_FLOAT32 || dtype == PT_FLOAT16 || dtype == PT_BFLOAT16, "argument 'dtype' is ",
                 dtype_name(dtype), "; expected float32, float16 or bfloat16");
    PT_CHECK_ARG(gamma_dtype == dtype || gamma_dtype == PT_FLOAT32, "argument 'gamma_dtype' is ",
                 dtype_name(gamma_dtype), "; expected the dtype of x (", dtype_name(dtype), ") or float32");
    PT_CHECK_ARG(hidden >= 1 && hidden <= kMaxHidden, "argument 'hidden' is ", hidden, "; expected 1 to ",
                 kMaxHidden);
    Problem p;
    p.rows = 1;
    p.hidden = hidden;
    p.x_dtype = dtype;
    p.gamma_dtype = gamma_dtype;
    p.vectorized = hidden % vector_width(dtype) == 0;  // as for aligned, contiguous tensors
    load_kernels(p, "90a");
  });
}

}  // extern "C"
