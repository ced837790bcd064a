// The JIT modules of the normalizations: one per (kind, x dtype, gamma dtype, vectorization, hidden
// specialization, arch), each exporting the forward and the backward
// (kernels/normalization/norm.cuh); FP8-output variants (Problem::fp8) export only the forward.
#pragma once

#include <string>

#include "ops/normalization/norm_problem.h"
#include "primus_turbo/kernels/jit_abi.h"

namespace primus_turbo::norm {

struct Kernels {
  PtNormFwdFn forward = nullptr;
  PtNormBwdFn backward = nullptr;
};

// Builds or loads the module for p (memoized: after the first call, one map lookup). arch is an
// nvcc arch such as "90a".
Kernels load_kernels(const Problem& p, const std::string& arch);

}  // namespace primus_turbo::norm
