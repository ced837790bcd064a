// C API entry points of RMSNorm with the FP8 output (primus_turbo/fp8_fusion.h): the plain
// forward's checks, the FP8 output's, then the FP8 module's launch.
#include "core/error.h"
#include "core/tensor.h"
#include "ops/fp8_fusion/fp8_output.h"
#include "ops/normalization/norm_kernels.h"
#include "ops/normalization/norm_problem.h"
#include "primus_turbo/fp8_fusion.h"
#include "primus_turbo/quantization.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::norm;

namespace {

constexpr const char* kOp = "rmsnorm_fp8";

int32_t checked_fp8_dtype(int32_t dt) {
  PT_CHECK_ARG(dt == PT_FLOAT8_E4M3 || dt == PT_FLOAT8_E5M2, kOp, ": argument 'fp8_dtype' is ", dtype_name(dt),
               "; expected float8_e4m3 or float8_e5m2");
  return dt;
}

}  // namespace

extern "C" {

pt_status pt_rmsnorm_fp8_fwd(const pt_tensor* x, const pt_tensor* residual, const pt_tensor* gamma, pt_tensor* y,
                             pt_tensor* residual_out, pt_tensor* q, pt_tensor* scale_inv, pt_tensor* rstd,
                             int32_t granularity, float eps, int32_t zero_centered, void* stream) {
  return api_guard([&] {
    const Kind kind = residual != nullptr ? Kind::kRmsNormResidual : Kind::kRmsNorm;
    // Without y, x stands in for it in the shape and alignment checks.
    Problem p = make_fwd_problem(kind, x, residual, gamma, nullptr, y != nullptr ? y : x, residual_out, rstd,
                                 nullptr, eps);
    p.fp8 = fp8_fusion::checked_granularity(kOp, granularity);
    p.fp8_dtype = fp8_fusion::check_fp8_output(kOp, q, scale_inv, p.rows, p.hidden, p.fp8);
    PT_CHECK_SUPPORTED(p.vectorized, kOp, " needs 16-byte accesses: hidden (", p.hidden, ") a multiple of ",
                       vector_width(p.x_dtype), " and 16-byte aligned tensors");
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
    params.y = y != nullptr ? y->data : nullptr;
    params.residual_out = p.residual() ? residual_out->data : nullptr;
    params.rstd = static_cast<float*>(rstd->data);
    params.eps = eps;
    params.zero_centered = zero_centered != 0;
    params.stream = stream;
    params.num_sms = device_info(device).sm_count;
    params.q = q->data;
    params.q_scale_inv = static_cast<float*>(scale_inv->data);
    char err[1024] = {0};
    if (k.forward(&params, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, kOp, " forward (", p.rows, " x ", p.hidden, ", ", dtype_name(p.x_dtype),
               ") failed: ", err);
    }
  });
}

pt_status pt_rmsnorm_fp8_prepare(int32_t residual, int32_t dtype, int32_t gamma_dtype, int64_t hidden,
                                 int32_t granularity, int32_t fp8_dtype) {
  return api_guard([&] {
    PT_CHECK_ARG(is_float_dtype(dtype), "argument 'dtype' is ",
                 dtype_name(dtype), "; expected float32, float16 or bfloat16");
    PT_CHECK_ARG(gamma_dtype == dtype || gamma_dtype == PT_FLOAT32, "argument 'gamma_dtype' is ",
                 dtype_name(gamma_dtype), "; expected the dtype of x (", dtype_name(dtype), ") or float32");
    PT_CHECK_ARG(hidden >= 1 && hidden <= kMaxHidden, "argument 'hidden' is ", hidden, "; expected 1 to ",
                 kMaxHidden);
    PT_CHECK_SUPPORTED(hidden % vector_width(dtype) == 0, kOp, " needs hidden to be a multiple of ",
                       vector_width(dtype), ", got ", hidden);
    Problem p;
    p.kind = residual ? Kind::kRmsNormResidual : Kind::kRmsNorm;
    p.rows = 1;
    p.hidden = hidden;
    p.x_dtype = dtype;
    p.gamma_dtype = gamma_dtype;
    p.vectorized = true;
    p.fp8 = fp8_fusion::checked_granularity(kOp, granularity);
    p.fp8_dtype = checked_fp8_dtype(fp8_dtype);
    load_kernels(p, "90a");
  });
}

}  // extern "C"
