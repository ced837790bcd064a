// The CUTLASS grouped GEMM launch: which problems it accepts, and the JIT modules that instantiate
// kernels/grouped_gemm/cutlass_grouped_gemm_sm90.cuh for one (dtype, layout, config).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "ops/grouped_gemm/grouped_gemm_problem.h"

namespace primus_turbo::grouped_gemm {

// Empty when the CUTLASS kernels accept the problem; otherwise why not.
std::string rejection(const Problem& p);

size_t workspace_bytes(const Problem& p, int config);
void prepare(const Problem& p, int config);
void run(const Problem& p, int config, void* workspace, size_t workspace_bytes,
         cudaStream_t stream);

}  // namespace primus_turbo::grouped_gemm
