// One attention JIT module: (dtype, head dim of q/k, head dim of v). Its host side picks the tile
// shapes of each kernel for the head dims, checks the launch limits, and issues the launches of
// the forward (one kernel) and of the backward (delta, dK/dV, dQ, and dsink with a sink).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#include "primus_turbo/kernels/attention/attn_bwd.cuh"
#include "primus_turbo/kernels/attention/attn_fwd.cuh"
#include "primus_turbo/kernels/common/smem_opt_in.cuh"
#include "primus_turbo/kernels/common/warp.cuh"  // report_launch
#include "primus_turbo/kernels/jit_export.cuh"

namespace primus_turbo::kernels::attention {

// +inf into x[0, n): the log-sum-exp of packed rows outside every sequence, the value of a row that
// sees no key (what the kernels write for such a row inside a sequence, and cuDNN's path too).
__global__ void __launch_bounds__(256) fill_inf_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = INFINITY;
}

template <class T, int kD, int kDV>
struct Attention {
  static_assert(kD % 16 == 0 && kDV % 16 == 0 && kD <= 256 && kDV <= 256, "head dims");
  // Forward: 4 warps of 32 rows (128 rows) while the accumulators leave room, else of 16 rows.
  static constexpr int kFwdWarps = 4;
  static constexpr int kFwdMT = kDV <= 128 ? 2 : 1;
  static constexpr int kFwdBN = kFwdMT == 2 && kD > 64 ? 32 : 64;  // keeps 32-row warps clear of spills
  // dK/dV: 64 keys a CTA (their dK and dV accumulators live in registers), query blocks small
  // enough to keep P^T and dS^T beside them.
  static constexpr int kDkdvWarps = 4;
  static constexpr int kDkdvBM = kD + kDV <= 128 ? 64 : (kD + kDV <= 256 ? 32 : 16);
  static constexpr int kDqWarps = 4;
  static constexpr int kDqMT = kD <= 128 ? 2 : 1;  // 32 rows a warp while dQ's accumulators allow
  static constexpr int kDqBN = kDqMT == 1 && kD <= 128 && kDV <= 128 ? 64 : 32;

  using Fwd = FwdTile<T, kD, kDV, kFwdWarps, kFwdMT, kFwdBN>;
  using Dkdv = DkdvTile<T, kD, kDV, kDkdvWarps, kDkdvBM>;
  using Dq = DqTile<T, kD, kDV, kDqWarps, kDqMT, kDqBN>;

  static bool check(const PtAttnParams* p, char* err, size_t err_len) {
    if (p->head_dim != kD || p->head_dim_v != kDV || p->heads_kv <= 0 || p->heads_q % p->heads_kv != 0 ||
        p->heads_q > 65535 || p->batch > 65535 || p->seqlen_q > INT32_MAX / 2 || p->seqlen_k > INT32_MAX / 2) {
      snprintf(err, err_len,
               "attention module (head dims %d/%d) cannot take head dims %d/%d, %d query and %d KV heads, %lld "
               "sequences of up to %lld/%lld tokens",
               kD, kDV, p->head_dim, p->head_dim_v, p->heads_q, p->heads_kv, static_cast<long long>(p->batch),
               static_cast<long long>(p->seqlen_q), static_cast<long long>(p->seqlen_k));
      return false;
    }
    return true;
  }

  static bool packed(const PtAttnParams* p) { return p->cu_seqlens_q != nullptr; }

  static void launch_fwd(const PtAttnParams& q, cudaStream_t stream) {
    const int64_t m_blocks = (q.seqlen_q + Fwd::kBM - 1) / Fwd::kBM;
    if (m_blocks <= 0) return;
    auto kernel = attn_fwd_kernel<T, kD, kDV, kFwdWarps, kFwdMT, kFwdBN>;
    opt_in_smem(kernel, Fwd::kSmem);
    kernel<<<dim3(static_cast<unsigned>(m_blocks), static_cast<unsigned>(q.batch), static_cast<unsigned>(q.heads_q)),
             Fwd::kThreads, Fwd::kSmem, stream>>>(q);
  }

  static int forward(const PtAttnParams* p, char* err, size_t err_len) {
    return forward_with(p, err, err_len, "attention forward", launch_fwd);
  }

