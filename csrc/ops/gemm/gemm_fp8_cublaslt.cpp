// cuBLASLt FP8 backend. As in gemm_cublaslt.cpp we compute the row-major d as the column-major
// d^T = b * a^T: cuBLASLt's "A" is our b ([N, K], read transposed: TN, the only FP8 layout
// Hopper's tensor cores take) and its "B" is our a. Scales ride along with their operand; the
// 1x128 / 128x128 / outer-vector modes need cuBLAS >= 12.9.
#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/gemm/cublaslt_handle.h"
#include "ops/gemm/gemm_backend.h"
#include "ops/gemm/gemm_fp8_backend.h"
#include "runtime/device.h"

namespace primus_turbo::gemm {

namespace {

constexpr int kMaxAlgos = 8;
constexpr bool kHasScaleModes = CUBLAS_VERSION >= 120900;

cudaDataType_t cuda_type(int32_t dt) {
  switch (dt) {
    case PT_FLOAT8_E4M3: return CUDA_R_8F_E4M3;
    case PT_FLOAT8_E5M2: return CUDA_R_8F_E5M2;
    case PT_FLOAT32: return CUDA_R_32F;
    case PT_FLOAT16: return CUDA_R_16F;
    default: return CUDA_R_16BF;
  }
}

#if CUBLAS_VERSION >= 120900
int32_t scale_mode(int32_t scaling) {
  switch (scaling) {
    case PT_FP8_SCALING_ROW: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case PT_FP8_SCALING_BLOCK_1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case PT_FP8_SCALING_BLOCK_128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}
#endif

struct Descriptors {
  OwnedMatmulDesc op;
  OwnedLayout a, b, d;
  OwnedPreference pref;

  template <class V>
  void set(cublasLtMatmulDescAttributes_t attr, const V& v) {
    PT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op.value, attr, &v, sizeof(v)));
  }

  explicit Descriptors(const Fp8Problem& p) {
    PT_CHECK_CUBLAS(cublasLtMatmulDescCreate(&op.value, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.b.scale));
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.a.scale));
#if CUBLAS_VERSION >= 120900
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, scale_mode(p.b.scaling));
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, scale_mode(p.a.scaling));
#endif
    // Full FP32 accumulation unless the caller allows the fast mode; the block-scaled modes
    // require full accumulation.
    const bool blocks = p.a.scaling >= PT_FP8_SCALING_BLOCK_1x128 || p.b.scaling >= PT_FP8_SCALING_BLOCK_1x128;
    const int8_t fast_accum = p.fast_accum && !blocks ? 1 : 0;
    set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum);
    PT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&a.value, cuda_type(p.b.dtype), p.k, p.n, p.b.ld));
    PT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&b.value, cuda_type(p.a.dtype), p.k, p.m, p.a.ld));
    PT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d.value, cuda_type(p.d_dtype), p.n, p.m, p.ldd));
    PT_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref.value));
    const uint64_t ws = kWorkspaceBytes;
    PT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.value, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  }
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Reasons cuBLASLt would refuse, stated before asking its heuristic.
std::string static_rejection(const Fp8Problem& p) {
  if (p.a.dtype == PT_FLOAT8_E5M2 && p.b.dtype == PT_FLOAT8_E5M2)
    return "cuBLASLt has no E5M2 x E5M2 FP8 GEMM (one operand must be E4M3)";
  if (p.a.scaling != PT_FP8_SCALING_TENSOR && !kHasScaleModes)
    return str_cat("cuBLASLt ", CUBLAS_VERSION, " has no ", fp8_scaling_name(p.a.scaling),
                   " scaling (needs cuBLAS >= 12.9)");
  if (p.k % 16 || p.a.ld % 16 || p.b.ld % 16 || !aligned16(p.a.ptr) || !aligned16(p.b.ptr))
    return str_cat("cuBLASLt FP8 needs K and the row strides to be multiples of 16 and 16-byte "
                   "aligned operands (K=", p.k, ")");
  const bool blockwise = p.a.scaling >= PT_FP8_SCALING_BLOCK_1x128;
  if (blockwise && p.a.scaling == PT_FP8_SCALING_BLOCK_128x128 &&
      p.b.scaling == PT_FP8_SCALING_BLOCK_128x128)
    return "cuBLASLt has no 128x128 x 128x128 block-scaled GEMM (one operand must be 1x128)";
  if (blockwise && p.accumulate())
    return "cuBLASLt block-scaled GEMM does not accumulate into the output (beta != 0)";
  return "";
}

std::string heuristic_key(const Fp8Problem& p, int device) {
  return str_cat(device, "|", p.key(), "|", aligned16(p.d));
}

const std::vector<cublasLtMatmulHeuristicResult_t>& algos_for(const Fp8Problem& p, int device,
                                                               const std::string& key) {
  static std::mutex mutex;
  static std::map<std::string, std::vector<cublasLtMatmulHeuristicResult_t>> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  Descriptors desc(p);
  cublasLtMatmulHeuristicResult_t results[kMaxAlgos];
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      cublaslt_handle(device), desc.op.value, desc.a.value, desc.b.value, desc.d.value,
      desc.d.value, desc.pref.value, kMaxAlgos, results, &found);
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  if (st == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < found; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[i]);
    }
  } else if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE) {
    PT_CHECK_CUBLAS(st);
  }
  std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(key, std::move(algos)).first->second;
}

