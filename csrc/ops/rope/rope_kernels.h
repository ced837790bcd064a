// The JIT modules of RoPE: one per (dtype, vectorization, pair layout, cos/sin source, arch).
#pragma once

#include <string>

#include "ops/rope/rope_problem.h"

namespace primus_turbo::rope {

// Builds or loads the module for p (memoized). arch is an nvcc arch such as "90a".
PtRopeFn load_kernel(const Problem& p, const std::string& arch);

}  // namespace primus_turbo::rope
