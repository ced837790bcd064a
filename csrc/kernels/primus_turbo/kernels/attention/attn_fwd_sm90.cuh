// Flash-attention forward on Hopper: warp-specialized, on the warpgroup MMA (wgmma). Our TURBO
// forward on sm_90a for head dims up to 256 (multiples of 32); attn_fwd.cuh's mma.sync kernel
// serves other GPUs. Also the shared pieces of the sm90 attention kernels (swizzled tiles, wgmma
// issue, the forward epilogue), which attn_bwd_sm90.cuh and attn_fwd_fp8_sm90.cuh use.
//
// One CTA per (128 query rows, sequence, query head), three warpgroups. Warpgroup 0 is the
// producer: its 128 threads copy Q once and each block of keys' K and V into a ring of kStages
// buffers with 16-byte cp.async (any 16-byte aligned strides, zeros past the sequence), straight
// into the swizzled layouts wgmma reads (K-major Q and K, MN-major V); each buffer is signalled by
// a "full" barrier on which every producer thread arrives when its copies land, and released by an
// "empty" barrier. Warpgroups 1 and 2 each own 64 query rows: S = Q K^T (shared-memory wgmma), the
// online softmax on its accumulators (log2 domain, as attn_fwd.cuh: sink start, masked blocks only
// where the tile is cut), P converted in place into the A operand of the register-sourced wgmma
// O += P V (for 16-bit types the accumulator and A-operand register orders coincide). Block i's
// S = Q K^T is issued before block i - 1's P V and runs beside it; the two consumer warpgroups
// run unsynchronized (or, for head dims above 128, take turns issuing their products: IssueTurns), so
// one's softmax overlaps the other's products.
//
// Fragment map (per warpgroup, thread t = 32 * warp + lane): accumulator value i = c0 + 2 r + 4 j
// is row 16 warp + lane / 4 + 8 r and column 8 j + 2 (lane % 4) + c0.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

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

// The widest swizzle whose atom row (bytes along the contiguous dimension) divides the tile's:
// what wgmma reads, K-major (rows x kK, K contiguous) or MN-major (kMN x columns, MN contiguous).
template <class E, int kK>
using KMajorAtom =
    conditional_t<kK * sizeof(E) % 128 == 0, GMMA::Layout_K_SW128_Atom<E>,
                  conditional_t<kK * sizeof(E) % 64 == 0, GMMA::Layout_K_SW64_Atom<E>, GMMA::Layout_K_SW32_Atom<E>>>;
template <class E, int kMN>
using MNMajorAtom =
    conditional_t<kMN * sizeof(E) % 128 == 0, GMMA::Layout_MN_SW128_Atom<E>,
                  conditional_t<kMN * sizeof(E) % 64 == 0, GMMA::Layout_MN_SW64_Atom<E>, GMMA::Layout_MN_SW32_Atom<E>>>;
template <class E, int kMN, int kK>
using KMajorLayout = decltype(tile_to_shape(KMajorAtom<E, kK>{}, Shape<Int<kMN>, Int<kK>>{}));
template <class E, int kMN, int kK>
using MNMajorLayout = decltype(tile_to_shape(MNMajorAtom<E, kMN>{}, Shape<Int<kMN>, Int<kK>>{}));

// Elements along the contiguous dimension of one swizzle-atom row for a tile kContig elements wide:
// the rule of KMajorAtom / MNMajorAtom (128, 64 or 32 bytes).
template <class E>
constexpr int swizzle_width(int contig) {
  const int bytes = contig * static_cast<int>(sizeof(E));
  return (bytes % 128 == 0 ? 128 : bytes % 64 == 0 ? 64 : 32) / static_cast<int>(sizeof(E));
}

