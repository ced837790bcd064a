// C API entry points of the FP8 GEMM: argument checks, the trivial cases, then the backend.
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/gemm/gemm_fp8_backend.h"

using namespace primus_turbo;
using namespace primus_turbo::gemm;

extern "C" {

pt_status pt_gemm_fp8(const pt_tensor* a, const pt_tensor* a_scale, int32_t a_scaling,
                      const pt_tensor* b, const pt_tensor* b_scale, int32_t b_scaling,
                      pt_tensor* d, float beta, int32_t flags, int32_t backend, int32_t config,
                      void* workspace, size_t workspace_bytes, void* stream) {
  return api_guard([&] {
    const Fp8Problem p = make_fp8_problem(a, a_scale, a_scaling, b, b_scale, b_scaling, d, beta, flags);
    const Fp8Backend& be = fp8_backend_for(backend);
    auto s = static_cast<cudaStream_t>(stream);
    if (p.m == 0 || p.n == 0) return;
    if (p.k == 0) {  // empty product: d = beta * d for beta in {0, 1}
      PT_CHECK_SUPPORTED(beta == 0.0f || beta == 1.0f, "FP8 GEMM with K == 0 supports beta 0 or 1");
      if (beta == 0.0f) {
        const size_t esz = p.d_dtype == PT_FLOAT32 ? 4 : 2;
        PT_CHECK_CUDA(cudaMemset2DAsync(p.d, p.ldd * esz, 0, p.n * esz, p.m, s));
      }
      return;
    }
    be.run(p, config, workspace, workspace_bytes, s);
  });
}

pt_status pt_gemm_fp8_query(const pt_tensor* a, const pt_tensor* a_scale, int32_t a_scaling,
                            const pt_tensor* b, const pt_tensor* b_scale, int32_t b_scaling,
                            const pt_tensor* d, float beta, int32_t flags, int32_t backend, int32_t* accepted,
                            int32_t* num_configs, char* reason, size_t reason_len) {
  return api_guard([&] {
    PT_CHECK_ARG(accepted && num_configs, "pt_gemm_fp8_query: output pointers must not be null");
    const Fp8Problem p = make_fp8_problem(a, a_scale, a_scaling, b, b_scale, b_scaling, d, beta, flags);
    const Fp8Backend& be = fp8_backend_for(backend);
    const bool trivial = p.m == 0 || p.n == 0 || p.k == 0;
    const std::string why = trivial ? "" : be.rejection(p);
    *accepted = why.empty();
    *num_configs = why.empty() ? (trivial ? 1 : be.num_configs(p)) : 0;
    if (reason && reason_len) copy_out(why.substr(0, reason_len - 1), reason, reason_len, "reason");
  });
}

pt_status pt_gemm_fp8_problem_key(const pt_tensor* a, const pt_tensor* a_scale, int32_t a_scaling,
                                  const pt_tensor* b, const pt_tensor* b_scale, int32_t b_scaling,
                                  const pt_tensor* d, float beta, int32_t flags, char* key, size_t key_len) {
  return api_guard([&] {
    const Fp8Problem p = make_fp8_problem(a, a_scale, a_scaling, b, b_scale, b_scaling, d, beta, flags);
    copy_out(p.key(), key, key_len, "key");
  });
}

pt_status pt_gemm_fp8_prepare(int32_t a_dtype, int32_t b_dtype, int32_t d_dtype, int32_t a_scaling,
                              int32_t b_scaling, int32_t config) {
  return api_guard([&] { prepare_cutlass_fp8(a_dtype, b_dtype, d_dtype, a_scaling, b_scaling, config); });
}

int32_t pt_gemm_fp8_num_configs(int32_t backend) {
  return backend == PT_BACKEND_CUTLASS ? cutlass_fp8_num_configs() : -1;
}

}  // extern "C"
