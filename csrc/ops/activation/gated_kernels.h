// The JIT modules of the gated activations: one per (activation, dtype, vectorization, arch), each
// exporting the forward and the backward (kernels/activation/gated.cuh). The row length is a
// runtime argument: a handful of modules serve every shape.
#pragma once

#include <string>

#include "ops/activation/gated_problem.h"
#include "primus_turbo/kernels/jit_abi.h"

namespace primus_turbo::gated {

struct Kernels {
  PtGatedActFn forward = nullptr;
  PtGatedActFn backward = nullptr;
};

// Builds or loads the module for p (memoized).
Kernels load_kernels(const Problem& p, const std::string& arch);

}  // namespace primus_turbo::gated
