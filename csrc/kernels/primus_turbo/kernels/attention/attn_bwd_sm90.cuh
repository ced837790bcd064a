// The dK/dV and dQ kernels of the attention backward on Hopper's warpgroup MMA: our TURBO backward
// on sm_90a for head dims 64, 96, 128 and MLA's 192/128 (PRIMUS_TURBO_ATTN_KERNEL=mma keeps
// attn_bwd.cuh's mma.sync kernels). Same schedules and arithmetic as those kernels; delta and
// dsink keep them (Attention::backward_with). Both are warp-specialized like the forward
// (attn_fwd_sm90.cuh): warpgroup 0 copies the operands with cp.async into shared memory (a CopyRing of stages), two
// consumer warpgroups of 64 rows run the products.
//
// dK/dV: one CTA per (128 keys, sequence, KV head), walking every query head of the GQA group and
// every 64-row query block that sees its keys (Q, dO, lse and delta of each block through the
// ring; K and V copied once; 32-row blocks at 192/128). Per block, four products:
//   S^T  = K Q^T         (shared-memory operands: K, and Q K-major)
//   dP^T = V dO^T        (V, and dO K-major)
//   dV  += P^T dO        (P^T from registers, dO read MN-major through a transposed view)
//   dK  += dS^T Q        (dS^T = P^T o (dP^T - delta) from registers, Q MN-major)
// dQ: one CTA per (128 query rows, sequence, query head), over the 64-key blocks its rows see (K
// and V through the ring; Q and dO copied once): S = Q K^T, dP = dO V^T, dQ += dS K (K MN-major,
// transposed view).
// Fused dQ (the non-deterministic backward, head dims 128/128): the dK/dV kernel also computes
// each query block's share of dQ = dS K from the keys it holds and adds it into a float32
// workspace (dq_accum) with bulk reductions; a last pass scales it into dq (the pieces:
// attn_bwd_sm90_fused_dq.cuh). Five products a block instead of the two kernels' seven (S and dP
// are not computed twice); the order of the additions, and so the last bits of dq, vary from run
// to run.
// Accumulator value i = c0 + 2 r + 4 j of a warpgroup is row 16 warp + lane / 4 + 8 r of its 64
// (a key for dK/dV, a query for dQ) and column 8 j + 2 (lane % 4) + c0.
#pragma once

#include "primus_turbo/kernels/attention/attn_bwd_sm90_fused_dq.cuh"
#include "primus_turbo/kernels/attention/attn_fwd_sm90.cuh"

namespace primus_turbo::kernels::attention::sm90 {

constexpr int kBwdThreads = 384, kBwdProducers = 128;
// Registers per thread after the split: the consumers hold two 64-wide score tiles, their 16-bit
// copies and the dK and dV (or dQ) accumulators. The three warpgroups share what the launch gave
// (168 each at 384 threads): an increase beyond it waits forever.
constexpr int kBwdProducerRegs = 40, kBwdConsumerRegs = 232;
static_assert(kBwdProducerRegs + 2 * kBwdConsumerRegs <= 3 * 168, "register split exceeds the launch's");

// Head dims the sm90 backward is built for: the consumers' dK and dV accumulators (64 x (kD + kDV)
// a warpgroup) must leave room for the score tiles.
template <int kD, int kDV>
constexpr bool sm90_backward_dims() {
  return kD % 32 == 0 && kDV % 32 == 0 && kD <= 192 && kDV <= 128;
}

// Head dims whose dK/dV kernel can fuse dQ: 64-row query blocks, and K's columns split into two
// halves that are whole swizzle atoms (each half the MN-major B operand of one warpgroup's share
// of dQ = dS K).
template <class E, int kD, int kDV>
constexpr bool sm90_fused_dq_dims() {
  return sm90_backward_dims<kD, kDV>() && kD + kDV <= 256 && swizzle_width<E>(kD) == swizzle_width<E>(kD / 2) &&
         (kD / 2) % swizzle_width<E>(kD) == 0;
}

template <class T, int kD, int kDV, bool kFuseDq = false>
struct DkdvSm90 {
  static_assert(sm90_backward_dims<kD, kDV>(), "sm90 backward head dims");
  using E = typename CuteElement<T>::type;
  // Query blocks of 64 rows, 32 where dK and dV take more than 256 columns (MLA's 192/128).
  static constexpr int kBN = 128, kBM = kD + kDV > 256 ? 32 : 64, kStages = 3;

