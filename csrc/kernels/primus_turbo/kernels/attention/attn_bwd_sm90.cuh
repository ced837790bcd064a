// The dK/dV and dQ kernels of the attention backward on Hopper's warpgroup MMA. EXPERIMENTAL:
// opt-in with PRIMUS_TURBO_ATTN_KERNEL=wgmma, head dims 64 and 128; no faster than attn_bwd.cuh's
// mma.sync kernels yet (not warp-specialized). Same schedules and arithmetic as those kernels;
// delta and dsink keep them (Attention::backward_with).
//
// dK/dV: one CTA per (128 keys, sequence, KV head), two warpgroups of 64 keys, walking every query
// head of the GQA group and every 64-row query block that sees its keys (Q, dO, lse and delta of
// the next block prefetched into the other of two stages). Per block, four products:
//   S^T  = K Q^T         (shared-memory operands: K, and Q K-major)
//   dP^T = V dO^T        (V, and dO K-major)
//   dV  += P^T dO        (P^T from registers, dO read MN-major through a transposed view)
//   dK  += dS^T Q        (dS^T = P^T o (dP^T - delta) from registers, Q MN-major)
// dQ: one CTA per (128 query rows, sequence, query head), two warpgroups of 64 rows, over the
// 64-key blocks its rows see: S = Q K^T, dP = dO V^T, dQ += dS K (K MN-major, transposed view).
// Accumulator value i = c0 + 2 r + 4 j of a warpgroup is row 16 warp + lane / 4 + 8 r of its 64
// (a key for dK/dV, a query for dQ) and column 8 j + 2 (lane % 4) + c0.
#pragma once

#include "primus_turbo/kernels/attention/attn_fwd_sm90.cuh"

namespace primus_turbo::kernels::attention::sm90 {

template <class T, int kD, int kDV>
struct DkdvSm90 {
  static_assert(kD % 64 == 0 && kDV % 64 == 0 && kD <= 128 && kDV <= 128, "head dims 64 or 128");
  using E = typename CuteElement<T>::type;
  static constexpr int kBN = 128, kBM = 64, kThreads = 256;

  using LayoutK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kBN>, Int<kD>>{}));
  using LayoutV = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kBN>, Int<kDV>>{}));
  using LayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kBM>, Int<kD>>{}));
  using LayoutDo = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kBM>, Int<kDV>>{}));
  // The same tiles seen transposed, (feature, query): MN-major operands of dK += dS^T Q, dV += P^T dO.
  using LayoutQt = decltype(composition(LayoutQ{}, make_layout(Shape<Int<kD>, Int<kBM>>{}, Stride<Int<kBM>, _1>{})));
  using LayoutDot =
      decltype(composition(LayoutDo{}, make_layout(Shape<Int<kDV>, Int<kBM>>{}, Stride<Int<kBM>, _1>{})));

  using MmaS = decltype(make_tiled_mma(GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kBM>, Int<kD>>>(),
                                       Layout<Shape<_2, _1, _1>>{}));
  using MmaDp = decltype(make_tiled_mma(GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kBM>, Int<kDV>>>(),
                                        Layout<Shape<_2, _1, _1>>{}));
  using MmaDv = decltype(make_tiled_mma(
      GMMA::rs_op_selector<E, E, float, Shape<_64, Int<kDV>, Int<kBM>>, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));
  using MmaDk = decltype(make_tiled_mma(
      GMMA::rs_op_selector<E, E, float, Shape<_64, Int<kD>, Int<kBM>>, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));

  struct Smem {
    array_aligned<E, cosize_v<LayoutK>, 1024> k;
    array_aligned<E, cosize_v<LayoutV>, 1024> v;
    array_aligned<E, cosize_v<LayoutQ>, 1024> q[2];
    array_aligned<E, cosize_v<LayoutDo>, 1024> dout[2];
    float lse[2][kBM];  // log2 units; +inf past the block's rows
    float delta[2][kBM];
  };
  static constexpr size_t kSmem = sizeof(Smem);
};

