// The JIT modules of attention: per (dtype, head dim of q/k, head dim of v, arch), the mma.sync
// module (forward and backward, any GPU), the sm90 forward and backward; the FP8 forward and backward.
#pragma once

#include <string>

#include "primus_turbo/kernels/attention/attention_abi.h"
#include "primus_turbo/kernels/attention/attention_fp8_abi.h"
#include "primus_turbo/kernels/attention/attention_fp8_bwd_abi.h"

namespace primus_turbo::attention {

struct Kernels {
  PtAttnFn forward = nullptr;
  PtAttnFn backward = nullptr;
};

// Builds or loads the module (memoized). arch is an nvcc arch such as "90a".
Kernels load_kernels(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch);

// The warp-specialized forward on sm_90a (kernels/attention/attn_fwd_sm90.cuh), memoized; null
// elsewhere, or with PRIMUS_TURBO_ATTN_KERNEL=mma (the mma.sync forward of load_kernels).
PtAttnFn load_sm90_forward(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch);

// Head dims the sm90 backward is built for: 64, 96 and 128 for both, 192 for q/k with 128 for v.
bool sm90_backward_head_dims(int64_t d, int64_t dv);

// Head dims whose sm90 backward can fuse dQ into its dK/dV kernel (attn_bwd_sm90.cuh's
// sm90_fused_dq_dims): 128 for q/k and v.
bool sm90_fused_dq_head_dims(int64_t d, int64_t dv);

// The wgmma backward on sm_90a (kernels/attention/attn_bwd_sm90.cuh) for those head dims,
// memoized; null elsewhere, or with PRIMUS_TURBO_ATTN_KERNEL=mma.
PtAttnFn load_sm90_backward(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch);

// Head dims the FP8 forward (kernels/attention/attn_fwd_fp8_sm90.cuh) is built for.
bool fp8_head_dims(int64_t d, int64_t dv);

// The FP8 forward module of (dtype of the 16-bit inputs, head dims) for sm_90a (memoized).
PtAttnFp8Fn load_fp8_forward(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch);

// Head dims the FP8 backward (kernels/attention/attn_bwd_fp8_sm90.cuh) is built for: 64, 96, 128
// for q/k and v alike.
bool fp8_backward_head_dims(int64_t d, int64_t dv);

// The FP8 backward module of (dtype of the 16-bit operands, head dims) for sm_90a (memoized).
PtAttnFp8BwdFn load_fp8_backward(int32_t dtype, int32_t head_dim, int32_t head_dim_v, const std::string& arch);

}  // namespace primus_turbo::attention