  using LayoutK = KMajorLayout<E, kBN, kD>;
  using LayoutV = KMajorLayout<E, kBN, kDV>;
  using LayoutQ = KMajorLayout<E, kBM, kD>;
  using LayoutDo = KMajorLayout<E, kBM, kDV>;
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

  // Fused dQ: dS (queries x keys, queries contiguous) in shared memory is the A operand of
  // dQ = dS K; warpgroup w computes columns [w kD / 2, (w + 1) kD / 2) from that half of K's tile
  // (a K-major [kBN, kD / 2] tile of its own, read transposed as an MN-major B).
  static_assert(!kFuseDq || sm90_fused_dq_dims<E, kD, kDV>(), "fused dQ head dims");
  static constexpr int kDqCols = kD / 2;
  using LayoutDs = MNMajorLayout<E, kBM, kBN>;
  using LayoutKtHalf = decltype(composition(KMajorLayout<E, kBN, kDqCols>{},
                                            make_layout(Shape<Int<kDqCols>, Int<kBN>>{}, Stride<Int<kBN>, _1>{})));
  using MmaDq = decltype(make_tiled_mma(
      GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kDqCols>, Int<kBN>>, GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));
  // With dS in shared memory anyway, dK += dS^T Q reads it from there too (dS seen transposed is
  // a K-major A): the registers of a 16-bit dS^T copy are what the dQ accumulator needs.
  using LayoutDst = decltype(composition(LayoutDs{}, make_layout(Shape<Int<kBN>, Int<kBM>>{}, Stride<Int<kBM>, _1>{})));
  using MmaDkSs = decltype(make_tiled_mma(
      GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kD>, Int<kBM>>, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));