template <class T, int kD, int kDV>
__global__ void __launch_bounds__(256, 1) attn_bwd_dkdv_sm90_kernel(const PtAttnParams p) {
  using F = DkdvSm90<T, kD, kDV>;
  using E = typename F::E;
  constexpr int kBN = F::kBN, kBM = F::kBM, kThreads = F::kThreads;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<typename F::Smem*>(smem_raw);

  const int n0 = blockIdx.x * kBN;
  const int64_t b = blockIdx.y;
  const int hk = blockIdx.z, group = p.heads_q / p.heads_kv;
  const Sequence s = sequence(p, b);
  if (n0 >= s.len_k) return;
  const Mask mask(p, s);
  const int valid_k = min(kBN, s.len_k - n0);
  load_kv_swizzled<T, kBN, kD, kDV, kThreads, false>(p, b, hk, s.start_k + n0, valid_k, smem.k.data(),
                                                     typename F::LayoutK{}, smem.v.data(), typename F::LayoutV{});
  const int q_lo = mask.first_query(n0), q_hi = mask.end_query(n0 + valid_k);
  const int mb_lo = q_lo / kBM, mb_hi = q_hi > q_lo ? (q_hi + kBM - 1) / kBM : mb_lo;
  const int n_mb = mb_hi - mb_lo, iters = group * n_mb;

  // Iteration `it` covers query head hk * group + it / n_mb, query block mb_lo + it % n_mb.
  auto issue = [&](int it, int buf) {
    const int h = hk * group + it / n_mb, m0 = (mb_lo + it % n_mb) * kBM;
    const int valid = min(kBM, s.len_q - m0);
    load_swizzled<kBM, kD, kThreads>(smem.q[buf].data(), typename F::LayoutQ{},
                                     row_at<const T>(p.q, p.q_sb, p.q_ss, p.q_sh, b, s.start_q + m0, h), p.q_ss, valid);
    load_swizzled<kBM, kDV, kThreads>(smem.dout[buf].data(), typename F::LayoutDo{},
                                      row_at<const T>(p.dout, p.do_sb, p.do_ss, p.do_sh, b, s.start_q + m0, h),
                                      p.do_ss, valid);
    stage_lse_delta<kBM, kThreads>(p, b, h, s, m0, smem.lse[buf], smem.delta[buf]);
  };
  if (iters > 0) issue(0, 0);
  cp_async_commit();

  typename F::MmaS mma_s;
  typename F::MmaDp mma_dp;
  typename F::MmaDv mma_dv;
  typename F::MmaDk mma_dk;
  auto thr_s = mma_s.get_thread_slice(threadIdx.x);
  auto thr_dp = mma_dp.get_thread_slice(threadIdx.x);
  auto thr_dv = mma_dv.get_thread_slice(threadIdx.x);
  auto thr_dk = mma_dk.get_thread_slice(threadIdx.x);
  Tensor tSrK = thr_s.partition_fragment_A(make_tensor(make_smem_ptr(smem.k.data()), typename F::LayoutK{}));
  Tensor tDPrV = thr_dp.partition_fragment_A(make_tensor(make_smem_ptr(smem.v.data()), typename F::LayoutV{}));
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kBN>, Int<kBM>>{});
  Tensor tDPrDP = partition_fragment_C(mma_dp, Shape<Int<kBN>, Int<kBM>>{});
  Tensor tDVrDV = partition_fragment_C(mma_dv, Shape<Int<kBN>, Int<kDV>>{});
  Tensor tDKrDK = partition_fragment_C(mma_dk, Shape<Int<kBN>, Int<kD>>{});
  Tensor tDVrP = make_tensor<E>(partition_shape_A(mma_dv, Shape<Int<kBN>, Int<kBM>>{}));
  Tensor tDKrDS = make_tensor<E>(partition_shape_A(mma_dk, Shape<Int<kBN>, Int<kBM>>{}));
  static_assert(decltype(size(tSrS))::value == kBM / 2 && decltype(size(tDVrP))::value == kBM / 2, "64 keys a WG");
  clear(tDVrDV);
  clear(tDKrDK);

  const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const int key_base = n0 + wg * 64 + warp * 16 + lane / 4;  // + 8 r: this thread's two keys
  const float scale_log2 = p.softmax_scale * kLog2e;

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    cp_async_wait_all();
    cutlass::arch::fence_view_async_shared();  // cp.async's writes become visible to wgmma's reads
    __syncthreads();
    if (it + 1 < iters) issue(it + 1, buf ^ 1);
    cp_async_commit();
    const int m0 = (mb_lo + it % n_mb) * kBM;
    const float* lse2 = smem.lse[buf];
    const float* delta = smem.delta[buf];
    Tensor sQ = make_tensor(make_smem_ptr(smem.q[buf].data()), typename F::LayoutQ{});
    Tensor sDo = make_tensor(make_smem_ptr(smem.dout[buf].data()), typename F::LayoutDo{});
    Tensor sQt = make_tensor(make_smem_ptr(smem.q[buf].data()), typename F::LayoutQt{});
    Tensor sDot = make_tensor(make_smem_ptr(smem.dout[buf].data()), typename F::LayoutDot{});

    // P^T = exp2(S^T * scale - lse): rows are keys, columns this block's queries.
    ss_gemm(mma_s, tSrK, thr_s.partition_fragment_B(sQ), tSrS);
    const bool full = mask.all_visible(m0, m0 + kBM, n0, n0 + kBN);
