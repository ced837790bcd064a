// What the FP8 GEMM dispatcher asks of each implementation (the FP8 twin of gemm_backend.h).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "ops/gemm/gemm_fp8_problem.h"

namespace primus_turbo::gemm {

// One config bound to one FP8 problem (sizes, dtypes, scalings, strides, alignment): runs it on
// new data and scale pointers with no re-validation, keeping the backend's per-problem state.
class Fp8BoundRun {
 public:
  virtual ~Fp8BoundRun() = default;
  virtual void run(const Fp8Problem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) const = 0;
  // Whether a run reads its workspace (cuBLASLt: the algorithm says; otherwise assumed).
  virtual bool needs_workspace() const { return true; }
};

class Fp8Backend {
 public:
  virtual ~Fp8Backend() = default;
  // Empty when accepted; otherwise the reason, in words.
  virtual std::string rejection(const Fp8Problem& p) const = 0;
  virtual int num_configs(const Fp8Problem& p) const = 0;
  virtual void run(const Fp8Problem& p, int config, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream) const = 0;
  // Accepted problem -> a reusable run (rejection() is checked by the caller). The default replays
  // run() unchanged.
  virtual std::unique_ptr<Fp8BoundRun> bind(const Fp8Problem& p, int config) const;
};

const Fp8Backend& cublaslt_fp8_backend();
const Fp8Backend& cutlass_fp8_backend();
// Builds (or loads) the CUTLASS module of one kernel point without a GPU (compile checks, warm-up).
void prepare_cutlass_fp8(int32_t a_dtype, int32_t b_dtype, int32_t d_dtype, int32_t a_scaling,
                         int32_t b_scaling, int config);
int cutlass_fp8_num_configs();
// Throws PT_ERROR_INVALID_ARGUMENT for a backend code that is not a GEMM backend.
const Fp8Backend& fp8_backend_for(int32_t backend);

}  // namespace primus_turbo::gemm