  struct Smem {
    array_aligned<E, cosize_v<LayoutK>, 1024> k;
    array_aligned<E, cosize_v<LayoutV>, 1024> v;
    array_aligned<E, cosize_v<LayoutQ>, 1024> q[kStages];
    array_aligned<E, cosize_v<LayoutDo>, 1024> dout[kStages];
    float lse[kStages][kBM];  // natural log, as stored; 0 past the sequence (masked there)
    float delta[kStages][kBM];
    // Fused dQ: two dS buffers, so one warpgroup may write block i + 1's while the other still
    // reads block i's (DsHandoff).
    array_aligned<E, kFuseDq ? cosize_v<LayoutDs> : 8, 1024> ds[2];
    // Fused dQ: each warpgroup's share of a block's dQ on its way to the workspace (DqShare).
    array_aligned<float, kFuseDq ? 64 * kDqCols : 4, 128> dq_share[2];
    CopyOnce kv_ready;
    CopyRing<kStages> blocks;  // Q, dO, lse, delta of a query block
  };
  static constexpr size_t kSmem = sizeof(Smem);
  static_assert(kSmem <= 227 * 1024, "shared memory of a CTA");
};

template <class T, int kD, int kDV, bool kFuseDq>
__global__ void __launch_bounds__(kBwdThreads, 1) attn_bwd_dkdv_sm90_kernel(const PtAttnParams p) {
  using F = DkdvSm90<T, kD, kDV, kFuseDq>;
  using E = typename F::E;
  constexpr int kBN = F::kBN, kBM = F::kBM, kStages = F::kStages, kProducers = kBwdProducers;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<typename F::Smem*>(smem_raw);

  const KeyBlock<kBN, kBM> blk(p);
  if (blk.valid_k <= 0) return;
  const int n0 = blk.n0, hk = blk.hk, valid_k = blk.valid_k, iters = blk.iters;
  const int64_t b = blk.b;
  const Sequence& s = blk.s;
  const Mask& mask = blk.mask;
  auto head_of = [&](int it) { return blk.head_of(it); };
  auto row_of = [&](int it) { return blk.row_of(it); };

  if (threadIdx.x == 0) {
    smem.kv_ready.init(kProducers);
    smem.blocks.init(kProducers, kBwdThreads - kProducers);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < kProducers) {  // producer warpgroup
    cutlass::arch::warpgroup_reg_dealloc<kBwdProducerRegs>();
    const int tid = threadIdx.x;
    load_kv_swizzled<T, kBN, kD, kDV, kProducers>(p, b, hk, s.start_k + n0, valid_k, smem.k.data(),
                                                  typename F::LayoutK{}, smem.v.data(), typename F::LayoutV{});
    smem.kv_ready.commit();
    for (int it = 0; it < iters; ++it) {
      const int st = it % kStages, h = head_of(it), m0 = row_of(it), valid = min(kBM, s.len_q - m0);
      smem.blocks.acquire(it);
      load_swizzled<kBM, kD, kProducers>(smem.q[st].data(), typename F::LayoutQ{},
                                         row_at<const T>(p.q, p.q_sb, p.q_ss, p.q_sh, b, s.start_q + m0, h), p.q_ss,
                                         valid);
      load_swizzled<kBM, kDV, kProducers>(smem.dout[st].data(), typename F::LayoutDo{},
                                          row_at<const T>(p.dout, p.do_sb, p.do_ss, p.do_sh, b, s.start_q + m0, h),
                                          p.do_ss, valid);
      // lse by threads [0, kBM), delta by [kBM, 2 kBM): one row each.
      const int r = tid % kBM;
      const int64_t off = lse_offset(p, b, h, s.start_q + m0 + r);
      if (tid < kBM)
        cp_async4(&smem.lse[st][r], p.lse + off, r < valid);
      else if (tid < 2 * kBM)
        cp_async4(&smem.delta[st][r], p.delta + off, r < valid);
      smem.blocks.commit(it);
    }
    cp_async_drain();
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<kBwdConsumerRegs>();
  const int tid = threadIdx.x - kProducers;
  typename F::MmaS mma_s;
  typename F::MmaDp mma_dp;
  typename F::MmaDv mma_dv;
  typename F::MmaDk mma_dk;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_dp = mma_dp.get_thread_slice(tid);
  auto thr_dv = mma_dv.get_thread_slice(tid);
  auto thr_dk = mma_dk.get_thread_slice(tid);
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

  const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int key_base = n0 + wg * 64 + warp * 16 + lane / 4;  // + 8 r: this thread's two keys
  const float scale_log2 = p.softmax_scale * kLog2e;

  static_assert(!kFuseDq || F::kDqCols == DqShare::kCols, "a warpgroup's dQ share is 64 columns");
  // Fused dQ: this warpgroup's half of K's columns, read transposed, and the workspace's rows
  // (packed: [total_q, heads_q, kD]; fixed: [batch * seqlen_q, heads_q, kD]).
  typename F::MmaDq mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid % 128);
  typename F::MmaDkSs mma_dk_ss;
  auto thr_dk_ss = mma_dk_ss.get_thread_slice(tid);
  Tensor sKtHalf = make_tensor(make_smem_ptr(smem.k.data() + wg * kBN * F::kDqCols), typename F::LayoutKtHalf{});
  const int64_t dq_row0 = (p.cu_seqlens_q != nullptr ? 0 : b * p.seqlen_q) + s.start_q;
  const int64_t dq_rows = DqShare::rows(p);

  smem.kv_ready.wait();
  for (int it = 0; it < iters; ++it) {
    const int st = it % kStages, m0 = row_of(it);
    smem.blocks.wait_full(it);
    const float* lse = smem.lse[st];
    const float* delta = smem.delta[st];
    Tensor sQ = make_tensor(make_smem_ptr(smem.q[st].data()), typename F::LayoutQ{});
    Tensor sDo = make_tensor(make_smem_ptr(smem.dout[st].data()), typename F::LayoutDo{});
    Tensor sQt = make_tensor(make_smem_ptr(smem.q[st].data()), typename F::LayoutQt{});
    Tensor sDot = make_tensor(make_smem_ptr(smem.dout[st].data()), typename F::LayoutDot{});

    // S^T and dP^T together; then P^T = exp2(S^T * scale - lse) (rows are keys, columns this
    // block's queries) and dS^T = P^T o (dP^T - delta).
    issue_ss_gemm(mma_s, tSrK, thr_s.partition_fragment_B(sQ), tSrS);
    issue_ss_gemm(mma_dp, tDPrV, thr_dp.partition_fragment_B(sDo), tDPrDP);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    warpgroup_fence_operand(tDPrDP);
    const bool full = mask.all_visible(m0, m0 + kBM, n0, n0 + kBN);
    // Fused dQ: where this thread's dS pairs go in LayoutDs (tested against CuTe's layout): atom
    // key / 8 of 512 elements (key / 8 = 8 wg + 2 warp + r), row key % 8 (= lane / 4) of 64
    // elements, 16-byte chunk query / 8 (= j) XOR-swizzled by that row. Taken per block through an
    // opaque copy of the row: hoisted out of the loop, the eight chunk offsets spill.
    int ds_row = lane / 4;
    E* ds_at = nullptr;
    if constexpr (kFuseDq) {
      asm volatile("" : "+r"(ds_row));
      ds_at = smem.ds[it & 1].data() + (wg * 8 + warp * 2) * 512 + ds_row * 64 + 2 * (lane % 4);
    }
    // P^T and dS^T; blocks the mask cuts test each element (predicates and a select: a branch per
    // element costs more than the test), the others take a loop without the tests.
    auto probs_and_grads = [&](auto masked) {
#pragma unroll
      for (int j = 0; j < size(tSrS) / 4; ++j) {
        // Queries col and col + 1: their lse and delta read once for both of this thread's keys.
        const int col = 8 * j + 2 * (lane % 4);
        const float2 l = *reinterpret_cast<const float2*>(lse + col), d = *reinterpret_cast<const float2*>(delta + col);
        const float neg_lse2[2] = {-l.x * kLog2e, -l.y * kLog2e}, dl[2] = {d.x, d.y};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = 4 * j + 2 * r, key = key_base + 8 * r;
          float ds[2];
#pragma unroll
          for (int c0 = 0; c0 < 2; ++c0) {
            const float e2 = ex2(fmaf(tSrS(i + c0), scale_log2, neg_lse2[c0]));
            const float pr = (!decltype(masked)::value || mask.visible(m0 + col + c0, key)) ? e2 : 0.f;
            ds[c0] = pr * (tDPrDP(i + c0) - dl[c0]);
            tDVrP(i + c0) = static_cast<E>(pr);
            if constexpr (!kFuseDq) tDKrDS(i + c0) = static_cast<E>(ds[c0]);
          }
          // dS^T's pair (key, queries col and col + 1) is dS's (col, key) and (col + 1, key): adjacent.
          if constexpr (kFuseDq)
            *reinterpret_cast<uint32_t*>(ds_at + r * 512 + ((j ^ ds_row) << 3)) = pack2<T>(ds[0], ds[1]);
        }
      }
    };
    if (full)
      probs_and_grads(std::false_type{});
    else
      probs_and_grads(std::true_type{});
    if constexpr (kFuseDq) {
      // This warpgroup's dS rows, visible to the async proxy: complete for its own dK (a barrier of
      // its warps), announced to the other warpgroup's dQ without waiting for it (DsHandoff).
      cutlass::arch::fence_view_async_shared();
      DsHandoff::publish(wg, it);
    }
    issue_rs_gemm(mma_dv, tDVrP, thr_dv.partition_fragment_B(sDot), tDVrDV);
    if constexpr (kFuseDq) {
      Tensor sDst = make_tensor(make_smem_ptr(smem.ds[it & 1].data()), typename F::LayoutDst{});
      issue_ss_gemm(mma_dk_ss, thr_dk_ss.partition_fragment_A(sDst), thr_dk_ss.partition_fragment_B(sQt), tDKrDK,
                    true);
      DsHandoff::wait_other(wg, it);  // dQ reads both halves of dS
      Tensor sDs = make_tensor(make_smem_ptr(smem.ds[it & 1].data()), typename F::LayoutDs{});
      Tensor tDQrDQ = partition_fragment_C(mma_dq, Shape<_64, Int<F::kDqCols>>{});
      issue_ss_gemm(mma_dq, thr_dq.partition_fragment_A(sDs), thr_dq.partition_fragment_B(sKtHalf), tDQrDQ);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tDVrDV);
      warpgroup_fence_operand(tDKrDK);
      warpgroup_fence_operand(tDQrDQ);
      smem.blocks.release(it);
      // Each warp sends its 16 rows itself: warp-level syncs instead of warpgroup barriers.
      const int rows = min(16, s.len_q - m0 - warp * 16);
      const int64_t first = dq_row0 + m0;
      float* share = smem.dq_share[wg].data();
      if (lane == 0) DqShare::wait_read();  // the previous block's reduction is done with the rows
      __syncwarp();
      DqShare::write(tDQrDQ, share, warp * 16 + lane / 4, first, lane);
      cutlass::arch::fence_view_async_shared();
      __syncwarp();
      if (lane == 0 && rows > 0)
        DqShare::reduce_add(p.dq_accum + DqShare::offset(head_of(it), wg, dq_rows, first + warp * 16),
                            share + warp * 16 * DqShare::kCols, rows * DqShare::kCols * sizeof(float));
    } else {
      issue_rs_gemm(mma_dk, tDKrDS, thr_dk.partition_fragment_B(sQt), tDKrDK);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tDVrDV);
      warpgroup_fence_operand(tDKrDK);
      smem.blocks.release(it);
    }
  }

  if constexpr (kFuseDq) {
    if (lane == 0) DqShare::wait_done();
  }
  T* dk_out = row_at<T>(p.dk, p.dk_sb, p.dk_ss, p.dk_sh, b, s.start_k + n0, hk);
  T* dv_out = row_at<T>(p.dv, p.dv_sb, p.dv_ss, p.dv_sh, b, s.start_k + n0, hk);
  const int local_key = wg * 64 + warp * 16 + lane / 4;
  const float dk_scale[2] = {p.softmax_scale, p.softmax_scale}, dv_scale[2] = {1.f, 1.f};
  store_rows_sm90<T>(tDKrDK, dk_out, p.dk_ss, local_key, valid_k, lane, dk_scale);
  store_rows_sm90<T>(tDVrDV, dv_out, p.dv_ss, local_key, valid_k, lane, dv_scale);
}

