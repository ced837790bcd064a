// The JIT modules of attention: one per (dtype, head dim of q/k, head dim of v, arch), holding the
// forward and the backward.
#pragma once

#include <string>

#include "primus_turbo/kernels/attention/attention_abi.h"
#include "primus_turbo/kernels/attention/attention_fp8_abi.h"

namespace primus_turbo::attention {

struct Kernels {
  PtAttnFn forward = nullptr;
  PtAttnFn backward = nullptr;
};

// Builds or loads the module (memoized). arch is an nvcc arch such as "90a".
Kernels load_kernels(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch);

// The experimental wgmma module (kernels/attention/attn_fwd_sm90.cuh, attn_bwd_sm90.cuh: the
// forward, and the backward with its dK/dV kernel on wgmma), or null functions where it does not
// apply: only with PRIMUS_TURBO_ATTN_KERNEL=wgmma, on sm_90a, for head dims 64/64 and 128/128.
Kernels load_wgmma_kernels(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch);

// Head dims the FP8 forward (kernels/attention/attn_fwd_fp8_sm90.cuh) is built for.
bool fp8_head_dims(int64_t d, int64_t dv);

// The FP8 forward module of (dtype of the 16-bit inputs, head dims) for sm_90a (memoized).
PtAttnFp8Fn load_fp8_forward(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch);

}  // namespace primus_turbo::attention