// 16-byte chunks of a [kRows, kCols] row-major global tile into its swizzled shared-memory tile,
// rows past `valid` zero-filled: element (r, c) goes to (r, c) of a K-major layout, or to (c, r)
// of an MN-major one with kTransposed (V as the operand of P V). Both are tile_to_shape layouts of
// an atom of 8 rows by W contiguous elements, atoms numbered first-mode-first, the swizzle acting
// inside an atom. So each of the kThreads threads takes one fixed chunk position inside an atom
// (its swizzled offset computed once through the layout) in every kThreads / W-th atom: the
// shared-memory offsets of its chunks are that offset plus a constant step. (Evaluating the
// swizzled layout per chunk made a producer warp too slow to feed the tensor cores.)
template <int kRows, int kCols, int kThreads, bool kTransposed = false, class E, class T, class Layout>
__device__ __forceinline__ void load_swizzled(E* smem, Layout layout, const T* src, int64_t stride, int valid,
                                              int tid = threadIdx.x) {
  constexpr int kW = swizzle_width<E>(kCols), kAtomChunks = kW;  // 8 rows of W / 8 chunks
  constexpr int kAtomsR = kRows / 8, kAtomsC = kCols / kW;        // along rows, along the contiguous columns
  constexpr int kStep = kThreads / kAtomChunks, kPasses = kAtomsR * kAtomsC / kStep;
  static_assert(kRows % 8 == 0 && kCols % kW == 0 && kThreads % kAtomChunks == 0 && kAtomsR * kAtomsC % kStep == 0,
                "whole atoms, and every thread a chunk of each pass");
  const int q = tid % kAtomChunks, first_atom = tid / kAtomChunks;
  const int rr = q / (kW / 8), cc = (q % (kW / 8)) * 8;  // row and element column inside an atom
  Tensor tile = make_tensor(make_smem_ptr(smem), layout);
  E* dst = &tile(kTransposed ? cc : rr, kTransposed ? rr : cc);  // in atom 0
  const T* from = src + rr * stride + cc;
#pragma unroll
  for (int j = 0; j < kPasses; ++j) {
    const int a = first_atom + j * kStep;
    const int ar = kTransposed ? a / kAtomsC : a % kAtomsR, ac = kTransposed ? a % kAtomsC : a / kAtomsR;
    const bool ok = 8 * ar + rr < valid;
    cp_async16(dst + a * 8 * kW, ok ? from + 8 * ar * stride + ac * kW : src, ok);
  }
}

// Waits for every cp.async this thread issued, committed to a group or not: the producers signal
// barriers instead of committing groups, so cp.async.wait_group would not wait for their copies.
__device__ __forceinline__ void cp_async_drain() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// 4 bytes global -> shared (the backward's per-row lse and delta); zero-filled when !valid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}

// The barriers of a ring of kStages shared-memory buffers that the producer warpgroup fills with
// cp.async and the consumer warpgroups read: each buffer's kParts parts (K and V, say) are
// signalled separately by "full" barriers, on which every producer thread arrives once its copies
// have landed; the buffer is released by an "empty" barrier on which every consumer thread arrives.
// Use i counts the buffer's fills: buffer i % kStages, phase (i / kStages) & 1.
template <int kStages, int kParts = 1>
struct CopyRing {
  using Barrier = cutlass::arch::ClusterBarrier;
  uint64_t full[kStages][kParts], empty[kStages];

  __device__ __forceinline__ void init(int producers, int consumers) {
    for (int s = 0; s < kStages; ++s) {
      for (int part = 0; part < kParts; ++part) Barrier::init(&full[s][part], producers);
      Barrier::init(&empty[s], consumers);
    }
  }
  // Producer: wait until use i's buffer is free, then, after issuing a part's copies, signal it.
  __device__ __forceinline__ void acquire(int i) {
    if (i >= kStages) Barrier::wait(&empty[i % kStages], ((i / kStages) - 1) & 1);
  }
  __device__ __forceinline__ void commit(int i, int part = 0) {
    cutlass::arch::cpasync_barrier_arrive_noinc(&full[i % kStages][part]);
  }
  // Consumer: wait for a part, then a proxy fence (cp.async writes through the generic proxy,
  // wgmma reads through the async one); release the buffer when its reads are done.
  __device__ __forceinline__ void wait_full(int i, int part = 0) {
    Barrier::wait(&full[i % kStages][part], (i / kStages) & 1);
    cutlass::arch::fence_view_async_shared();
  }
  __device__ __forceinline__ void release(int i) { Barrier::arrive(&empty[i % kStages]); }
};