template <class T, int kD, int kDV>
struct DqSm90 {
  static_assert(sm90_backward_dims<kD, kDV>(), "sm90 backward head dims");
  using E = typename CuteElement<T>::type;
  static constexpr int kBM = 128, kBN = 64, kStages = 3;

  using LayoutQ = KMajorLayout<E, kBM, kD>;
  using LayoutDo = KMajorLayout<E, kBM, kDV>;
  using LayoutK = KMajorLayout<E, kBN, kD>;
  using LayoutV = KMajorLayout<E, kBN, kDV>;
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
    array_aligned<E, cosize_v<LayoutK>, 1024> k[kStages];
    array_aligned<E, cosize_v<LayoutV>, 1024> v[kStages];
    CopyOnce qdo_ready;
    CopyRing<kStages> kv;
  };
  static constexpr size_t kSmem = sizeof(Smem);
};

template <class T, int kD, int kDV>
__global__ void __launch_bounds__(kBwdThreads, 1) attn_bwd_dq_sm90_kernel(const PtAttnParams p) {
  using F = DqSm90<T, kD, kDV>;
  using E = typename F::E;
  constexpr int kBM = F::kBM, kBN = F::kBN, kStages = F::kStages, kProducers = kBwdProducers;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<typename F::Smem*>(smem_raw);

  const QueryBlock<kBM, kBN> blk(p);
  if (blk.valid_q <= 0) return;
  const Mask& mask = blk.mask;
  const int m0 = blk.m0, valid_q = blk.valid_q, nb_lo = blk.nb_lo, nb_hi = blk.nb_hi;

  if (threadIdx.x == 0) {
    smem.qdo_ready.init(kProducers);
    smem.kv.init(kProducers, kBwdThreads - kProducers);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < kProducers) {  // producer warpgroup
    cutlass::arch::warpgroup_reg_dealloc<kBwdProducerRegs>();
    load_swizzled<kBM, kD, kProducers>(smem.q.data(), typename F::LayoutQ{},
                                       blk.template rows<const T>(p.q, p.q_sb, p.q_ss, p.q_sh), p.q_ss, valid_q);
    load_swizzled<kBM, kDV, kProducers>(smem.dout.data(), typename F::LayoutDo{},
                                        blk.template rows<const T>(p.dout, p.do_sb, p.do_ss, p.do_sh), p.do_ss,
                                        valid_q);
    smem.qdo_ready.commit();
    for (int nb = nb_lo; nb < nb_hi; ++nb) {
      const int i = nb - nb_lo, st = i % kStages, n0 = nb * kBN;
      smem.kv.acquire(i);
      load_kv_swizzled<T, kBN, kD, kDV, kProducers>(p, blk.b, blk.hk, blk.s.start_k + n0, min(kBN, blk.s.len_k - n0),
                                                    smem.k[st].data(), typename F::LayoutK{}, smem.v[st].data(),
                                                    typename F::LayoutV{});
      smem.kv.commit(i);
    }
    cp_async_drain();
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<kBwdConsumerRegs>();
  const int tid = threadIdx.x - kProducers;
  typename F::MmaS mma_s;
  typename F::MmaDp mma_dp;
  typename F::MmaDq mma_dq;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_dp = mma_dp.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor tSrQ = thr_s.partition_fragment_A(make_tensor(make_smem_ptr(smem.q.data()), typename F::LayoutQ{}));
  Tensor tDPrDo = thr_dp.partition_fragment_A(make_tensor(make_smem_ptr(smem.dout.data()), typename F::LayoutDo{}));
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kBM>, Int<kBN>>{});
  Tensor tDPrDP = partition_fragment_C(mma_dp, Shape<Int<kBM>, Int<kBN>>{});
  Tensor tDQrDQ = partition_fragment_C(mma_dq, Shape<Int<kBM>, Int<kD>>{});
  Tensor tDQrDS = make_tensor<E>(partition_shape_A(mma_dq, Shape<Int<kBM>, Int<kBN>>{}));
  static_assert(decltype(size(tSrS))::value == kBN / 2 && decltype(size(tDQrDS))::value == kBN / 2, "64 rows a WG");
  clear(tDQrDQ);

  const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int local_row = wg * 64 + warp * 16 + lane / 4;  // + 8 r: this thread's two rows in the block
  const float scale_log2 = p.softmax_scale * kLog2e;
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) lse_delta_at(p, blk.b, blk.h, blk.s, m0 + local_row + 8 * r, lse2[r], delta[r]);

  smem.qdo_ready.wait();
  for (int nb = nb_lo; nb < nb_hi; ++nb) {
    const int i = nb - nb_lo, st = i % kStages, n0 = nb * kBN;
    smem.kv.wait_full(i);
    Tensor sK = make_tensor(make_smem_ptr(smem.k[st].data()), typename F::LayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v[st].data()), typename F::LayoutV{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.k[st].data()), typename F::LayoutKt{});

    issue_ss_gemm(mma_s, tSrQ, thr_s.partition_fragment_B(sK), tSrS);
    issue_ss_gemm(mma_dp, tDPrDo, thr_dp.partition_fragment_B(sV), tDPrDP);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    warpgroup_fence_operand(tDPrDP);
    // dS, as in the dK/dV kernel: the mask tested per element only where it cuts the block.
    auto grads = [&](auto masked) {
#pragma unroll
      for (int e = 0; e < size(tSrS); ++e) {
        const int c0 = e & 1, r = (e >> 1) & 1, j = e >> 2;
        const float e2 = ex2(fmaf(tSrS(e), scale_log2, -lse2[r]));
        const bool vis =
            !decltype(masked)::value || mask.visible(m0 + local_row + 8 * r, n0 + 8 * j + 2 * (lane % 4) + c0);
        tDQrDS(e) = static_cast<E>((vis ? e2 : 0.f) * (tDPrDP(e) - delta[r]));
      }
    };
    if (mask.all_visible(m0, m0 + kBM, n0, n0 + kBN))
      grads(std::false_type{});
    else
      grads(std::true_type{});
    issue_rs_gemm(mma_dq, tDQrDS, thr_dq.partition_fragment_B(sKt), tDQrDQ);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tDQrDQ);
    smem.kv.release(i);
  }

  const float dq_scale[2] = {p.softmax_scale, p.softmax_scale};
  store_rows_sm90<T>(tDQrDQ, blk.template rows<T>(p.dq, p.dq_sb, p.dq_ss, p.dq_sh), p.dq_ss, local_row, valid_q, lane,
                     dq_scale);
}

