// Heuristics for the CUTLASS grouped GEMM: the candidate tile/cluster/schedule points autotune
// chooses from, and the one picked without autotuning.
#pragma once

#include <string>
#include <vector>

#include "ops/grouped_gemm/grouped_gemm_problem.h"

namespace primus_turbo::grouped_gemm {

struct Config {
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  bool pingpong;
  std::string name() const;
};

// Bounded on purpose: every config is one module per (dtype, layout), about a minute to compile.
const std::vector<Config>& candidates();
int default_config(const Problem& p, int sm_count);

}  // namespace primus_turbo::grouped_gemm