const std::vector<cublasLtMatmulHeuristicResult_t>& algos_for(const Fp8Problem& p) {
  const int device = current_device();
  return algos_for(p, device, heuristic_key(p, device));
}

// The descriptors of a problem, made once per thread and problem (a call then only points them at
// its scales): creating them is most of the host time of a small FP8 GEMM. Per thread, because a
// call rewrites the scale pointers of the shared descriptor.
const Descriptors& descriptors_for(const Fp8Problem& p, const std::string& key) {
  thread_local std::unordered_map<std::string, std::unique_ptr<Descriptors>> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= 4096) cache.clear();  // bounded under ever-new shapes (dynamic sequence lengths)
    it = cache.emplace(key, std::make_unique<Descriptors>(p)).first;
  }
  Descriptors& desc = *it->second;
  desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.b.scale));
  desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.a.scale));
  return desc;
}

// Descriptors and algorithm made once per plan. The scale pointers live in the matmul descriptor,
// so a run points it at its scales and launches under the plan's lock (plans are shared between
// threads; the lock is uncontended in practice).
class CublasLtFp8BoundRun final : public Fp8BoundRun {
 public:
  CublasLtFp8BoundRun(const Fp8Problem& p, const cublasLtMatmulHeuristicResult_t& algo, int device)
      : desc_(p), algo_(algo), handle_(cublaslt_handle(device)) {}

  void run(const Fp8Problem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) const override {
    PT_CHECK_ARG(algo_.workspaceSize <= workspace_bytes, "cuBLASLt algorithm needs ", algo_.workspaceSize,
                 " bytes of workspace, got ", workspace_bytes);
    const float alpha = 1.0f;
    std::lock_guard<std::mutex> lock(mutex_);
    desc_.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.b.scale));
    desc_.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.a.scale));
    PT_CHECK_CUBLAS(cublasLtMatmul(handle_, desc_.op.value, &alpha, p.b.ptr, desc_.a.value, p.a.ptr,
                                   desc_.b.value, &p.beta, p.d, desc_.d.value, p.d, desc_.d.value, &algo_.algo,
                                   workspace, workspace_bytes, stream));
  }

  bool needs_workspace() const override { return algo_.workspaceSize > 0; }

 private:
  mutable std::mutex mutex_;
  mutable Descriptors desc_;
  cublasLtMatmulHeuristicResult_t algo_;
  cublasLtHandle_t handle_;
};

class CublasLtFp8Backend final : public Fp8Backend {
 public:
  std::unique_ptr<Fp8BoundRun> bind(const Fp8Problem& p, int config) const override {
    const int device = current_device();
    const auto& algos = algos_for(p, device, heuristic_key(p, device));
    PT_CHECK_SUPPORTED(!algos.empty(), "cuBLASLt has no algorithm for this FP8 GEMM (", p.key(), ")");
    if (config < 0) config = 0;
    PT_CHECK_ARG(config < static_cast<int>(algos.size()), "cuBLASLt FP8 config ", config,
                 " is out of range [0, ", algos.size(), ")");
    return std::make_unique<CublasLtFp8BoundRun>(p, algos[config], device);
  }

  std::string rejection(const Fp8Problem& p) const override {
    std::string why = static_rejection(p);
    if (why.empty() && algos_for(p).empty())
      why = str_cat("cuBLASLt has no algorithm for this FP8 GEMM (", p.key(), ")");
    return why;
  }

  int num_configs(const Fp8Problem& p) const override {
    return static_cast<int>(algos_for(p).size());
  }

  void run(const Fp8Problem& p, int config, void* workspace, size_t workspace_bytes,
           cudaStream_t stream) const override {
    const std::string why = static_rejection(p);
    PT_CHECK_SUPPORTED(why.empty(), why);
    const int device = current_device();
    const std::string key = heuristic_key(p, device);
    const auto& algos = algos_for(p, device, key);
    PT_CHECK_SUPPORTED(!algos.empty(), "cuBLASLt has no algorithm for this FP8 GEMM (", p.key(), ")");
    if (config < 0) config = 0;
    PT_CHECK_ARG(config < static_cast<int>(algos.size()), "cuBLASLt FP8 config ", config,
                 " is out of range [0, ", algos.size(), ")");
    const auto& algo = algos[config];
    PT_CHECK_ARG(algo.workspaceSize <= workspace_bytes, "cuBLASLt algorithm ", config, " needs ",
                 algo.workspaceSize, " bytes of workspace, got ", workspace_bytes);
    const Descriptors& desc = descriptors_for(p, key);
    const float alpha = 1.0f;
    PT_CHECK_CUBLAS(cublasLtMatmul(cublaslt_handle(device), desc.op.value, &alpha,
                                   p.b.ptr, desc.a.value, p.a.ptr, desc.b.value, &p.beta, p.d,
                                   desc.d.value, p.d, desc.d.value, &algo.algo, workspace,
                                   workspace_bytes, stream));
  }
};

}  // namespace

const Fp8Backend& cublaslt_fp8_backend() {
  static CublasLtFp8Backend backend;
  return backend;
}

const Fp8Backend& fp8_backend_for(int32_t backend) {
  switch (backend) {
    case PT_BACKEND_CUBLASLT: return cublaslt_fp8_backend();
    case PT_BACKEND_CUTLASS: return cutlass_fp8_backend();
    default:
      PT_THROW(PT_ERROR_INVALID_ARGUMENT, "FP8 GEMM has no backend code ", backend,
               "; expected CUBLASLT or CUTLASS");
  }
}

}  // namespace primus_turbo::gemm