#pragma unroll
    for (int i = 0; i < size(tSrS); ++i) {
      const int c0 = i & 1, r = (i >> 1) & 1, j = i >> 2;
      const int col = 8 * j + 2 * (lane % 4) + c0;
      const bool vis = full || mask.visible(m0 + col, key_base + 8 * r);
      tSrS(i) = vis ? ex2(fmaf(tSrS(i), scale_log2, -lse2[col])) : 0.f;
      tDVrP(i) = static_cast<E>(tSrS(i));
    }
    rs_gemm(mma_dv, tDVrP, thr_dv.partition_fragment_B(sDot), tDVrDV);

    // dS^T = P^T o (V dO^T - delta).
    ss_gemm(mma_dp, tDPrV, thr_dp.partition_fragment_B(sDo), tDPrDP);
#pragma unroll
    for (int i = 0; i < size(tDPrDP); ++i) {
      const int col = 8 * (i >> 2) + 2 * (lane % 4) + (i & 1);
      tDKrDS(i) = static_cast<E>(tSrS(i) * (tDPrDP(i) - delta[col]));
    }
    rs_gemm(mma_dk, tDKrDS, thr_dk.partition_fragment_B(sQt), tDKrDK);
  }
  cp_async_wait_all();

  T* dk_out = row_at<T>(p.dk, p.dk_sb, p.dk_ss, p.dk_sh, b, s.start_k + n0, hk);
  T* dv_out = row_at<T>(p.dv, p.dv_sb, p.dv_ss, p.dv_sh, b, s.start_k + n0, hk);
  const int local_key = wg * 64 + warp * 16 + lane / 4;
  const float dk_scale[2] = {p.softmax_scale, p.softmax_scale}, dv_scale[2] = {1.f, 1.f};
  store_rows_sm90<T>(tDKrDK, dk_out, p.dk_ss, local_key, valid_k, lane, dk_scale);
  store_rows_sm90<T>(tDVrDV, dv_out, p.dv_ss, local_key, valid_k, lane, dv_scale);
}

// dQ on wgmma: one CTA per (128 query rows, sequence, query head), two warpgroups of 64 rows, over
// the blocks of 64 keys its rows see (K and V in two stages), as attn_bwd_dq_kernel:
//   S = Q K^T, dP = dO V^T (shared-memory operands, all K-major), dS = P o (dP - delta),
//   dQ += dS K (dS from registers, K read MN-major through a transposed view of its tile).
template <class T, int kD, int kDV>
struct DqSm90 {
  static_assert(kD % 64 == 0 && kDV % 64 == 0 && kD <= 128 && kDV <= 128, "head dims 64 or 128");
  using E = typename CuteElement<T>::type;
  static constexpr int kBM = 128, kBN = 64, kThreads = 256;