// A one-time fill (operands a CTA keeps throughout): the same signalling with a single barrier.
struct CopyOnce {
  using Barrier = cutlass::arch::ClusterBarrier;
  uint64_t full;
  __device__ __forceinline__ void init(int producers) { Barrier::init(&full, producers); }
  __device__ __forceinline__ void commit() { cutlass::arch::cpasync_barrier_arrive_noinc(&full); }
  __device__ __forceinline__ void wait() {
    Barrier::wait(&full, 0);
    cutlass::arch::fence_view_async_shared();
  }
};

// Pingpong between the two consumer warpgroups: they take turns issuing their products, so that
// one's run while the other computes its softmax, instead of both queueing on the tensor cores at
// once and then both waiting on the exponentials. Named barrier 1 + w is warpgroup w's turn: it
// syncs there (its 128 threads) once the other has arrived (128 more) after issuing. Warpgroup 0
// goes first. Both take the same number of turns; the last arrival is left unmatched at exit.
// Worth it where a block's products are long against its softmax (head dims above 128: MLA's
// 192/128 forward +3%); at 128/128 the strict alternation cost 1-3%, so kOn = false there.
template <bool kOn>
struct IssueTurns {
  __device__ __forceinline__ static void start(int wg) {
    if (kOn && wg == 1) arrive(0);
  }
  __device__ __forceinline__ static void take(int wg) {
    if constexpr (kOn) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
  }
  __device__ __forceinline__ static void pass(int wg) {
    if constexpr (kOn) arrive(1 - wg);
  }
  __device__ __forceinline__ static void arrive(int wg) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + wg) : "memory");
  }
};

// kRows keys of K and V (KV head hk of batch entry b, from sequence row `first`; `valid` of them
// real) into their K-major tiles.
template <class T, int kRows, int kD, int kDV, int kThreads, class E, class LayoutK, class LayoutV>
__device__ __forceinline__ void load_kv_swizzled(const PtAttnParams& p, int64_t b, int hk, int64_t first, int valid,
                                                 E* sk, LayoutK layout_k, E* sv, LayoutV layout_v) {
  load_swizzled<kRows, kD, kThreads>(sk, layout_k, row_at<const T>(p.k, p.k_sb, p.k_ss, p.k_sh, b, first, hk),
                                     p.k_ss, valid);
  load_swizzled<kRows, kDV, kThreads>(
      sv, layout_v, row_at<const T>(p.v, p.v_sb, p.v_ss, p.v_sh, b, first, hk), p.v_ss, valid);
}