// The sm90 backward: Attention's launches (delta, dsink, packed memsets) with the dK/dV and dQ
// kernels above, or, when the caller passes a dq_accum workspace (the non-deterministic
// backward), the dK/dV kernel with fused dQ and the conversion pass.
template <class T, int kD, int kDV>
struct AttentionBwdSm90 {
  using E = typename CuteElement<T>::type;
  static constexpr bool kFusable = sm90_fused_dq_dims<E, kD, kDV>();

  template <bool kFuseDq>
  static void launch_dkdv(const PtAttnParams& q, unsigned batch, cudaStream_t stream) {
    using F = DkdvSm90<T, kD, kDV, kFuseDq>;
    const int64_t n_blocks = (q.seqlen_k + F::kBN - 1) / F::kBN;
    if (n_blocks <= 0) return;
    auto kernel = attn_bwd_dkdv_sm90_kernel<T, kD, kDV, kFuseDq>;
    opt_in_smem(kernel, F::kSmem);
    kernel<<<dim3(static_cast<unsigned>(n_blocks), batch, q.heads_kv), kBwdThreads, F::kSmem, stream>>>(q);
  }

  static void launch_dq(const PtAttnParams& q, unsigned batch, cudaStream_t stream) {
    using F = DqSm90<T, kD, kDV>;
    const int64_t m_blocks = (q.seqlen_q + F::kBM - 1) / F::kBM;
    if (m_blocks <= 0) return;
    auto kernel = attn_bwd_dq_sm90_kernel<T, kD, kDV>;
    opt_in_smem(kernel, F::kSmem);
    kernel<<<dim3(static_cast<unsigned>(m_blocks), batch, q.heads_q), kBwdThreads, F::kSmem, stream>>>(q);
  }

