// C API entry points of the gated activations with the FP8 output (primus_turbo/fp8_fusion.h).
#include "core/error.h"
#include "core/tensor.h"
#include "ops/activation/gated_kernels.h"
#include "ops/activation/gated_problem.h"
#include "ops/fp8_fusion/fp8_output.h"
#include "primus_turbo/fp8_fusion.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::gated;

extern "C" {

pt_status pt_gated_act_fp8_fwd(int32_t act, const pt_tensor* x, const pt_tensor* probs, const pt_tensor* row_mask,
                               pt_tensor* out, pt_tensor* q, pt_tensor* scale_inv, int32_t granularity, void* stream) {
  return api_guard([&] {
    const Problem p = make_fp8_fwd_problem(checked_act(act), x, probs, row_mask, out, q, scale_inv, granularity);
    if (p.rows == 0) return;
    const int device = current_device();
    bind_device_context(device);
    const Kernels k = load_kernels(p, arch_for_device(device));
    PtGatedActParams params{};
    params.rows = p.rows;
    params.cols = p.cols;
    params.x = x->data;
    params.probs = probs != nullptr ? static_cast<const float*>(probs->data) : nullptr;
    params.row_mask = row_mask != nullptr ? static_cast<const int64_t*>(row_mask->data) : nullptr;
    params.out = out != nullptr ? out->data : nullptr;
    params.stream = stream;
    params.num_sms = device_info(device).sm_count;
    params.q = q->data;
    params.q_scale_inv = static_cast<float*>(scale_inv->data);
    char err[1024] = {0};
    if (k.forward(&params, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "gated ", act_name(p.act), " FP8 forward (", p.rows, " x ", p.cols, ", ",
               dtype_name(p.dtype), ") failed: ", err);
    }
  });
}

pt_status pt_gated_act_fp8_prepare(int32_t act, int32_t dtype, int64_t cols, int32_t granularity, int32_t fp8_dtype) {
  return api_guard([&] {
    Problem p;
    p.act = checked_act(act);
    PT_CHECK_ARG(is_float_dtype(dtype), "argument 'dtype' is ",
                 dtype_name(dtype), "; expected float32, float16 or bfloat16");
    const int vec = 16 / (dtype_bits(dtype) / 8);
    PT_CHECK_SUPPORTED(cols >= 1 && cols % vec == 0, "gated activation FP8 forward needs cols to be a multiple of ",
                       vec, ", got ", cols);
    PT_CHECK_ARG(fp8_dtype == PT_FLOAT8_E4M3 || fp8_dtype == PT_FLOAT8_E5M2, "argument 'fp8_dtype' is ",
                 dtype_name(fp8_dtype), "; expected float8_e4m3 or float8_e5m2");
    p.dtype = dtype;
    p.cols = cols;
    p.vectorized = true;
    p.fp8 = fp8_fusion::checked_granularity("gated activation FP8 forward", granularity);
    p.fp8_dtype = fp8_dtype;
    load_kernels(p, "90a");
  });
}

}  // extern "C"
