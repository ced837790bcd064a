// C API entry points of the grouped GEMM: argument checks, the trivial cases, then CUTLASS.
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/grouped_gemm/grouped_gemm_configs.h"
#include "ops/grouped_gemm/grouped_gemm_kernels.h"
#include "primus_turbo/grouped_gemm.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::grouped_gemm;

namespace {

void check_backend(int32_t backend) {
  PT_CHECK_ARG(backend == PT_BACKEND_CUTLASS, "grouped GEMM has no backend code ", backend,
               "; expected CUTLASS");
}

int resolve_config(const Problem& p, int32_t config) {
  return config < 0 ? default_config(p, p.sm_budget(device_info(current_device()).sm_count)) : config;
}

// Nothing for a kernel to do: an empty output, or an empty reduction (zeros).
bool is_trivial(const Problem& p) {
  return p.n == 0 || p.k == 0 || p.rows == 0;
}

void run_trivial(const Problem& p, cudaStream_t stream) {
  // Forward: no rows or columns means an empty output; K == 0 means zeros. Wgrad: no rows means
  // every group is empty, so d is zero; N or K == 0 means an empty d.
  const int64_t elems = p.wgrad ? p.groups * p.n * p.k : p.rows * p.n;
  if (elems > 0) PT_CHECK_CUDA(cudaMemsetAsync(p.d, 0, elems * 2, stream));
}

}  // namespace

extern "C" {

pt_status pt_grouped_gemm(const pt_grouped_gemm_args* args, int32_t backend, int32_t config,
                          void* workspace, size_t workspace_bytes, void* stream) {
  return api_guard([&] {
    const Problem p = make_problem(args);
    check_backend(backend);
    auto s = static_cast<cudaStream_t>(stream);
    if (is_trivial(p)) return run_trivial(p, s);
    run(p, resolve_config(p, config), workspace, workspace_bytes, s);
  });
}

pt_status pt_grouped_gemm_query(const pt_grouped_gemm_args* args, int32_t backend,
                                int32_t* accepted, int32_t* num_configs, char* reason,
                                size_t reason_len) {
  return api_guard([&] {
    PT_CHECK_ARG(accepted && num_configs, "pt_grouped_gemm_query: output pointers are null");
    const Problem p = make_problem(args);
    std::string why;
    if (backend != PT_BACKEND_CUTLASS) {
      why = str_cat("backend ", backend, " has no grouped GEMM; CUTLASS does");
    } else if (!is_trivial(p)) {
      why = rejection(p);
    }
    *accepted = why.empty();
    *num_configs = why.empty() && !is_trivial(p) ? static_cast<int32_t>(candidates().size()) : 0;
    if (reason && reason_len) copy_out(why.substr(0, reason_len - 1), reason, reason_len, "reason");
  });
}

pt_status pt_grouped_gemm_workspace_size(const pt_grouped_gemm_args* args, int32_t backend,
                                         int32_t config, size_t* bytes) {
  return api_guard([&] {
    PT_CHECK_ARG(bytes != nullptr, "pt_grouped_gemm_workspace_size: 'bytes' is null");
    const Problem p = make_problem(args);
    check_backend(backend);
    *bytes = is_trivial(p) ? 0 : workspace_bytes(p, resolve_config(p, config));
  });
}

pt_status pt_grouped_gemm_prepare(const pt_grouped_gemm_args* args, int32_t backend,
                                  int32_t config) {
  return api_guard([&] {
    const Problem p = make_problem(args);
    check_backend(backend);
    prepare(p, config < 0 ? 0 : config);
  });
}

pt_status pt_grouped_gemm_config_name(const pt_grouped_gemm_args* args, int32_t backend,
                                      int32_t config, char* name, size_t name_len) {
  return api_guard([&] {
    const Problem p = make_problem(args);
    check_backend(backend);
    const int c = resolve_config(p, config);
    PT_CHECK_ARG(c >= 0 && c < static_cast<int>(candidates().size()), "grouped GEMM config ", c,
                 " is out of range");
    copy_out(str_cat("cutlass_", candidates()[c].name()), name, name_len, "name");
  });
}

pt_status pt_grouped_gemm_problem_key(const pt_grouped_gemm_args* args, char* key,
                                      size_t key_len) {
  return api_guard([&] {
    const Problem p = make_problem(args);
    copy_out(str_cat("M", p.rows, "xN", p.n, "xK", p.k, "xG", p.groups, "|", dtype_name(p.dtype),
                     "|", p.wgrad ? "wgrad" : "fwd", "|", p.layout_code(), "|align",
                     p.aligned16 ? 16 : 0, p.group_offs ? "|offs" : "", p.num_sms > 0 ? str_cat("|sms", p.num_sms) : ""),
             key, key_len, "key");
  });
}

int32_t pt_grouped_gemm_num_configs(int32_t backend) {
  return backend == PT_BACKEND_CUTLASS ? static_cast<int32_t>(candidates().size()) : -1;
}

}  // extern "C"