  using LayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kBM>, Int<kD>>{}));
  using LayoutDo = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kBM>, Int<kDV>>{}));
  using LayoutK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kBN>, Int<kD>>{}));
  using LayoutV = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kBN>, Int<kDV>>{}));
  using LayoutKt = decltype(composition(LayoutK{}, make_layout(Shape<Int<kD>, Int<kBN>>{}, Stride<Int<kBN>, _1>{})));

  using MmaS = decltype(make_tiled_mma(GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kBN>, Int<kD>>>(),
                                       Layout<Shape<_2, _1, _1>>{}));
  using MmaDp = decltype(make_tiled_mma(GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kBN>, Int<kDV>>>(),
                                        Layout<Shape<_2, _1, _1>>{}));
  using MmaDq = decltype(make_tiled_mma(
      GMMA::rs_op_selector<E, E, float, Shape<_64, Int<kD>, Int<kBN>>, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));

  struct Smem {
    array_aligned<E, cosize_v<LayoutQ>, 1024> q;
    array_aligned<E, cosize_v<LayoutDo>, 1024> dout;
    array_aligned<E, cosize_v<LayoutK>, 1024> k[2];
    array_aligned<E, cosize_v<LayoutV>, 1024> v[2];
  };
  static constexpr size_t kSmem = sizeof(Smem);
};

template <class T, int kD, int kDV>
__global__ void __launch_bounds__(256, 1) attn_bwd_dq_sm90_kernel(const PtAttnParams p) {
  using F = DqSm90<T, kD, kDV>;
  using E = typename F::E;
  constexpr int kBM = F::kBM, kBN = F::kBN, kThreads = F::kThreads;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<typename F::Smem*>(smem_raw);

  const QueryBlock<kBM, kBN> blk(p);
  if (blk.valid_q <= 0) return;
  const Mask& mask = blk.mask;
  const int m0 = blk.m0, valid_q = blk.valid_q, nb_lo = blk.nb_lo, nb_hi = blk.nb_hi;
  auto load_kv = [&](int nb, int buf) {
    const int n0 = nb * kBN;
    load_kv_swizzled<T, kBN, kD, kDV, kThreads, false>(p, blk.b, blk.hk, blk.s.start_k + n0,
                                                       min(kBN, blk.s.len_k - n0), smem.k[buf].data(),
                                                       typename F::LayoutK{}, smem.v[buf].data(), typename F::LayoutV{});
  };
  load_swizzled<kBM, kD, kThreads>(smem.q.data(), typename F::LayoutQ{},
                                   blk.template rows<const T>(p.q, p.q_sb, p.q_ss, p.q_sh), p.q_ss, valid_q);
  load_swizzled<kBM, kDV, kThreads>(smem.dout.data(), typename F::LayoutDo{},
                                    blk.template rows<const T>(p.dout, p.do_sb, p.do_ss, p.do_sh), p.do_ss, valid_q);
  if (nb_lo < nb_hi) load_kv(nb_lo, 0);
  cp_async_commit();

  typename F::MmaS mma_s;
  typename F::MmaDp mma_dp;
  typename F::MmaDq mma_dq;
  auto thr_s = mma_s.get_thread_slice(threadIdx.x);
  auto thr_dp = mma_dp.get_thread_slice(threadIdx.x);
  auto thr_dq = mma_dq.get_thread_slice(threadIdx.x);
  Tensor tSrQ = thr_s.partition_fragment_A(make_tensor(make_smem_ptr(smem.q.data()), typename F::LayoutQ{}));
  Tensor tDPrDo = thr_dp.partition_fragment_A(make_tensor(make_smem_ptr(smem.dout.data()), typename F::LayoutDo{}));
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kBM>, Int<kBN>>{});
  Tensor tDPrDP = partition_fragment_C(mma_dp, Shape<Int<kBM>, Int<kBN>>{});
  Tensor tDQrDQ = partition_fragment_C(mma_dq, Shape<Int<kBM>, Int<kD>>{});
  Tensor tDQrDS = make_tensor<E>(partition_shape_A(mma_dq, Shape<Int<kBM>, Int<kBN>>{}));
  static_assert(decltype(size(tSrS))::value == kBN / 2 && decltype(size(tDQrDS))::value == kBN / 2, "64 rows a WG");
  clear(tDQrDQ);

  const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const int local_row = wg * 64 + warp * 16 + lane / 4;  // + 8 r: this thread's two rows in the block
  const float scale_log2 = p.softmax_scale * kLog2e;
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) lse_delta_at(p, blk.b, blk.h, blk.s, m0 + local_row + 8 * r, lse2[r], delta[r]);

  for (int nb = nb_lo; nb < nb_hi; ++nb) {
    const int buf = (nb - nb_lo) & 1;
    cp_async_wait_all();
    cutlass::arch::fence_view_async_shared();  // cp.async's writes become visible to wgmma's reads
    __syncthreads();
    if (nb + 1 < nb_hi) load_kv(nb + 1, buf ^ 1);
    cp_async_commit();
    Tensor sK = make_tensor(make_smem_ptr(smem.k[buf].data()), typename F::LayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v[buf].data()), typename F::LayoutV{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.k[buf].data()), typename F::LayoutKt{});

    ss_gemm(mma_s, tSrQ, thr_s.partition_fragment_B(sK), tSrS);
    ss_gemm(mma_dp, tDPrDo, thr_dp.partition_fragment_B(sV), tDPrDP);
    const int n0 = nb * kBN;
    const bool full = mask.all_visible(m0, m0 + kBM, n0, n0 + kBN);
