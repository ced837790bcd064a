// What the GEMM plans (gemm_plan.cpp) and the FP8 GEMM plans (gemm_fp8_plan.cpp) share: the
// bound run that replays a backend's run(), the one that only clears the output of an empty
// product, and the pointer alignments a plan is made for and each run is checked against.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/error.h"
#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::gemm {

// Bound (BoundRun / Fp8BoundRun) on a backend without per-problem state: run() unchanged.
template <class Bound, class Backend, class Problem>
class ReplayRun final : public Bound {
 public:
  ReplayRun(const Backend& backend, int config) : backend_(backend), config_(config) {}
  void run(const Problem& p, void* ws, size_t ws_bytes, cudaStream_t stream) const override {
    backend_.run(p, config_, ws, ws_bytes, stream);
  }

 private:
  const Backend& backend_;
  int config_;
};

// d = beta * d when the product is empty (k == 0); beta is 0 or 1 (checked when the plan is made).
template <class Bound, class Problem>
class EmptyKRun final : public Bound {
 public:
  void run(const Problem& p, void*, size_t, cudaStream_t stream) const override {
    if (p.beta != 0.0f) return;
    const size_t esz = p.d_dtype == PT_FLOAT32 ? 4 : 2;
    PT_CHECK_CUDA(cudaMemset2DAsync(p.d, p.ldd * esz, 0, p.n * esz, p.m, stream));
  }
};

// Largest power of two (at most 256) dividing the address: what alignment-sensitive kernels see.
inline uint32_t alignment_of(const void* ptr) {
  const auto v = reinterpret_cast<uintptr_t>(ptr);
  return v == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(v & (~v + 1), 256));
}

// The alignments of the a, b and d pointers a plan was made for: a run's pointers must be at least
// as aligned (the bound kernel may rely on them).
struct PlanAlignment {
  uint32_t a = 1, b = 1, d = 1;

  static PlanAlignment of(const void* pa, const void* pb, const void* pd) {
    return {alignment_of(pa), alignment_of(pb), alignment_of(pd)};
  }
  void check(const char* fn, const void* pa, const void* pb, const void* pd) const {
    PT_CHECK_ARG(alignment_of(pa) >= a && alignment_of(pb) >= b && alignment_of(pd) >= d, fn,
                 ": pointers are less aligned than those the plan was made for (need ", a, "/", b, "/", d,
                 " bytes)");
  }
};

}  // namespace primus_turbo::gemm
