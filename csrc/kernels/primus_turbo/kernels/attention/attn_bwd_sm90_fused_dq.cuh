// The pieces of the sm90 attention backward's fused dQ (attn_bwd_sm90.cuh, head dims 128/128):
// how the two consumer warpgroups hand their dS rows to each other, how a warpgroup's share of dQ
// goes into the float32 workspace, and the pass that turns the workspace into dq.
#pragma once

#include "primus_turbo/kernels/attention/attn_fwd_sm90.cuh"

namespace primus_turbo::kernels::attention::sm90 {

// Fused dQ: a warpgroup's share of a query block's dQ (64 rows x its 64 columns) goes to the
// float32 workspace through shared memory and bulk reductions (one a warp), which the TMA unit
// adds in L2 asynchronously (per-thread vector atomics, 2048 a block, took a fifth of the time).
// Workspace layout [Hq][2 halves][rows][64] keeps a block's share contiguous; in each row the
// 8-column chunk j sits at j ^ (row % 8) (row: the workspace row), so that the shared-memory image
// is written without bank conflicts. attn_bwd_dq_convert_kernel undoes both.
struct DqShare {
  static constexpr int kCols = 64;

  // The workspace's rows: every token of q (packed: total_q; fixed: batch * seqlen_q).
  __host__ __device__ __forceinline__ static int64_t rows(const PtAttnParams& p) {
    return p.cu_seqlens_q != nullptr ? p.total_q : p.batch * p.seqlen_q;
  }

  __device__ __forceinline__ static int64_t offset(int h, int half, int64_t rows, int64_t row) {
    return ((static_cast<int64_t>(h) * 2 + half) * rows + row) * kCols;
  }
  // The accumulator's rows local_row + 8 r into the shared image (first: the block's first workspace row).
  template <class Acc>
  __device__ __forceinline__ static void write(const Acc& acc, float* share, int local_row, int64_t first, int lane) {
#pragma unroll
    for (int i = 0; i < size(acc); i += 2) {
      const int r = (i >> 1) & 1, j = i >> 2, row = local_row + 8 * r;
      const int chunk = j ^ static_cast<int>((first + row) & 7);
      *reinterpret_cast<float2*>(share + row * kCols + chunk * 8 + 2 * (lane % 4)) = make_float2(acc(i), acc(i + 1));
    }
  }
  __device__ __forceinline__ static void reduce_add(float* dst, const float* share, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 "cp.async.bulk.commit_group;\n" ::"l"(dst),
                 "r"(smem_addr(share)), "r"(bytes)
                 : "memory");
  }
  // The issuing thread: its reductions have read their shared memory / have completed.
  __device__ __forceinline__ static void wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  }
  __device__ __forceinline__ static void wait_done() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
};

// Fused dQ: each consumer warpgroup writes the dS rows of its 64 keys; its dK reads only those,
// dQ reads both warpgroups'. Named barriers hand them over without putting the warpgroups in
// lock step (so one's softmax can run beside the other's products): a warpgroup syncs its own warps,
// arrives on its "written" barrier and only waits on the other's right before issuing dQ. The
// barriers alternate with the block's parity: a warpgroup can only arrive for block i + 2 after
// the other has passed block i + 1's handoff, hence block i's wait. (Which is also why two dS
// buffers suffice.) Ids: 1, 2 a warpgroup's own; 3 + 2 wg + parity its "written".
struct DsHandoff {
  __device__ __forceinline__ static void publish(int wg, int block) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
    asm volatile("bar.arrive %0, 256;\n" ::"r"(3 + 2 * wg + (block & 1)) : "memory");
  }
  __device__ __forceinline__ static void wait_other(int wg, int block) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(3 + 2 * (1 - wg) + (block & 1)) : "memory");
  }
};

// Fused dQ's last pass: dq = softmax_scale * dq_accum in T, 8 columns a thread (rows of the
// workspace: see the dK/dV kernel; every row, so tokens outside packed sequences get zeros).
template <class T, int kD>
__global__ void attn_bwd_dq_convert_kernel(const PtAttnParams p, int64_t rows) {
  constexpr int kChunks = kD / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * p.heads_q * kChunks) return;
  const int c = static_cast<int>(i % kChunks);
  const int64_t row_head = i / kChunks, row = row_head / p.heads_q;
  const int h = static_cast<int>(row_head % p.heads_q);
  const bool packed = p.cu_seqlens_q != nullptr;
  const int j = (c % 8) ^ static_cast<int>(row & 7);
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + DqShare::offset(h, c / 8, rows, row) + 8 * j);
  const float4 lo = src[0], hi = src[1];
  const float s = p.softmax_scale;
  uint32_t* dst = reinterpret_cast<uint32_t*>(row_at<T>(p.dq, p.dq_sb, p.dq_ss, p.dq_sh, packed ? 0 : row / p.seqlen_q,
                                                        packed ? row : row % p.seqlen_q, h) +
                                              8 * c);
  dst[0] = pack2<T>(lo.x * s, lo.y * s);
  dst[1] = pack2<T>(lo.z * s, lo.w * s);
  dst[2] = pack2<T>(hi.x * s, hi.y * s);
  dst[3] = pack2<T>(hi.z * s, hi.w * s);
}

}  // namespace primus_turbo::kernels::attention::sm90
