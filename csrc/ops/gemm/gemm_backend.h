// What the GEMM dispatcher asks of each implementation. A backend says whether it accepts a
// problem (and why not), offers a list of configurations for autotune, and runs one of them.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "ops/gemm/gemm_problem.h"

namespace primus_turbo::gemm {

// One config bound to one problem's shape, layout, dtypes and alignment: runs it on new pointers
// with no re-validation and with the backend's per-problem state (descriptors, kernel) kept.
class BoundRun {
 public:
  virtual ~BoundRun() = default;
  virtual void run(const Problem& p, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream) const = 0;
  // Whether a run reads its workspace (cuBLASLt: the algorithm says; otherwise assumed).
  virtual bool needs_workspace() const { return true; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Empty when accepted; otherwise the reason, in words.
  virtual std::string rejection(const Problem& p) const = 0;
  virtual int num_configs(const Problem& p) const = 0;
  // The configuration the backend picks without autotuning.
  virtual int default_config(const Problem& p) const = 0;
  virtual std::string config_name(const Problem& p, int config) const = 0;
  // Make config ready to run (e.g. compile its kernel) without touching any stream.
  virtual void prepare(const Problem& p, int config) const { (void)p, (void)config; }
  virtual void run(const Problem& p, int config, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream) const = 0;
  // Validated, accepted problem -> a reusable run. The default replays run() unchanged.
  virtual std::unique_ptr<BoundRun> bind(const Problem& p, int config) const;
  virtual bool needs_workspace() const { return false; }
};

const Backend& cublaslt_backend();
const Backend& cutlass_backend();
// Throws PT_ERROR_INVALID_ARGUMENT for a backend that does not implement GEMM.
const Backend& backend_for(int32_t backend);

// cuBLASLt's recommended workspace on Hopper; the binding allocates it per call.
constexpr size_t kWorkspaceBytes = 32u << 20;

}  // namespace primus_turbo::gemm