// One warpgroup product issued and committed, not waited for: C = A B, or C += A B with
// `accumulate` (shared-memory A and B).
template <class Mma, class A, class B, class C>
__device__ __forceinline__ void issue_ss_gemm(Mma& mma, A const& a, B const& b, C& c, bool accumulate = false) {
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = accumulate ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero;
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

// Tile shapes and shared memory of the forward for head dims kD (q, k) and kDV (v).
template <class T, int kD, int kDV>
struct FwdSm90 {
  static_assert(kD % 32 == 0 && kDV % 32 == 0 && kD <= 256 && kDV <= 256, "head dims: multiples of 32 up to 256");
  using E = typename CuteElement<T>::type;
  // 128 keys a block while S, O and P fit the consumers' registers; 64 with a 256-wide O.
  static constexpr int kBM = 128, kBN = kDV > 128 ? 64 : 128, kThreads = 384, kProducerThreads = 128;
  using LayoutQ = KMajorLayout<E, kBM, kD>;
  using LayoutK = KMajorLayout<E, kBN, kD>;
  using LayoutVt = MNMajorLayout<E, kDV, kBN>;  // V as stored (keys x dv, dv contiguous), read (dv, key)
  static constexpr size_t kQBytes = sizeof(E) * kBM * kD, kKvBytes = sizeof(E) * kBN * (kD + kDV);
  // As many K/V stages as fit, up to 3 (227 KiB a CTA).
  static constexpr int kStages = kQBytes + 3 * kKvBytes + 1024 <= 227 * 1024 ? 3 : 2;
  // Registers per thread after the split: the producer's copy offsets, the consumers' accumulators
  // (up to 64 x 256 floats of O). The three warpgroups share what the launch gave (168 each at 384
  // threads): an increase beyond it waits forever.
  static constexpr int kProducerRegs = kDV > 128 ? 40 : 56, kConsumerRegs = kDV > 128 ? 232 : 224;
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * 168, "register split exceeds the launch's");
  using Turns = IssueTurns<(kD + kDV > 256)>;
  // Two consumer warpgroups of 64 rows: each issues its own half of every product.
  using MmaQK = decltype(make_tiled_mma(GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kBN>, Int<kD>>>(),
                                        Layout<Shape<_2, _1, _1>>{}));
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<E, E, float, Shape<_64, Int<kDV>, Int<kBN>>, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));

  struct Smem {
    array_aligned<E, cosize_v<LayoutQ>, 1024> q;
    array_aligned<E, cosize_v<LayoutK>, 1024> k[kStages];
    array_aligned<E, cosize_v<LayoutVt>, 1024> v[kStages];
    CopyOnce q_ready;
    CopyRing<kStages, 2> kv;  // parts: K, V
  };
  static constexpr size_t kSmem = sizeof(Smem);
};

