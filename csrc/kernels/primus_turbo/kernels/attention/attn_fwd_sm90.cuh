// Flash-attention forward on Hopper's warpgroup MMA (wgmma). EXPERIMENTAL: opt-in with
// PRIMUS_TURBO_ATTN_KERNEL=wgmma, head dims 64/64 and 128/128 (with attn_bwd_sm90.cuh's dK/dV, in
// one module); not yet run on a GPU.
//
// One CTA per (128 query rows, sequence, query head): two warpgroups of 64 rows each. Q, and K/V
// blocks of 128 keys in two stages, sit in 128-byte-swizzled shared memory (K-major for Q and K,
// MN-major for V, the layouts wgmma reads), copied with cp.async by all 256 threads (the next
// block's copy overlaps this block's math). S = Q K^T is a shared-memory wgmma; the online softmax
// runs on its accumulators in registers (same rule as attn_fwd.cuh: log2 domain, sink start); P is
// converted in place into the A operand of the register-sourced wgmma O += P V (the accumulator
// and A-operand register orders coincide for 16-bit types, so no shuffle is needed).
//
// Fragment map (per warpgroup, thread t = 32 * warp + lane): accumulator value i = c0 + 2 r + 4 j
// is row 16 warp + lane / 4 + 8 r and column 8 j + 2 (lane % 4) + c0.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "primus_turbo/kernels/attention/attention.cuh"

namespace primus_turbo::kernels::attention::sm90 {

using namespace cute;

template <class T>
struct CuteElement;
template <>
struct CuteElement<__nv_bfloat16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct CuteElement<__half> {
  using type = cutlass::half_t;
};

template <class T, int kD, int kDV>
struct FwdSm90 {
  static_assert(kD % 64 == 0 && kDV % 64 == 0 && kD <= 128 && kDV <= 128, "head dims 64 or 128");
  using E = typename CuteElement<T>::type;
  static constexpr int kBM = 128, kBN = 128, kThreads = 256;

  using LayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kBM>, Int<kD>>{}));
  using LayoutK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kBN>, Int<kD>>{}));
  using LayoutVt = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<E>{}, Shape<Int<kDV>, Int<kBN>>{}));
  using MmaQK = decltype(make_tiled_mma(GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kBN>, Int<kD>>>(),
                                        Layout<Shape<_2, _1, _1>>{}));
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<E, E, float, Shape<_64, Int<kDV>, Int<kBN>>, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));

  struct Smem {
    array_aligned<E, cosize_v<LayoutQ>, 1024> q;
    array_aligned<E, cosize_v<LayoutK>, 1024> k[2];
    array_aligned<E, cosize_v<LayoutVt>, 1024> v[2];
  };
  static constexpr size_t kSmem = sizeof(Smem);
};

// 16-byte chunks of a [rows, cols] row-major global tile into a swizzled shared-memory layout, rows
// past `valid` zero-filled: element (r, c) goes to (r, c), or to (c, r) with kTransposed (V as the
// MN-major operand of P V). Addresses go through a shared-memory tensor: the SW128 atoms' swizzle
// acts on byte addresses, so calling the layout on element coordinates alone would misplace chunks.
template <int kRows, int kCols, int kThreads, bool kTransposed = false, class E, class T, class Layout>
__device__ __forceinline__ void load_swizzled(E* smem, Layout layout, const T* src, int64_t stride, int valid) {
  constexpr int kChunksPerRow = kCols / 8;
  Tensor tile = make_tensor(make_smem_ptr(smem), layout);
#pragma unroll
  for (int c = threadIdx.x; c < kRows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool ok = r < valid;
    E* dst = kTransposed ? &tile(col, r) : &tile(r, col);
    cp_async16(dst, ok ? src + r * stride + col : src, ok);
  }
}

// kRows keys of K and V (KV head hk of batch entry b, from sequence row `first`; `valid` of them
// real) into their tiles; V transposed with kVTransposed.
template <class T, int kRows, int kD, int kDV, int kThreads, bool kVTransposed, class E, class LayoutK, class LayoutV>
__device__ __forceinline__ void load_kv_swizzled(const PtAttnParams& p, int64_t b, int hk, int64_t first, int valid,
                                                 E* sk, LayoutK layout_k, E* sv, LayoutV layout_v) {
  load_swizzled<kRows, kD, kThreads>(sk, layout_k, row_at<const T>(p.k, p.k_sb, p.k_ss, p.k_sh, b, first, hk),
                                     p.k_ss, valid);
  load_swizzled<kRows, kDV, kThreads, kVTransposed>(
      sv, layout_v, row_at<const T>(p.v, p.v_sb, p.v_ss, p.v_sh, b, first, hk), p.v_ss, valid);
}