  static void launch_fused_dkdv(const PtAttnParams& q, unsigned batch, cudaStream_t stream) {
    cudaMemsetAsync(q.dq_accum, 0, DqShare::rows(q) * q.heads_q * kD * sizeof(float), stream);
    launch_dkdv<true>(q, batch, stream);
  }

  static void launch_dq_convert(const PtAttnParams& q, unsigned, cudaStream_t stream) {
    const int64_t rows = DqShare::rows(q), chunks = rows * q.heads_q * (kD / 8);
    if (chunks <= 0) return;
    constexpr int kThreads = 256;
    const unsigned blocks = static_cast<unsigned>((chunks + kThreads - 1) / kThreads);
    attn_bwd_dq_convert_kernel<T, kD><<<blocks, kThreads, 0, stream>>>(q, rows);
  }

  static int backward(const PtAttnParams* p, char* err, size_t err_len) {
    using A = Attention<T, kD, kDV>;
    if (p->dq_accum == nullptr) return A::backward_with(p, err, err_len, launch_dkdv<false>, launch_dq);
    if constexpr (kFusable) {
      return A::backward_with(p, err, err_len, launch_fused_dkdv, launch_dq_convert);
    } else {
      snprintf(err, err_len, "attention backward module (head dims %d/%d) does not fuse dQ: pass no dq_accum", kD,
               kDV);
      return 1;
    }
  }
};

}  // namespace primus_turbo::kernels::attention::sm90

// Exports AttentionBwdSm90::backward as pt_attn_bwd_run.
#define PT_JIT_EXPORT_ATTENTION_SM90_BWD(T, D, DV)                                                                \
  PT_JIT_EXPORT_ABI_VERSION                                                                                       \
  extern "C" __attribute__((visibility("default"))) int pt_attn_bwd_run(const PtAttnParams* params, char* err,   \
                                                                        size_t err_len) {                        \
    return primus_turbo::kernels::attention::sm90::AttentionBwdSm90<T, D, DV>::backward(params, err, err_len);   \
  }