template <class T, int kD, int kDV>
__global__ void __launch_bounds__(384, 1) attn_fwd_sm90_kernel(const PtAttnParams p) {
  using F = FwdSm90<T, kD, kDV>;
  using E = typename F::E;
  constexpr int kBM = F::kBM, kBN = F::kBN, kStages = F::kStages, kProducers = F::kProducerThreads;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<typename F::Smem*>(smem_raw);

  const QueryBlock<kBM, kBN> blk(p);
  if (blk.valid_q <= 0) return;
  const int nb_lo = blk.nb_lo, nb_hi = blk.nb_hi;

  if (threadIdx.x == 0) {
    smem.q_ready.init(kProducers);
    smem.kv.init(kProducers, F::kThreads - kProducers);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < kProducers) {  // producer warpgroup: 16-byte copies straight into the swizzled tiles
    cutlass::arch::warpgroup_reg_dealloc<F::kProducerRegs>();
    load_swizzled<kBM, kD, kProducers>(smem.q.data(), typename F::LayoutQ{},
                                       blk.template rows<const T>(p.q, p.q_sb, p.q_ss, p.q_sh), p.q_ss, blk.valid_q);
    smem.q_ready.commit();
    for (int nb = nb_lo; nb < nb_hi; ++nb) {
      const int i = nb - nb_lo, st = i % kStages, n0 = nb * kBN, valid = min(kBN, blk.s.len_k - n0);
      smem.kv.acquire(i);
      const int64_t first = blk.s.start_k + n0;
      load_swizzled<kBN, kD, kProducers>(smem.k[st].data(), typename F::LayoutK{},
                                         row_at<const T>(p.k, p.k_sb, p.k_ss, p.k_sh, blk.b, first, blk.hk), p.k_ss,
                                         valid);
      smem.kv.commit(i, 0);
      load_swizzled<kBN, kDV, kProducers, true>(smem.v[st].data(), typename F::LayoutVt{},
                                                row_at<const T>(p.v, p.v_sb, p.v_ss, p.v_sh, blk.b, first, blk.hk),
                                                p.v_ss, valid);
      smem.kv.commit(i, 1);
    }
    cp_async_drain();
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<F::kConsumerRegs>();
  const int tid = threadIdx.x - kProducers;  // in the two consumer warpgroups
  using Turns = typename F::Turns;
  const int cw = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  typename F::MmaQK mma_qk;
  typename F::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename F::LayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBM>, Int<kBN>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBM>, Int<kDV>>{});
  Tensor tOrP = make_tensor<E>(partition_shape_A(mma_pv, Shape<Int<kBM>, Int<kBN>>{}));
  Tensor tOrP_words = recast<uint32_t>(tOrP);  // accumulator pairs (2w, 2w + 1): for 16-bit A the orders coincide
  static_assert(decltype(size(tSrS))::value == kBN / 2 && decltype(size(tOrP))::value == kBN / 2, "64 rows a WG");
  clear(tOrO);

  const Mask& mask = blk.mask;
  const int m0 = blk.m0;
  const int local_row = cw * 64 + warp * 16 + lane / 4;  // + 8 r: this thread's two rows in the block
  const int row_base = m0 + local_row;
  const float scale_log2 = p.softmax_scale * kLog2e;
  const float sink2 = p.sink != nullptr ? p.sink[blk.h] * kLog2e : -INFINITY;
  float row_max[2] = {sink2, sink2};
  float row_sum[2];
  row_sum[0] = row_sum[1] = (p.sink != nullptr && lane % 4 == 0) ? 1.f : 0.f;

  // The online softmax of key block nb on S's accumulators: row statistics updated, S replaced by
  // P = 2^(S scale - max), corr receives O's correction per row. Unmasked blocks with a positive
  // scale take the maximum of the raw accumulators and one FFMA per exponent.
  auto softmax = [&](auto masked, auto raw_max, int nb, float (&corr)[2]) {
    constexpr bool kMasked = decltype(masked)::value, kRawMax = decltype(raw_max)::value;
    const int n0 = nb * kBN;
    float mx[2] = {row_max[0], row_max[1]};
    if constexpr (kRawMax) {
      float raw[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int e = 0; e < size(tSrS); ++e) raw[(e >> 1) & 1] = fmaxf(raw[(e >> 1) & 1], tSrS(e));
#pragma unroll
      for (int r = 0; r < 2; ++r) mx[r] = fmaxf(mx[r], raw[r] * scale_log2);
    } else {
#pragma unroll
      for (int e = 0; e < size(tSrS); ++e) {
        const int c0 = e & 1, r = (e >> 1) & 1, j = e >> 2;
        float x = tSrS(e) * scale_log2;
        if (kMasked && !mask.visible(row_base + 8 * r, n0 + 8 * j + 2 * (lane % 4) + c0)) x = -INFINITY;
        tSrS(e) = x;
        mx[r] = fmaxf(mx[r], x);
      }
    }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      base[r] = mx[r] == -INFINITY ? 0.f : mx[r];  // a row that sees nothing yet stays all-zero
      corr[r] = ex2(row_max[r] - base[r]);
      row_max[r] = mx[r];
      row_sum[r] *= corr[r];
    }
#pragma unroll
    for (int e = 0; e < size(tSrS); ++e) {
      const int r = (e >> 1) & 1;
      const float pe = kRawMax ? ex2(fmaf(tSrS(e), scale_log2, -base[r])) : ex2(tSrS(e) - base[r]);
      tSrS(e) = pe;
      row_sum[r] += pe;
    }
  };
  auto softmax_block = [&](int nb, float (&corr)[2]) {
    if (!mask.all_visible(m0, m0 + kBM, nb * kBN, nb * kBN + kBN))
      softmax(std::true_type{}, std::false_type{}, nb, corr);
    else if (scale_log2 >= 0.f)
      softmax(std::false_type{}, std::true_type{}, nb, corr);
    else
      softmax(std::false_type{}, std::false_type{}, nb, corr);
  };
  auto to_p = [&] {
#pragma unroll
    for (int w = 0; w < size(tOrP_words); ++w) tOrP_words(w) = pack2<T>(tSrS(2 * w), tSrS(2 * w + 1));
  };
  // Asynchronous products (committed, not waited for): S = Q K^T of stage st, O += P V of stage st.
  auto issue_qk = [&](int st) {
    Tensor sK = make_tensor(make_smem_ptr(smem.k[st].data()), typename F::LayoutK{});
    issue_ss_gemm(mma_qk, tSrQ, thr_qk.partition_fragment_B(sK), tSrS);
  };
  auto issue_pv = [&](int st) {
    Tensor sV = make_tensor(make_smem_ptr(smem.v[st].data()), typename F::LayoutVt{});
    issue_rs_gemm(mma_pv, tOrP, thr_pv.partition_fragment_B(sV), tOrO);
  };

  // Block i's S = Q K^T runs while block i - 1's P V does: the softmax of block i waits for its S
  // only, and O's correction waits for the P V before it.
  smem.q_ready.wait();
  Turns::start(cw);
  if (nb_lo < nb_hi) {
    float corr[2];
    smem.kv.wait_full(0, 0);
    Turns::take(cw);
    issue_qk(0);
    Turns::pass(cw);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    softmax_block(nb_lo, corr);  // O is still 0: nothing to correct
    to_p();
    for (int nb = nb_lo + 1; nb < nb_hi; ++nb) {
      const int i = nb - nb_lo, st = i % kStages, prev = (i - 1) % kStages;
      smem.kv.wait_full(i, 0);
      Turns::take(cw);
      issue_qk(st);
      smem.kv.wait_full(i - 1, 1);  // loaded before K(i): no wait in practice
      issue_pv(prev);
      Turns::pass(cw);
      warpgroup_wait<1>();  // this block's S; the last block's P V may still run
      warpgroup_fence_operand(tSrS);
      softmax_block(nb, corr);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      smem.kv.release(i - 1);
      // Once the row maxima settle, most blocks leave them unchanged (corr = 1 for every row of
      // the warp): skip the multiplications then (a warp-uniform test, exact either way).
      if (!__all_sync(0xffffffffu, corr[0] == 1.f && corr[1] == 1.f)) {
#pragma unroll
        for (int e = 0; e < size(tOrO); ++e) tOrO(e) *= corr[(e >> 1) & 1];
      }
      to_p();
    }
    const int i = nb_hi - 1 - nb_lo, last = i % kStages;
    smem.kv.wait_full(i, 1);
    issue_pv(last);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    smem.kv.release(i);
  }

  store_forward_rows<T>(p, blk, tOrO, row_max, row_sum, 1.f, local_row, lane);
}

