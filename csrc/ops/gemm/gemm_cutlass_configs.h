// Heuristics for the CUTLASS GEMM: the candidate tile/cluster/schedule points autotune chooses
// from, and the one picked without autotuning. Kept apart from the launch code so that a reader
// finds "which tile" in one place.
#pragma once

#include <string>
#include <vector>

#include "ops/gemm/gemm_problem.h"

namespace primus_turbo::gemm {

struct CutlassConfig {
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  bool pingpong;
  // Tile-scheduler swizzle: a launch argument, so configs differing only here share one module.
  int swizzle = 1;
  std::string name() const;
};

// The full candidate list (also what the compile check in the tests instantiates).
const std::vector<CutlassConfig>& cutlass_candidates();
// Index of the configuration to use without autotuning.
int cutlass_default_config(const Problem& p, int sm_count);

}  // namespace primus_turbo::gemm
