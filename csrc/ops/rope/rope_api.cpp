// C API entry points of RoPE: argument checks, the empty case, then the JIT module's launch.
#include "core/error.h"
#include "core/tensor.h"
#include "runtime/device.h"  // arch_for_device
#include "ops/rope/rope_kernels.h"
#include "ops/rope/rope_problem.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::rope;

extern "C" {

pt_status pt_rope(const pt_tensor* q, const pt_tensor* k, const pt_tensor* cos, const pt_tensor* sin,
                  const pt_tensor* positions, const pt_tensor* cu_seqlens, pt_tensor* q_out, pt_tensor* k_out,
                  int32_t rotary_dim, double theta, int32_t interleaved, int32_t layout, int32_t backward,
                  void* stream) {
  return api_guard([&] {
    const Problem p = make_problem(q, k, cos, sin, positions, cu_seqlens, q_out, k_out, rotary_dim, theta,
                                   interleaved, layout, backward);
    const PtRopeParams& r = p.params;
    if (r.n0 * r.n1 == 0 || r.heads_q + r.heads_k == 0) return;
    const int device = current_device();
    bind_device_context(device);
    const PtRopeFn run = load_kernel(p, arch_for_device(device));
    PtRopeParams params = r;
    params.stream = stream;
    char err[1024] = {0};
    if (run(&params, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "RoPE ", backward ? "backward" : "forward", " (q ", shape_string(*q), ", k ",
               shape_string(*k), ", ", dtype_name(p.dtype), ") failed: ", err);
    }
  });
}

pt_status pt_rope_prepare(int32_t dtype, int32_t vectorized, int32_t interleaved, int32_t table) {
  return api_guard([&] {
    PT_CHECK_ARG(is_float_dtype(dtype), "argument 'dtype' is ",
                 dtype_name(dtype), "; expected float32, float16 or bfloat16");
    Problem p;
    p.dtype = dtype;
    p.vectorized = vectorized != 0;
    p.interleaved = interleaved != 0;
    p.table = table != 0;
    load_kernel(p, "90a");
  });
}

}  // extern "C"
