// The JIT modules of RMSNorm: one per (x dtype, gamma dtype, vectorization, hidden specialization,
// arch), each exporting the forward and the backward (kernels/normalization/rmsnorm.cuh).
#pragma once

#include <string>

#include "ops/normalization/rmsnorm_problem.h"
#include "primus_turbo/kernels/jit_abi.h"

namespace primus_turbo::rmsnorm {

struct Kernels {
  PtRmsNormFwdFn forward = nullptr;
  PtRmsNormBwdFn backward = nullptr;
};

// Builds or loads the module for p (memoized: after the first call, one map lookup). arch is an
// nvcc arch such as "90a".
Kernels load_kernels(const Problem& p, const std::string& arch);

// The nvcc arch to build for on a device (sm_90a on Hopper, the plain compute capability elsewhere).
std::string arch_for_device(int device);

}  // namespace primus_turbo::rmsnorm
