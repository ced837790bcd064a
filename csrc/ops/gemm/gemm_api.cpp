// C API entry points of the GEMM family: argument checks, the trivial cases, then the backend.
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/gemm/gemm_backend.h"
#include "ops/gemm/gemm_cutlass_configs.h"

using namespace primus_turbo;
using namespace primus_turbo::gemm;

namespace {

int resolve_config(const Backend& be, const Problem& p, int32_t config) {
  return config < 0 ? be.default_config(p) : config;
}

// k == 0: the product is empty, so d = beta * d. Only beta in {0, 1} is meaningful here.
void run_empty_k(const Problem& p, cudaStream_t stream) {
  PT_CHECK_SUPPORTED(p.beta == 0.0f || p.beta == 1.0f, "GEMM with k == 0 supports beta 0 or 1, got ",
                     p.beta);
  if (p.beta == 1.0f) return;
  const size_t esz = p.d_dtype == PT_FLOAT32 ? 4 : 2;
  PT_CHECK_CUDA(cudaMemset2DAsync(p.d, p.ldd * esz, 0, p.n * esz, p.m, stream));
}

}  // namespace

extern "C" {

pt_status pt_gemm(const pt_tensor* a, const pt_tensor* b, pt_tensor* d, int32_t trans_a,
                  int32_t trans_b, float alpha, float beta, int32_t backend, int32_t config,
                  void* workspace, size_t workspace_bytes, void* stream) {
  return api_guard([&] {
    const Problem p = make_problem(a, b, d, trans_a, trans_b, alpha, beta);
    const Backend& be = backend_for(backend);
    auto s = static_cast<cudaStream_t>(stream);
    if (p.m == 0 || p.n == 0) return;
    if (p.k == 0) return run_empty_k(p, s);
    const std::string why = be.rejection(p);
    PT_CHECK_SUPPORTED(why.empty(), why);
    be.run(p, resolve_config(be, p, config), workspace, workspace_bytes, s);
  });
}

pt_status pt_gemm_query(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d,
                        int32_t trans_a, int32_t trans_b, float beta, int32_t backend,
                        int32_t* accepted, int32_t* num_configs, char* reason, size_t reason_len) {
  return api_guard([&] {
    PT_CHECK_ARG(accepted && num_configs, "pt_gemm_query: output pointers must not be null");
    const Problem p = make_problem(a, b, d, trans_a, trans_b, 1.0f, beta);
    const Backend& be = backend_for(backend);
    std::string why = (p.m == 0 || p.n == 0 || p.k == 0) ? "" : be.rejection(p);
    *accepted = why.empty();
    *num_configs = 0;
    if (why.empty() && p.m > 0 && p.n > 0 && p.k > 0) *num_configs = be.num_configs(p);
    if (reason && reason_len) copy_out(why.substr(0, reason_len - 1), reason, reason_len, "reason");
  });
}

int32_t pt_gemm_num_configs(int32_t backend) {
  int32_t n = -1;
  api_guard([&] {
    if (backend == PT_BACKEND_CUTLASS) n = static_cast<int32_t>(cutlass_candidates().size());
  });
  return n;
}

pt_status pt_gemm_config_name(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d,
                              int32_t trans_a, int32_t trans_b, float beta, int32_t backend,
                              int32_t config, char* name, size_t name_len) {
  return api_guard([&] {
    const Problem p = make_problem(a, b, d, trans_a, trans_b, 1.0f, beta);
    const Backend& be = backend_for(backend);
    copy_out(be.config_name(p, resolve_config(be, p, config)), name, name_len, "name");
  });
}

pt_status pt_gemm_prepare(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d,
                          int32_t trans_a, int32_t trans_b, float beta, int32_t backend,
                          int32_t config) {
  return api_guard([&] {
    const Problem p = make_problem(a, b, d, trans_a, trans_b, 1.0f, beta);
    const Backend& be = backend_for(backend);
    be.prepare(p, resolve_config(be, p, config));
  });
}

pt_status pt_gemm_problem_key(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d,
                              int32_t trans_a, int32_t trans_b, float beta, char* key,
                              size_t key_len) {
  return api_guard([&] {
    const Problem p = make_problem(a, b, d, trans_a, trans_b, 1.0f, beta);
    copy_out(str_cat(p.m, "x", p.n, "x", p.k, "|", dtype_name(p.ab_dtype), ">",
                     dtype_name(p.d_dtype), "|", p.layout_code(), "|align",
                     p.a.aligned16 && p.b.aligned16 && p.d_aligned16 ? 16 : 0,
                     p.accumulate() ? "|accumulate" : ""),
             key, key_len, "key");
  });
}

size_t pt_gemm_workspace_bytes(void) { return kWorkspaceBytes; }

}  // extern "C"
