// The JIT modules of attention: one per (dtype, head dim of q/k, head dim of v, arch), holding the
// forward and the backward.
#pragma once

#include <string>

#include "primus_turbo/kernels/attention/attention_abi.h"

namespace primus_turbo::attention {

struct Kernels {
  PtAttnFn forward = nullptr;
  PtAttnFn backward = nullptr;
};

// Builds or loads the module (memoized). arch is an nvcc arch such as "90a".
Kernels load_kernels(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch);

// The experimental wgmma forward (kernels/attention/attn_fwd_sm90.cuh), or null where it does not
// apply: only with PRIMUS_TURBO_ATTN_FWD=wgmma, on sm_90a, for head dims 64/64 and 128/128.
PtAttnFn load_wgmma_forward(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch);

}  // namespace primus_turbo::attention
