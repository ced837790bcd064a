// C API entry points of the gated activations: argument checks, the empty case, the launch.
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/activation/gated_kernels.h"
#include "ops/activation/gated_problem.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::gated;

namespace {

void launch(const Problem& p, bool backward, PtGatedActParams& params, const char* what) {
  if (p.rows == 0) return;
  const int device = current_device();
  bind_device_context(device);
  const Kernels k = load_kernels(p, arch_for_device(device));
  params.rows = p.rows;
  params.cols = p.cols;
  params.num_sms = device_info(device).sm_count;
  char err[1024] = {0};
  if ((backward ? k.backward : k.forward)(&params, err, sizeof(err)) != 0) {
    PT_THROW(PT_ERROR_CUDA, "gated ", act_name(p.act), " ", what, " (", p.rows, " x ", p.cols, ", ",
             dtype_name(p.dtype), ") failed: ", err);
  }
}

// The optional amax output: one float32 on the device, zeroed here for the kernel's atomic max.
float* zeroed_amax(pt_tensor* amax, void* stream) {
  if (amax == nullptr) return nullptr;
  float* value = scalar_float32(*amax, "amax");
  PT_CHECK_CUDA(cudaMemsetAsync(value, 0, sizeof(float), static_cast<cudaStream_t>(stream)));
  return value;
}

}  // namespace

extern "C" {

pt_status pt_gated_act_fwd(int32_t act, const pt_tensor* x, const pt_tensor* probs, const pt_tensor* row_mask,
                           pt_tensor* out, pt_tensor* amax, void* stream) {
  return api_guard([&] {
    const Problem p = make_fwd_problem(checked_act(act), x, probs, row_mask, out);
    PtGatedActParams params{};
    params.amax = zeroed_amax(amax, stream);
    params.x = x->data;
    params.probs = probs != nullptr ? static_cast<const float*>(probs->data) : nullptr;
    params.row_mask = row_mask != nullptr ? static_cast<const int64_t*>(row_mask->data) : nullptr;
    params.out = out->data;
    params.stream = stream;
    launch(p, false, params, "forward");
  });
}

pt_status pt_gated_act_bwd(int32_t act, const pt_tensor* dy, const pt_tensor* x, const pt_tensor* probs,
                           const pt_tensor* row_mask, pt_tensor* dx, pt_tensor* dprobs, pt_tensor* amax,
                           void* stream) {
  return api_guard([&] {
    const Problem p = make_bwd_problem(checked_act(act), dy, x, probs, row_mask, dx, dprobs);
    PtGatedActParams params{};
    params.amax = zeroed_amax(amax, stream);
    params.x = x->data;
    params.dy = dy->data;
    params.probs = probs != nullptr ? static_cast<const float*>(probs->data) : nullptr;
    params.row_mask = row_mask != nullptr ? static_cast<const int64_t*>(row_mask->data) : nullptr;
    params.out = dx->data;
    params.dprobs = dprobs != nullptr ? static_cast<float*>(dprobs->data) : nullptr;
    params.stream = stream;
    launch(p, true, params, "backward");
  });
}

pt_status pt_gated_act_prepare(int32_t act, int32_t dtype, int64_t cols) {
  return api_guard([&] {
    Problem p;
    p.act = checked_act(act);
    PT_CHECK_ARG(is_float_dtype(dtype), "argument 'dtype' is ",
                 dtype_name(dtype), "; expected float32, float16 or bfloat16");
    PT_CHECK_ARG(cols >= 1, "argument 'cols' is ", cols, "; expected at least 1");
    p.dtype = dtype;
    p.cols = cols;
    p.vectorized = cols % (16 / (dtype_bits(dtype) / 8)) == 0;  // as for aligned, contiguous tensors
    load_kernels(p, "90a");
  });
}

}  // extern "C"
