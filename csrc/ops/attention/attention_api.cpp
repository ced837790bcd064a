// C API entry points of attention: argument checks, the backend, then its launches.
#include "core/error.h"
#include "core/tensor.h"
#include "dispatch/backend_settings.h"
#include "ops/attention/attention_cudnn.h"
#include "ops/attention/attention_kernels.h"
#include "ops/attention/attention_problem.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::attention;

namespace {

void run(PtAttnFn fn, PtAttnParams params, void* stream, const char* what, const pt_tensor& q, const pt_tensor& k) {
  params.stream = stream;
  char err[1024] = {0};
  if (fn(&params, err, sizeof(err)) != 0) {
    PT_THROW(PT_ERROR_CUDA, "attention ", what, " (q ", shape_string(q), ", k ", shape_string(k), ") failed: ", err);
  }
}

// Our kernel for the problem's forward or backward: the sm90 ones on Hopper where they apply (then
// *sm90 is set), else the mma.sync module's.
PtAttnFn kernel_for(const Problem& p, bool backward, bool* sm90 = nullptr) {
  const int device = current_device();
  bind_device_context(device);
  const std::string arch = arch_for_device(device);
  const int32_t d = p.params.head_dim, dv = p.params.head_dim_v;
  PtAttnFn fn = backward ? load_sm90_backward(p.dtype, d, dv, arch) : load_sm90_forward(p.dtype, d, dv, arch);
  if (sm90 != nullptr) *sm90 = fn != nullptr;
  if (fn != nullptr) return fn;
  const Kernels k = load_kernels(p.dtype, d, dv, arch);
  return backward ? k.backward : k.forward;
}

// Bytes of the float32 dQ workspace of the sm90 backward that fuses dQ into its dK/dV kernel; 0
// where the problem takes the separate dQ kernel (deterministic, other head dims or kernels).
size_t fused_dq_bytes(const Problem& p, bool sm90, bool deterministic) {
  const PtAttnParams& r = p.params;
  if (!sm90 || deterministic || !sm90_fused_dq_head_dims(r.head_dim, r.head_dim_v)) return 0;
  const int64_t rows = r.cu_seqlens_q != nullptr ? r.total_q : r.batch * r.seqlen_q;
  return static_cast<size_t>(rows) * r.heads_q * r.head_dim * sizeof(float);
}

// The cuDNN plan when the backend asks for cuDNN and cuDNN runs the problem, null for our kernel.
// backend NONE is the default choice: cuDNN where it can (faster than our kernel today), else ours.
const cudnn::Plan* choose(const Problem& p, int32_t backend, bool backward, bool deterministic) {
  if (backend == PT_BACKEND_TURBO) return nullptr;
  PT_CHECK_ARG(backend == PT_BACKEND_NONE || backend == PT_BACKEND_CUDNN, "argument 'backend' is ",
               backend_name(backend), "; attention runs on TURBO or CUDNN");
  // Unset: some backwards run on ours (deterministic: its separate dQ kernel, no atomics; head dim 64
  // with sinks: faster), the forward still on cuDNN.
  if (backend == PT_BACKEND_NONE && backward && unset_backward_on_ours(p, deterministic)) return nullptr;
  std::string why;
  const cudnn::Plan* plan = nullptr;
  if (backward && deterministic && p.params.sink != nullptr) {
    why = "its sink gradient is not bitwise reproducible (deterministic=True)";
  } else {
    plan = cudnn::plan_for(p, backward, deterministic, &why);
  }
  PT_CHECK_SUPPORTED(plan != nullptr || backend == PT_BACKEND_NONE, "the CUDNN attention backend cannot run this ",
                     backward ? "backward" : "forward", ": ", why,
                     "; choose TURBO (our kernel) or leave the attention backend unset");
  return plan;
}

// Runs the cuDNN plan when its workspace fits; else reports the bytes it needs. True if it ran.
bool run_cudnn(const cudnn::Plan& plan, const Problem& p, void* workspace, size_t workspace_bytes,
               size_t* workspace_needed, void* stream) {
  const size_t need = cudnn::workspace_bytes(plan, p);
  if (workspace_needed != nullptr) *workspace_needed = need;
  if (need > workspace_bytes) {
    PT_CHECK_ARG(workspace_needed != nullptr, "cuDNN attention needs ", need,
                 " bytes of workspace; pass workspace_needed to learn the size");
    return false;
  }
  cudnn::execute(plan, p, workspace, stream);
  return true;
}

}  // namespace

