// GEMM plans: a problem validated and bound to one backend config once, then run on new pointers
// with nothing but an alignment check per call. This is the per-call path of the Python binding's
// plan cache; pt_gemm stays the general entry point.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/gemm/gemm_backend.h"
#include "ops/gemm/plan_runs.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::gemm;

namespace primus_turbo::gemm {

std::unique_ptr<BoundRun> Backend::bind(const Problem&, int config) const {
  return std::make_unique<ReplayRun<BoundRun, Backend, Problem>>(*this, config);
}

}  // namespace primus_turbo::gemm

struct pt_gemm_plan_s {
  Problem problem;  // pointers replaced per run
  std::unique_ptr<BoundRun> bound;  // null when the output is empty
  bool needs_workspace = false;
  PlanAlignment align;
};

extern "C" {

pt_status pt_gemm_plan_create(const pt_tensor* a, const pt_tensor* b, const pt_tensor* d,
                              int32_t trans_a, int32_t trans_b, float alpha, float beta,
                              int32_t backend, int32_t config, pt_gemm_plan* plan) {
  return api_guard([&] {
    PT_CHECK_ARG(plan != nullptr, "pt_gemm_plan_create: 'plan' must not be null");
    *plan = nullptr;
    auto out = std::make_unique<pt_gemm_plan_s>();
    out->problem = make_problem(a, b, d, trans_a, trans_b, alpha, beta);
    const Problem& p = out->problem;
    const Backend& be = backend_for(backend);
    out->align = PlanAlignment::of(p.a.ptr, p.b.ptr, p.d);
    if (p.m > 0 && p.n > 0) {
      if (p.k == 0) {
        PT_CHECK_SUPPORTED(p.beta == 0.0f || p.beta == 1.0f,
                           "GEMM with k == 0 supports beta 0 or 1, got ", p.beta);
        out->bound = std::make_unique<EmptyKRun<BoundRun, Problem>>();
      } else {
        const std::string why = be.rejection(p);
        PT_CHECK_SUPPORTED(why.empty(), why);
        out->bound = be.bind(p, config < 0 ? be.default_config(p) : config);
        out->needs_workspace = be.needs_workspace() && out->bound->needs_workspace();
      }
    }
    *plan = out.release();
  });
}

pt_status pt_gemm_plan_run(pt_gemm_plan plan, const void* a, const void* b, void* d,
                           void* workspace, size_t workspace_bytes, void* stream) {
  return api_guard([&] {
    PT_CHECK_ARG(plan != nullptr, "pt_gemm_plan_run: 'plan' must not be null");
    if (!plan->bound) return;
    plan->align.check("pt_gemm_plan_run", a, b, d);
    Problem p = plan->problem;
    p.a.ptr = a;
    p.b.ptr = b;
    p.d = d;
    plan->bound->run(p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
  });
}

int32_t pt_gemm_plan_needs_workspace(pt_gemm_plan plan) {
  return plan != nullptr && plan->needs_workspace ? 1 : 0;
}

void pt_gemm_plan_destroy(pt_gemm_plan plan) { delete plan; }

}  // extern "C"