// Host side: Attention's checks and packed-sequence memsets around this kernel.
template <class T, int kD, int kDV>
struct AttentionFwdSm90 {
  static void launch(const PtAttnParams& q, cudaStream_t stream) {
    using F = FwdSm90<T, kD, kDV>;
    const int64_t m_blocks = (q.seqlen_q + F::kBM - 1) / F::kBM;
    if (m_blocks <= 0) return;
    auto kernel = attn_fwd_sm90_kernel<T, kD, kDV>;
    opt_in_smem(kernel, F::kSmem);
    kernel<<<dim3(static_cast<unsigned>(m_blocks), static_cast<unsigned>(q.batch), static_cast<unsigned>(q.heads_q)),
             F::kThreads, F::kSmem, stream>>>(q);
  }

  static int forward(const PtAttnParams* p, char* err, size_t err_len) {
    return Attention<T, kD, kDV>::forward_with(p, err, err_len, "attention forward (sm90)", launch);
  }
};

}  // namespace primus_turbo::kernels::attention::sm90

// Exports AttentionFwdSm90<T, D, DV>::forward as pt_attn_fwd_run.
#define PT_JIT_EXPORT_ATTENTION_SM90_FWD(T, D, DV)                                                               \
  PT_JIT_EXPORT_ABI_VERSION                                                                                     \
  extern "C" __attribute__((visibility("default"))) int pt_attn_fwd_run(const PtAttnParams* params, char* err, \
                                                                        size_t err_len) {                      \
    return primus_turbo::kernels::attention::sm90::AttentionFwdSm90<T, D, DV>::forward(params, err, err_len);  \
  }