// One warpgroup product issued and committed, not waited for: C = A B (shared-memory A and B; C
// overwritten).
template <class Mma, class A, class B, class C>
__device__ __forceinline__ void issue_ss_gemm(Mma& mma, A const& a, B const& b, C& c) {
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// C += A B with A from registers, issued and committed, not waited for.
template <class Mma, class A, class B, class C>
__device__ __forceinline__ void issue_rs_gemm(Mma& mma, A& a, B const& b, C& c) {
  warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
#pragma unroll
  for (int kb = 0; kb < size<2>(a); ++kb) cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
  warpgroup_commit_batch();
}

// The same, waited for.
template <class Mma, class A, class B, class C>
__device__ __forceinline__ void ss_gemm(Mma& mma, A const& a, B const& b, C& c) {
  issue_ss_gemm(mma, a, b, c);
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
}

template <class Mma, class A, class B, class C>
__device__ __forceinline__ void rs_gemm(Mma& mma, A& a, B const& b, C& c) {
  issue_rs_gemm(mma, a, b, c);
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
}

// A warpgroup accumulator's rows (local_row + 8 r of the tile, those below `valid`) times scale[r],
// as pairs of 16-bit values into out (row stride `stride`, columns from 0).
template <class T, class Acc>
__device__ __forceinline__ void store_rows_sm90(const Acc& acc, T* out, int64_t stride, int local_row, int valid,
                                                int lane, const float (&scale)[2]) {
#pragma unroll
  for (int i = 0; i < size(acc); i += 2) {
    const int r = (i >> 1) & 1, j = i >> 2, row = local_row + 8 * r;
    if (row < valid)
      *reinterpret_cast<uint32_t*>(out + row * stride + 8 * j + 2 * (lane % 4)) =
          pack2<T>(acc(i) * scale[r], acc(i + 1) * scale[r]);
  }
}

// A forward warpgroup's epilogue: its rows of O (accumulated in units of `unit`) divided by their
// softmax denominators into out, and their log-sum-exp (natural log; +inf for a row that saw
// nothing, whose output is 0). row_max / row_sum: this thread's two rows, row_max in log2 units,
// row_sum partial over the quad.
template <class T, int kBM, int kBN, class Acc>
__device__ __forceinline__ void store_forward_rows(const PtAttnParams& p, const QueryBlock<kBM, kBN>& blk,
                                                   const Acc& acc, const float (&row_max)[2],
                                                   const float (&row_sum)[2], float unit, int local_row, int lane) {
  T* out = blk.template rows<T>(p.out, p.o_sb, p.o_ss, p.o_sh);
  float* lse_row = p.lse + lse_offset(p, blk.b, blk.h, blk.s.start_q + blk.m0);
  float inv[2], lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(row_sum[r]);
    inv[r] = sum > 0.f ? unit / sum : 0.f;
    lse[r] = sum > 0.f ? (row_max[r] + log2f(sum)) * kLn2 : INFINITY;
  }
  store_rows_sm90<T>(acc, out, p.o_ss, local_row, blk.valid_q, lane, inv);
  if (lane % 4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (local_row + 8 * r < blk.valid_q) lse_row[local_row + 8 * r] = lse[r];
  }
}

