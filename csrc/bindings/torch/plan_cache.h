// What the native ops with backends (GEMM, grouped GEMM) share: a thread-safe cache of per-problem
// plans, the key pieces that make a plan stale (settings epoch, backend environment variables,
// pointer alignment), and the call into the planner the Python layer registers (backend settings,
// autotune and its distributed agreement stay in Python and run once per new problem).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "bindings/torch/torch_binding.h"  // is_capturing
#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::torch_binding {

// Which problem a planner request describes (the Python planner dispatches on it).
enum PlannerOp : int32_t { kPlanGemm = 0, kPlanGroupedGemm = 1, kPlanGemmFp8 = 2, kPlanGroupedGemmFp8 = 3 };

// kPlanGemm's request; kPlanGroupedGemm's is pt_grouped_gemm_args, kPlanGroupedGemmFp8's
// pt_grouped_gemm_fp8_args.
struct GemmPlanRequest {
  const pt_tensor* a;
  const pt_tensor* b;
  const pt_tensor* d;
  int32_t trans_a;
  int32_t trans_b;
  float beta;
};

// kPlanGemmFp8's request: pt_gemm_fp8's arguments.
struct GemmFp8PlanRequest {
  const pt_tensor* a;
  const pt_tensor* a_scale;
  int32_t a_scaling;
  const pt_tensor* b;
  const pt_tensor* b_scale;
  int32_t b_scaling;
  const pt_tensor* d;
  float beta;
  int32_t flags;  // pt_gemm_fp8_flag bits
};

// 0, or a pt_status (100: TypeError) with a message.
using PlannerFn = int32_t (*)(int32_t op, const void* request, int32_t device, int32_t* backend, int32_t* config,
                              char* message, size_t message_len);

struct Choice {
  int32_t backend = 0;
  int32_t config = -1;
};

// Asks the registered planner; raises its error (or that none is registered).
Choice plan_with_python(PlannerOp op, const void* request, int32_t device, const char* context);

// Largest power of two (up to 256) dividing the address: what decides which kernels accept it.
int64_t alignment(const void* p);

struct PlanKey {
  std::vector<int64_t> v;
  std::string env;
  bool operator==(const PlanKey& o) const { return v == o.v && env == o.env; }
};

// A key with the settings epoch and the values of the environment variables that choose backends.
PlanKey plan_key(std::vector<int64_t> values, std::initializer_list<const char*> env_vars);

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const;
};

template <typename Plan>
class PlanCache {
 public:
  bool find(const PlanKey& key, Plan* plan) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(key);
    if (it == plans_.end()) return false;
    *plan = it->second;
    return true;
  }
  // Keeps plan under key unless another thread got there first; returns the one kept.
  Plan insert(const PlanKey& key, const Plan& plan) {
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.emplace(key, plan).first->second;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    plans_.clear();
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.size();
  }

 private:
  std::mutex mutex_;
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans_;
};

// The plan of a grouped GEMM: the planner's (backend, config) and the workspace it needs.
struct WorkspacePlan {
  Choice choice;
  size_t workspace_bytes = 0;
};

// The cached plan for key, else the planner's choice for `request` with its workspace size
// (workspace_size(backend, config, &bytes), a core call), cached unless made during a CUDA-graph
// capture (then it may be provisional).
template <class WorkspaceSize>
WorkspacePlan workspace_plan(PlanCache<WorkspacePlan>& cache, const PlanKey& key, PlannerOp op, const void* request,
                             int32_t device, void* stream, const char* context, WorkspaceSize&& workspace_size) {
  WorkspacePlan plan;
  if (cache.find(key, &plan)) return plan;
  plan.choice = plan_with_python(op, request, device, context);
  check_status(workspace_size(plan.choice.backend, plan.choice.config, &plan.workspace_bytes), context);
  return is_capturing(stream) ? plan : cache.insert(key, plan);
}

// The plan's workspace from torch's caching allocator (graph-safe, freed stream-ordered after the
// launch); at least one byte.
inline Tensor plan_workspace(const WorkspacePlan& plan, int32_t device) {
  return empty({static_cast<int64_t>(plan.workspace_bytes ? plan.workspace_bytes : 1)}, ScalarType::Byte, device);
}

// A core plan handle (pt_gemm_plan, pt_gemm_fp8_plan) and its destroy function, owning.
template <class Plan>
using OwnedPlan = std::unique_ptr<std::remove_pointer_t<Plan>, void (*)(Plan)>;

// The plan for key: the cached one, else make()'s. A plan made during CUDA-graph capture may rest
// on a provisional choice, and past max_cached problems (ever-new shapes) the cache stops growing:
// such a plan goes to `owned`, used for this call and then destroyed (a launch keeps nothing of it).
template <class Plan, class Make>
Plan cached_plan(PlanCache<Plan>& cache, const PlanKey& key, void* stream, OwnedPlan<Plan>& owned, Make&& make,
                 size_t max_cached = std::numeric_limits<size_t>::max()) {
  Plan plan = nullptr;
  if (cache.find(key, &plan)) return plan;
  plan = make();
  if (is_capturing(stream) || cache.size() >= max_cached) {
    owned.reset(plan);
    return plan;
  }
  const Plan kept = cache.insert(key, plan);
  if (kept != plan) owned.reset(plan);  // another thread's plan was kept: this one goes
  return kept;
}

}  // namespace primus_turbo::torch_binding