#pragma unroll
    for (int i = 0; i < size(tSrS); ++i) {
      const int c0 = i & 1, r = (i >> 1) & 1, j = i >> 2;
      const bool vis = full || mask.visible(m0 + local_row + 8 * r, n0 + 8 * j + 2 * (lane % 4) + c0);
      const float pr = vis ? ex2(fmaf(tSrS(i), scale_log2, -lse2[r])) : 0.f;
      tDQrDS(i) = static_cast<E>(pr * (tDPrDP(i) - delta[r]));
    }
    rs_gemm(mma_dq, tDQrDS, thr_dq.partition_fragment_B(sKt), tDQrDQ);
  }
  cp_async_wait_all();

  const float dq_scale[2] = {p.softmax_scale, p.softmax_scale};
  store_rows_sm90<T>(tDQrDQ, blk.template rows<T>(p.dq, p.dq_sb, p.dq_ss, p.dq_sh), p.dq_ss, local_row, valid_q, lane,
                     dq_scale);
}

// The experimental module's backward: Attention's launches (delta, dsink, packed memsets) with the
// dK/dV and dQ kernels above.
template <class T, int kD, int kDV>
struct AttentionBwdSm90 {
  static void launch_dkdv(const PtAttnParams& q, unsigned batch, cudaStream_t stream) {
    using F = DkdvSm90<T, kD, kDV>;
    const int64_t n_blocks = (q.seqlen_k + F::kBN - 1) / F::kBN;
    if (n_blocks <= 0) return;
    auto kernel = attn_bwd_dkdv_sm90_kernel<T, kD, kDV>;
    Attention<T, kD, kDV>::allow_smem(kernel, F::kSmem);
    kernel<<<dim3(static_cast<unsigned>(n_blocks), batch, q.heads_kv), F::kThreads, F::kSmem, stream>>>(q);
  }

  static void launch_dq(const PtAttnParams& q, unsigned batch, cudaStream_t stream) {
    using F = DqSm90<T, kD, kDV>;
    const int64_t m_blocks = (q.seqlen_q + F::kBM - 1) / F::kBM;
    if (m_blocks <= 0) return;
    auto kernel = attn_bwd_dq_sm90_kernel<T, kD, kDV>;
    Attention<T, kD, kDV>::allow_smem(kernel, F::kSmem);
    kernel<<<dim3(static_cast<unsigned>(m_blocks), batch, q.heads_q), F::kThreads, F::kSmem, stream>>>(q);
  }

  static int backward(const PtAttnParams* p, char* err, size_t err_len) {
    return Attention<T, kD, kDV>::backward_with(p, err, err_len, launch_dkdv, launch_dq);
  }
};

}  // namespace primus_turbo::kernels::attention::sm90

// Exports AttentionBwdSm90::backward as pt_attn_bwd_run (the experimental backward module).
#define PT_JIT_EXPORT_ATTENTION_SM90_BWD(T, D, DV)                                                                \
  PT_JIT_EXPORT_ABI_VERSION                                                                                       \
  extern "C" __attribute__((visibility("default"))) int pt_attn_bwd_run(const PtAttnParams* params, char* err,   \
                                                                        size_t err_len) {                        \
    return primus_turbo::kernels::attention::sm90::AttentionBwdSm90<T, D, DV>::backward(params, err, err_len);   \
  }