extern "C" {

pt_status pt_attention_fwd(const pt_tensor* q, const pt_tensor* k, const pt_tensor* v, const pt_tensor* sink,
                           const pt_tensor* cu_seqlens_q, const pt_tensor* cu_seqlens_k, pt_tensor* out,
                           pt_tensor* lse, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                           int32_t window_left, int32_t window_right, int32_t backend, void* workspace,
                           size_t workspace_bytes, size_t* workspace_needed, void* stream) {
  return api_guard([&] {
    if (workspace_needed != nullptr) *workspace_needed = 0;
    const Problem p = make_problem(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, out, lse, max_seqlen_q, max_seqlen_k,
                                   softmax_scale, window_left, window_right);
    if (numel(*out) == 0 && numel(*lse) == 0) return;
    if (const cudnn::Plan* plan = choose(p, backend, false, false)) {
      run_cudnn(*plan, p, workspace, workspace_bytes, workspace_needed, stream);
      return;
    }
    run(kernel_for(p, false), p.params, stream, "forward", *q, *k);
  });
}

pt_status pt_attention_bwd(const pt_tensor* dout, const pt_tensor* q, const pt_tensor* k, const pt_tensor* v,
                           const pt_tensor* out, const pt_tensor* lse, const pt_tensor* sink,
                           const pt_tensor* cu_seqlens_q, const pt_tensor* cu_seqlens_k, pt_tensor* dq, pt_tensor* dk,
                           pt_tensor* dv, pt_tensor* dsink, pt_tensor* delta, int64_t max_seqlen_q,
                           int64_t max_seqlen_k, double softmax_scale, int32_t window_left, int32_t window_right,
                           int32_t backend, int32_t deterministic, void* workspace, size_t workspace_bytes,
                           size_t* workspace_needed, void* stream) {
  return api_guard([&] {
    if (workspace_needed != nullptr) *workspace_needed = 0;
    Problem p = make_problem(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, out, lse, max_seqlen_q, max_seqlen_k,
                             softmax_scale, window_left, window_right);
    add_backward(p, dout, dq, dk, dv, dsink, delta);
    if (no_gradients(dq, dk, dsink)) return;
    if (const cudnn::Plan* plan = choose(p, backend, true, deterministic != 0)) {
      run_cudnn(*plan, p, workspace, workspace_bytes, workspace_needed, stream);
      return;
    }
    bool sm90 = false;
    const PtAttnFn fn = kernel_for(p, true, &sm90);
    // The fused dQ needs a workspace: report its size to a caller who can allocate one; a caller
    // who passes neither gets the separate dQ kernel.
    if (const size_t need = fused_dq_bytes(p, sm90, deterministic != 0); need > 0) {
      if (workspace_needed != nullptr) *workspace_needed = need;
      if (workspace_bytes >= need) {
        p.params.dq_accum = static_cast<float*>(workspace);
      } else if (workspace_needed != nullptr) {
        return;
      }
    }
    run(fn, p.params, stream, "backward", *q, *k);
  });
}

pt_status pt_attention_prepare(int32_t dtype, int32_t head_dim, int32_t head_dim_v) {
  return api_guard([&] {
    PT_CHECK_ARG(dtype == PT_BFLOAT16 || dtype == PT_FLOAT16, "argument 'dtype' is ", dtype_name(dtype),
                 "; expected bfloat16 or float16");
    PT_CHECK_SUPPORTED(supported_head_dims(head_dim, head_dim_v), "head dims ", head_dim, "/", head_dim_v,
                       " are not supported");
    load_kernels(dtype, head_dim, head_dim_v, "90a");
    load_sm90_forward(dtype, head_dim, head_dim_v, "90a");
    load_sm90_backward(dtype, head_dim, head_dim_v, "90a");
    cudnn::prepare_ragged_metadata("90a");                   // packed sequences on cuDNN
  });
}

}  // extern "C"