  // The forward's checks and packed-sequence memsets around launch(params, stream): the
  // sm90 modules swap in their own kernel. `what` names it in a launch error.
  template <class Launch>
  static int forward_with(const PtAttnParams* p, char* err, size_t err_len, const char* what, Launch launch) {
    if (!check(p, err, err_len)) return 1;
    const cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    if (packed(p)) {
      // Tokens outside every sequence are never visited: give them zeros (lse +inf), not garbage.
      cudaMemsetAsync(p->out, 0, p->total_q * p->o_ss * sizeof(T), stream);
      const int64_t n = p->heads_q * p->lse_sh;
      if (n > 0) fill_inf_kernel<<<static_cast<unsigned>(n < 256 * 1024 ? (n + 255) / 256 : 1024), 256, 0, stream>>>(p->lse, n);
    }
    if (p->batch > 0 && p->heads_q > 0) launch(*p, stream);
    return report_launch(what, err, err_len);
  }

  static void launch_dkdv(const PtAttnParams& q, unsigned batch, cudaStream_t stream) {
    const int64_t n_blocks = (q.seqlen_k + Dkdv::kBN - 1) / Dkdv::kBN;
    if (n_blocks <= 0) return;
    auto kernel = attn_bwd_dkdv_kernel<T, kD, kDV, kDkdvWarps, kDkdvBM>;
    opt_in_smem(kernel, Dkdv::kSmem);
    kernel<<<dim3(static_cast<unsigned>(n_blocks), batch, q.heads_kv), Dkdv::kThreads, Dkdv::kSmem, stream>>>(q);
  }

  static void launch_dq(const PtAttnParams& q, unsigned batch, cudaStream_t stream) {
    const int64_t m_blocks = (q.seqlen_q + Dq::kBM - 1) / Dq::kBM;
    if (m_blocks <= 0) return;
    auto kernel = attn_bwd_dq_kernel<T, kD, kDV, kDqWarps, kDqMT, kDqBN>;
    opt_in_smem(kernel, Dq::kSmem);
    kernel<<<dim3(static_cast<unsigned>(m_blocks), batch, q.heads_q), Dq::kThreads, Dq::kSmem, stream>>>(q);
  }

  static int backward(const PtAttnParams* p, char* err, size_t err_len) {
    return backward_with(p, err, err_len, launch_dkdv, launch_dq);
  }

  // The backward's launches with the dK/dV and dQ steps given (launch(params, batch, stream)): the
  // sm90 modules swap in their own. Without `delta_pass`, the dK/dV step writes delta itself.
  template <class LaunchDkdv, class LaunchDq>
  static int backward_with(const PtAttnParams* p, char* err, size_t err_len, LaunchDkdv dkdv, LaunchDq dq,
                           bool delta_pass = true) {
    if (!check(p, err, err_len)) return 1;
    const cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    if (packed(p)) {
      cudaMemsetAsync(p->dq, 0, p->total_q * p->dq_ss * sizeof(T), stream);
      cudaMemsetAsync(p->dk, 0, p->total_k * p->dk_ss * sizeof(T), stream);
      cudaMemsetAsync(p->dv, 0, p->total_k * p->dv_ss * sizeof(T), stream);
      cudaMemsetAsync(p->delta, 0, p->heads_q * p->lse_sh * sizeof(float), stream);
    }
    const unsigned batch = static_cast<unsigned>(p->batch);
    if (batch > 0 && p->heads_q > 0) {
      const int64_t rows = (p->seqlen_q + kDeltaRowsPerBlock - 1) / kDeltaRowsPerBlock;
      if (delta_pass && rows > 0)
        attn_bwd_delta_kernel<T, kDV><<<dim3(static_cast<unsigned>(rows), batch, p->heads_q), 32 * kDeltaRowsPerBlock,
                                        0, stream>>>(*p);
      dkdv(*p, batch, stream);
      dq(*p, batch, stream);
    }
    if (p->sink != nullptr && p->heads_q > 0) {
      const int64_t batches = packed(p) ? 1 : p->batch;
      const int64_t rows = packed(p) ? p->total_q : p->seqlen_q;
      attn_bwd_sink_kernel<<<p->heads_q, kSinkThreads, 0, stream>>>(*p, batches, rows);
    }
    return report_launch("attention backward", err, err_len);
  }
};

}  // namespace primus_turbo::kernels::attention

// Exports Kernel::forward and Kernel::backward as pt_attn_fwd_run / pt_attn_bwd_run.
#define PT_JIT_EXPORT_ATTENTION(Kernel)                                                               \
  PT_JIT_EXPORT_ABI_VERSION                                                                           \
  extern "C" __attribute__((visibility("default"))) int pt_attn_fwd_run(const PtAttnParams* params,   \
                                                                        char* err, size_t err_len) {  \
    return Kernel::forward(params, err, err_len);                                                     \
  }                                                                                                   \
  extern "C" __attribute__((visibility("default"))) int pt_attn_bwd_run(const PtAttnParams* params,   \
                                                                        char* err, size_t err_len) {  \
    return Kernel::backward(params, err, err_len);                                                    \
  }
