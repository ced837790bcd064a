// cuBLASLt backend. cuBLASLt is column-major, our output is row-major: we compute
// D^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m), which reads the same memory with no copies.
// Configurations are cuBLASLt's own heuristic candidates for the problem (best first), cached
// per problem so the heuristic query runs once per shape.
#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/gemm/cublaslt_handle.h"
#include "ops/gemm/gemm_backend.h"
#include "runtime/device.h"

namespace primus_turbo::gemm {

namespace {

constexpr int kMaxAlgos = 8;

cudaDataType_t to_cuda_type(int32_t dt) {
  switch (dt) {
    case PT_FLOAT32: return CUDA_R_32F;
    case PT_FLOAT16: return CUDA_R_16F;
    case PT_BFLOAT16: return CUDA_R_16BF;
    default: PT_THROW(PT_ERROR_NOT_SUPPORTED, "cuBLASLt GEMM: unsupported dtype code ", dt);
  }
}


uint32_t ptr_alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

cublasLtHandle_t handle_for(int device) { return cublaslt_handle(device); }

// The descriptors of one call. Built per call: they are small host objects.
struct Descriptors {
  OwnedMatmulDesc op;
  OwnedLayout a, b, d;
  OwnedPreference pref;

  explicit Descriptors(const Problem& p) {
    const cudaDataType_t ab = to_cuda_type(p.ab_dtype), dt = to_cuda_type(p.d_dtype);
    PT_CHECK_CUBLAS(cublasLtMatmulDescCreate(&op.value, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // cuBLASLt's "A" is op(B)^T (n x k); its "B" is op(A)^T (k x m).
    const cublasOperation_t ta = p.b.k_major ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = p.a.k_major ? CUBLAS_OP_N : CUBLAS_OP_T;
    PT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op.value, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    PT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op.value, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const uint64_t n = p.n, m = p.m, k = p.k;
    PT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&a.value, ab, p.b.k_major ? k : n,
                                               p.b.k_major ? n : k, p.b.ld));
    PT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&b.value, ab, p.a.k_major ? k : m,
                                               p.a.k_major ? m : k, p.a.ld));
    PT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d.value, dt, n, m, p.ldd));
    PT_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref.value));
    const uint64_t ws = kWorkspaceBytes;
    PT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.value, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t al_a = ptr_alignment(p.b.ptr), al_b = ptr_alignment(p.a.ptr),
                   al_d = ptr_alignment(p.d);
    PT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.value, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
    PT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.value, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
    PT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.value, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
    PT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.value, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
  }
};

std::string heuristic_key(const Problem& p, int device) {
  return str_cat(device, "|", p.m, "x", p.n, "x", p.k, "|", p.ab_dtype, ">", p.d_dtype, "|",
                 p.layout_code(), "|", p.a.ld, ",", p.b.ld, ",", p.ldd, "|",
                 ptr_alignment(p.a.ptr), ",", ptr_alignment(p.b.ptr), ",", ptr_alignment(p.d),
                 "|", p.accumulate());
}

// Heuristic candidates for a problem, queried once and remembered.
const std::vector<cublasLtMatmulHeuristicResult_t>& algos_for(const Problem& p) {
  static std::mutex mutex;
  static std::map<std::string, std::vector<cublasLtMatmulHeuristicResult_t>> cache;
  const int device = current_device();
  const std::string key = heuristic_key(p, device);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  Descriptors desc(p);
  cublasLtMatmulHeuristicResult_t results[kMaxAlgos];
  int found = 0;
  PT_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle_for(device), desc.op.value, desc.a.value,
                                                 desc.b.value, desc.d.value, desc.d.value,
                                                 desc.pref.value, kMaxAlgos, results, &found));
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[i]);
  }
  PT_CHECK_SUPPORTED(!algos.empty(), "cuBLASLt has no algorithm for this GEMM (",
                     p.m, "x", p.n, "x", p.k, ", ", p.layout_code(), ")");
  std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(key, std::move(algos)).first->second;
}

// Descriptors and algorithm made once per plan: a run is one cublasLtMatmul.
class CublasLtBoundRun final : public BoundRun {
 public:
  CublasLtBoundRun(const Problem& p, const cublasLtMatmulHeuristicResult_t& algo)
      : desc_(p), algo_(algo), handle_(handle_for(current_device())) {}

  void run(const Problem& p, void* workspace, size_t workspace_bytes,
           cudaStream_t stream) const override {
    PT_CHECK_ARG(algo_.workspaceSize <= workspace_bytes, "cuBLASLt algorithm needs ",
                 algo_.workspaceSize, " bytes of workspace, got ", workspace_bytes);
    PT_CHECK_CUBLAS(cublasLtMatmul(handle_, desc_.op.value, &p.alpha, p.b.ptr, desc_.a.value,
                                   p.a.ptr, desc_.b.value, &p.beta, p.d, desc_.d.value, p.d,
                                   desc_.d.value, &algo_.algo, workspace, workspace_bytes,
                                   stream));
  }

  bool needs_workspace() const override { return algo_.workspaceSize > 0; }

 private:
  Descriptors desc_;
  cublasLtMatmulHeuristicResult_t algo_;
  cublasLtHandle_t handle_;
};

class CublasLtBackend final : public Backend {
 public:
  std::string rejection(const Problem&) const override { return ""; }

  int num_configs(const Problem& p) const override {
    return static_cast<int>(algos_for(p).size());
  }

  int default_config(const Problem&) const override { return 0; }

  bool needs_workspace() const override { return true; }

  std::unique_ptr<BoundRun> bind(const Problem& p, int config) const override {
    check_config(p, config);
    return std::make_unique<CublasLtBoundRun>(p, algos_for(p)[config]);
  }

  std::string config_name(const Problem& p, int config) const override {
    check_config(p, config);
    return str_cat("cublaslt_heuristic_", config);
  }

  void run(const Problem& p, int config, void* workspace, size_t workspace_bytes,
           cudaStream_t stream) const override {
    const auto& algos = algos_for(p);
    check_config(p, config);
    const auto& algo = algos[config];
    PT_CHECK_ARG(algo.workspaceSize <= workspace_bytes, "cuBLASLt algorithm ", config, " needs ",
                 algo.workspaceSize, " bytes of workspace, got ", workspace_bytes);
    Descriptors desc(p);
    PT_CHECK_CUBLAS(cublasLtMatmul(handle_for(current_device()), desc.op.value, &p.alpha, p.b.ptr,
                                   desc.a.value, p.a.ptr, desc.b.value, &p.beta, p.d,
                                   desc.d.value, p.d, desc.d.value, &algo.algo, workspace,
                                   workspace_bytes, stream));
  }

 private:
  void check_config(const Problem& p, int config) const {
    const int n = num_configs(p);
    PT_CHECK_ARG(config >= 0 && config < n, "cuBLASLt config ", config, " is out of range [0, ",
                 n, ") for this problem");
  }
};

}  // namespace

cublasLtHandle_t cublaslt_handle(int device) {
  static std::mutex mutex;
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t h;
  PT_CHECK_CUBLAS(cublasLtCreate(&h));
  handles.emplace(device, h);
  return h;
}

const Backend& cublaslt_backend() {
  static CublasLtBackend backend;
  return backend;
}

}  // namespace primus_turbo::gemm