template <class T, int kD, int kDV>
__global__ void __launch_bounds__(256, 1) attn_fwd_sm90_kernel(const PtAttnParams p) {
  using F = FwdSm90<T, kD, kDV>;
  using E = typename F::E;
  constexpr int kBM = F::kBM, kBN = F::kBN, kThreads = F::kThreads;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<typename F::Smem*>(smem_raw);

  const QueryBlock<kBM, kBN> blk(p);
  if (blk.valid_q <= 0) return;
  const Mask& mask = blk.mask;
  const int m0 = blk.m0, valid_q = blk.valid_q, nb_lo = blk.nb_lo, nb_hi = blk.nb_hi;

  const typename F::LayoutQ layout_q{};
  const typename F::LayoutK layout_k{};
  const typename F::LayoutVt layout_v{};
  auto load_kv = [&](int nb, int buf) {
    const int n0 = nb * kBN;
    load_kv_swizzled<T, kBN, kD, kDV, kThreads, true>(p, blk.b, blk.hk, blk.s.start_k + n0, min(kBN, blk.s.len_k - n0),
                                                      smem.k[buf].data(), layout_k, smem.v[buf].data(), layout_v);
  };
  load_swizzled<kBM, kD, kThreads>(smem.q.data(), layout_q, blk.template rows<const T>(p.q, p.q_sb, p.q_ss, p.q_sh),
                                   p.q_ss, valid_q);
  if (nb_lo < nb_hi) load_kv(nb_lo, 0);
  cp_async_commit();

  typename F::MmaQK mma_qk;
  typename F::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(threadIdx.x);
  auto thr_pv = mma_pv.get_thread_slice(threadIdx.x);
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), layout_q);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBM>, Int<kBN>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBM>, Int<kDV>>{});
  Tensor tOrP = make_tensor<E>(partition_shape_A(mma_pv, Shape<Int<kBM>, Int<kBN>>{}));
  static_assert(decltype(size(tSrS))::value == kBN / 2 && decltype(size(tOrP))::value == kBN / 2, "64 rows a WG");
  clear(tOrO);

  const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const int row_base = m0 + wg * 64 + warp * 16 + lane / 4;  // + 8 r: this thread's two rows
  const float scale_log2 = p.softmax_scale * kLog2e;
  const float sink2 = p.sink != nullptr ? p.sink[blk.h] * kLog2e : -INFINITY;
  float row_max[2] = {sink2, sink2};
  float row_sum[2];
  row_sum[0] = row_sum[1] = (p.sink != nullptr && lane % 4 == 0) ? 1.f : 0.f;

  for (int nb = nb_lo; nb < nb_hi; ++nb) {
    const int buf = (nb - nb_lo) & 1;
    cp_async_wait_all();
    cutlass::arch::fence_view_async_shared();  // cp.async's writes become visible to wgmma's reads
    __syncthreads();
    if (nb + 1 < nb_hi) load_kv(nb + 1, buf ^ 1);
    cp_async_commit();

    Tensor sK = make_tensor(make_smem_ptr(smem.k[buf].data()), layout_k);
    ss_gemm(mma_qk, tSrQ, thr_qk.partition_fragment_B(sK), tSrS);

    const int n0 = nb * kBN;
    const bool full = mask.all_visible(m0, m0 + kBM, n0, n0 + kBN);
    float mx[2] = {row_max[0], row_max[1]};
#pragma unroll
    for (int i = 0; i < size(tSrS); ++i) {
      const int c0 = i & 1, r = (i >> 1) & 1, j = i >> 2;
      float x = tSrS(i) * scale_log2;
      if (!full && !mask.visible(row_base + 8 * r, n0 + 8 * j + 2 * (lane % 4) + c0)) x = -INFINITY;
      tSrS(i) = x;
      mx[r] = fmaxf(mx[r], x);
    }
    float base[2], corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      base[r] = mx[r] == -INFINITY ? 0.f : mx[r];  // a row that sees nothing yet stays all-zero
      corr[r] = ex2(row_max[r] - base[r]);
      row_max[r] = mx[r];
      row_sum[r] *= corr[r];
    }
#pragma unroll
    for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= corr[(i >> 1) & 1];
#pragma unroll
    for (int i = 0; i < size(tSrS); ++i) {
      const int r = (i >> 1) & 1;
      const float e = ex2(tSrS(i) - base[r]);
      row_sum[r] += e;
      tOrP(i) = static_cast<E>(e);
    }

    Tensor sV = make_tensor(make_smem_ptr(smem.v[buf].data()), layout_v);
    rs_gemm(mma_pv, tOrP, thr_pv.partition_fragment_B(sV), tOrO);
  }
  cp_async_wait_all();

  const int local_row = wg * 64 + warp * 16 + lane / 4;  // in the block
  store_forward_rows<T>(p, blk, tOrO, row_max, row_sum, 1.f, local_row, lane);
}

// Host side of the experimental forward: Attention's checks and memsets around this kernel.
template <class T, int kD, int kDV>
struct AttentionFwdSm90 {
  static void launch(const PtAttnParams& q, cudaStream_t stream) {
    using F = FwdSm90<T, kD, kDV>;
    const int64_t m_blocks = (q.seqlen_q + F::kBM - 1) / F::kBM;
    if (m_blocks <= 0) return;
    auto kernel = attn_fwd_sm90_kernel<T, kD, kDV>;
    Attention<T, kD, kDV>::allow_smem(kernel, F::kSmem);
    kernel<<<dim3(static_cast<unsigned>(m_blocks), static_cast<unsigned>(q.batch), static_cast<unsigned>(q.heads_q)),
             F::kThreads, F::kSmem, stream>>>(q);
  }

  static int forward(const PtAttnParams* p, char* err, size_t err_len) {
    return Attention<T, kD, kDV>::forward_with(p, err, err_len, "attention forward (wgmma)", launch);
  }
};

}  // namespace primus_turbo::kernels::attention::sm90
