// The JIT modules of the MoE token permutation: one per (token dtype, vectorization, arch).
#pragma once

#include <string>

#include "ops/moe/permute_problem.h"

namespace primus_turbo::moe {

struct Kernels {
  PtMoePermuteFn build_map = nullptr;
  PtMoePermuteFn permute = nullptr;
  PtMoePermuteFn unpermute = nullptr;
  PtMoePermuteFn unpermute_bwd = nullptr;
  PtMoeRouteFn route_build = nullptr;
  PtMoeRouteFn rows_scatter = nullptr;
  PtMoeRouteFn rows_gather = nullptr;
};

// Builds or loads the module (memoized). arch is an nvcc arch such as "90a".
Kernels load_kernels(int32_t dtype, bool vectorized, const std::string& arch);

}  // namespace primus_turbo::moe
