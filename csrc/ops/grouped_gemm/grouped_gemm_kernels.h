// The CUTLASS grouped GEMM: its candidate configurations, the default pick, and the JIT modules
// that instantiate kernels/grouped_gemm/cutlass_grouped_gemm_sm90.cuh.
#pragma once

#include <cuda_runtime_api.h>

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
// Empty when the CUTLASS kernels accept the problem; otherwise why not.
std::string rejection(const Problem& p);

size_t workspace_bytes(const Problem& p, int config);
void prepare(const Problem& p, int config);
void run(const Problem& p, int config, void* workspace, size_t workspace_bytes,
         cudaStream_t stream);

}  // namespace primus_turbo::grouped_gemm
