// FP8 GEMM plans: a problem validated and bound to one backend config once, then run on new data
// and scale pointers with nothing but an alignment check per call (the FP8 twin of gemm_plan.cpp;
// the per-call path of the native FP8 ops).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/gemm/gemm_fp8_backend.h"
#include "ops/gemm/plan_runs.h"

using namespace primus_turbo;
using namespace primus_turbo::gemm;

namespace primus_turbo::gemm {

std::unique_ptr<Fp8BoundRun> Fp8Backend::bind(const Fp8Problem&, int config) const {
  return std::make_unique<ReplayRun<Fp8BoundRun, Fp8Backend, Fp8Problem>>(*this, config);
}

}  // namespace primus_turbo::gemm

struct pt_gemm_fp8_plan_s {
  Fp8Problem problem;  // pointers replaced per run
  std::unique_ptr<Fp8BoundRun> bound;  // null when the output is empty
  PlanAlignment align;
};

extern "C" {

pt_status pt_gemm_fp8_plan_create(const pt_tensor* a, const pt_tensor* a_scale, int32_t a_scaling,
                                  const pt_tensor* b, const pt_tensor* b_scale, int32_t b_scaling,
                                  const pt_tensor* d, float beta, int32_t flags, int32_t backend,
                                  int32_t config, pt_gemm_fp8_plan* plan) {
  return api_guard([&] {
    PT_CHECK_ARG(plan != nullptr, "pt_gemm_fp8_plan_create: 'plan' must not be null");
    *plan = nullptr;
    auto out = std::make_unique<pt_gemm_fp8_plan_s>();
    out->problem = make_fp8_problem(a, a_scale, a_scaling, b, b_scale, b_scaling, d, beta, flags);
    const Fp8Problem& p = out->problem;
    const Fp8Backend& be = fp8_backend_for(backend);
    out->align = PlanAlignment::of(p.a.ptr, p.b.ptr, p.d);
    if (p.m > 0 && p.n > 0) {
      if (p.k == 0) {
        PT_CHECK_SUPPORTED(p.beta == 0.0f || p.beta == 1.0f, "FP8 GEMM with K == 0 supports beta 0 or 1");
        out->bound = std::make_unique<EmptyKRun<Fp8BoundRun, Fp8Problem>>();
      } else {
        const std::string why = be.rejection(p);
        PT_CHECK_SUPPORTED(why.empty(), why);
        out->bound = be.bind(p, config);
      }
    }
    *plan = out.release();
  });
}

pt_status pt_gemm_fp8_plan_run(pt_gemm_fp8_plan plan, const void* a, const void* a_scale, const void* b,
                               const void* b_scale, void* d, void* workspace, size_t workspace_bytes,
                               void* stream) {
  return api_guard([&] {
    PT_CHECK_ARG(plan != nullptr, "pt_gemm_fp8_plan_run: 'plan' must not be null");
    if (!plan->bound) return;
    plan->align.check("pt_gemm_fp8_plan_run", a, b, d);
    PT_CHECK_ARG(a_scale != nullptr && b_scale != nullptr, "pt_gemm_fp8_plan_run: the scales must not be null");
    Fp8Problem p = plan->problem;
    p.a.ptr = a;
    p.a.scale = static_cast<const float*>(a_scale);
    p.b.ptr = b;
    p.b.scale = static_cast<const float*>(b_scale);
    p.d = d;
    plan->bound->run(p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
  });
}

int32_t pt_gemm_fp8_plan_needs_workspace(pt_gemm_fp8_plan plan) {
  return plan != nullptr && plan->bound && plan->bound->needs_workspace() ? 1 : 0;
}

void pt_gemm_fp8_plan_destroy(pt_gemm_fp8_plan plan) { delete plan; }

}  // extern "C"
