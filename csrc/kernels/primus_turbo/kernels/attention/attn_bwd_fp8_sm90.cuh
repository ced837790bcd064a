// FP8 flash-attention backward on Hopper: the five products of the backward on E4M3 operands
// (wgmma, float32 accumulators), for head dims 64, 96 and 128 (q/k and v alike).
//
// Operands. An 8-bit wgmma reads both shared-memory operands K-major (the reduced dimension
// contiguous), so every product that reduces over tokens needs its operand transposed in memory:
// dV += P^T dO and dK += dS^T Q (reduce over queries) read dO^T and Q^T, dQ += dS K (over keys)
// reads K^T. A quantization pass (attn_fp8_bwd_quantize_kernel) writes, per 64-row tile of every
// head, q, dout and k as K-major images plus their transposes and v as a K-major image, each tile
// with one power-of-two scale (attention_fp8_bwd_abi.h). The transposes hold a tile's rows in
// fp8::vt_slot order: P and dS then go from the score accumulators straight into the words of the
// register A operand (to_e4m3_operand), as P does in the FP8 forward. q, k and v are the
// dequantized copies the forward computed with: re-quantized, they give back the forward's bytes.
//
// P and dS change scale from block to block, so each accumulator row (a key's dK and dV, a query's
// dQ) carries a unit (RowUnits): the largest power of two its blocks needed so far to bring
// P (or dS) times the other operand's tile scale under E4M3's 448. A block that needs a larger unit
// first rescales that row of the accumulator; the epilogue multiplies by the unit. A block far
// smaller than the row's largest lands near E4M3's subnormals and loses precision, as in the
// forward.
//
// dK/dV (attn_bwd_fp8_dkdv_kernel): one CTA per (128 keys, sequence, KV head), three warpgroups.
// Warpgroup 0 produces: one thread issues bulk copies of the pre-swizzled tiles (K and V once; per
// query block Q, Q^T, dO, dO^T and the block's lse and delta) into a ring of kStages buffers.
// Consumer warpgroup w owns keys [64 w, 64 w + 64) and runs, per query block of every query head of
// the GQA group: S^T = K Q^T and dP^T = V dO^T (shared-memory operands), P^T and dS^T on the
// accumulators, dV += P^T dO^T' and dK += dS^T Q^T' (register A operands).
// dQ (attn_bwd_fp8_dq_kernel): one CTA per (128 query rows, sequence, query head); warpgroup w owns
// rows [64 w, 64 w + 64): S = Q K^T, dP = dO V^T, dQ += dS K^T' per 64-key block. Both kernels
// are deterministic (no atomics).
// Fragment map per warpgroup: accumulator value i = c0 + 2 r + 4 j is row 16 warp + lane / 4 + 8 r
// and column 8 j + 2 (lane % 4) + c0.
#pragma once

#include "primus_turbo/kernels/attention/attention_fp8_bwd_abi.h"
#include "primus_turbo/kernels/attention/attn_fwd_fp8_sm90.cuh"

namespace primus_turbo::kernels::attention::fp8_bwd {

using namespace cute;
using fp8::E;
using fp8::kE4m3Max;

constexpr int kRows = PT_ATTN_FP8_BWD_TILE_ROWS;
constexpr int kQuantThreads = 128;
constexpr int kThreads = 384;  // a producer and two consumer warpgroups

template <int kMN, int kK>
using Img = sm90::KMajorLayout<E, kMN, kK>;

__device__ __forceinline__ int64_t tile_index(int64_t b, int64_t first_token, int nb) {
  return b + first_token / kRows + nb;
}

// The smallest power of two >= x for finite x >= 0 (0 for 0; 2^-126 for a subnormal).
__device__ __forceinline__ float pow2_at_least(float x) {
  return __uint_as_float((__float_as_uint(x) + 0x7fffffu) & 0x7f800000u);
}

// One 64-row tile of a 16-bit operand (rows from src, `valid` of them real, zeros past them) into
// its E4M3 image (K-major [64, kCols]) and, with kTransposed, the transposed image (K-major
// [kCols, 64], row r at column vt_slot(r)); its dequantizing scale into *scale: a power of two at
// or above amax / 448 (0 for an all-zero tile; NaN throughout for a tile with an infinity). With
// `other` (rows of the same width, stride other_stride), dots[r] receives the dot product of the
// dequantized row r with other's row r (0 past `valid`), summed in a fixed order.
template <class T, int kCols, bool kTransposed>
__device__ __forceinline__ void quantize_tile(const T* src, int64_t stride, int valid, E* img, E* img_t, float* scale,
                                              const T* other = nullptr, int64_t other_stride = 0,
                                              float* dots = nullptr) {
  constexpr int kChunksPerRow = kCols / 8, kPerThread = kRows * kChunksPerRow / kQuantThreads;
  static_assert(kRows * kChunksPerRow % kQuantThreads == 0, "whole chunk rounds");
  __shared__ float amax_warp[kQuantThreads / 32];
  __shared__ float inv_tile, scale_tile;
  uint4 chunk[kPerThread];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = threadIdx.x + i * kQuantThreads, r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    chunk[i] = r < valid ? *reinterpret_cast<const uint4*>(src + r * stride + col) : make_uint4(0, 0, 0, 0);
    amax = fmaxf(amax, fp8::chunk_amax<T>(chunk[i]));
  }
  amax = warp_max(amax);
  if (threadIdx.x % 32 == 0) amax_warp[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = 0.f;
    for (int w = 0; w < kQuantThreads / 32; ++w) m = fmaxf(m, amax_warp[w]);
    const bool finite = m <= 3.4e38f;
    const float pow2 = finite ? fmaxf(pow2_at_least(m / kE4m3Max), 0x1p-126f) : 1.f;
    *scale = scale_tile = m == 0.f ? 0.f : pow2;
    inv_tile = finite ? 1.f / pow2 : __int_as_float(0x7fc00000);
  }
  __syncthreads();
  const float inv = inv_tile;
  Tensor tile = make_tensor(make_smem_ptr(img), Img<kRows, kCols>{});
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = threadIdx.x + i * kQuantThreads, r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const uint2 q = fp8::to_e4m3x8<T>(chunk[i], inv);
    *reinterpret_cast<uint2*>(&tile(r, col)) = q;
    chunk[i] = make_uint4(q.x, q.y, 0, 0);  // kept for the transpose and the dots
  }
  if (other != nullptr) {
    // Per chunk, then per row in chunk order: no atomics, so the same bits on every run.
    __shared__ float partial[kRows * kChunksPerRow];
    const float unit = scale_tile;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = threadIdx.x + i * kQuantThreads, r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      float acc = 0.f;
      if (r < valid) {
        const uint4 o = *reinterpret_cast<const uint4*>(other + r * other_stride + col);
        const T* ov = reinterpret_cast<const T*>(&o);
        const E* qv = reinterpret_cast<const E*>(&chunk[i]);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc = fmaf(float(qv[k]) * unit, float(ov[k]), acc);
      }
      partial[c] = acc;
    }
    __syncthreads();
    if (threadIdx.x < kRows) {
      float sum = 0.f;
      for (int c = 0; c < kChunksPerRow; ++c) sum += partial[threadIdx.x * kChunksPerRow + c];
      dots[threadIdx.x] = sum;
    }
  }
  if constexpr (kTransposed) {
    // Rows of the transposed image are columns of the tile: staged byte by byte in shared memory,
    // then written in 16-byte chunks.
    constexpr int kPitch = kRows + 16;
    __shared__ __align__(16) uint8_t staged[kCols * kPitch];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = threadIdx.x + i * kQuantThreads, r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&chunk[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) staged[(col + j) * kPitch + fp8::vt_slot(r)] = bytes[j];
    }
    __syncthreads();
    Tensor tile_t = make_tensor(make_smem_ptr(img_t), Img<kCols, kRows>{});
    for (int c = threadIdx.x; c < kCols * (kRows / 16); c += kQuantThreads) {
      const int d = c / (kRows / 16), r = (c % (kRows / 16)) * 16;
      *reinterpret_cast<uint4*>(&tile_t(d, r)) = *reinterpret_cast<const uint4*>(&staged[d * kPitch + r]);
    }
  }
}

// Grid (64-row tiles of the longer side, batch, 2 heads_q + 2 heads_kv): z picks a head of q, dout,
// k or v. dout's tiles also take their rows' lse (log2 units) and delta.
template <class T, int kD, int kDV>
__global__ void __launch_bounds__(kQuantThreads) attn_fp8_bwd_quantize_kernel(const PtAttnFp8BwdParams fp) {
  const PtAttnParams& p = fp.base;
  const int64_t b = blockIdx.y;
  const Sequence s = sequence(p, b);
  const bool packed = p.cu_seqlens_q != nullptr;
  const int nb = blockIdx.x, r0 = nb * kRows;
  int h = blockIdx.z;
  if (h < 2 * p.heads_q) {
    const bool is_do = h >= p.heads_q;
    if (is_do) h -= p.heads_q;
    if (r0 >= s.len_q) return;
    const int64_t t = tile_index(b, packed ? s.start_q : b * p.seqlen_q, nb) * p.heads_q + h;
    const int valid = min(kRows, s.len_q - r0);
    if (!is_do) {
      quantize_tile<T, kD, true>(row_at<const T>(p.q, p.q_sb, p.q_ss, p.q_sh, b, s.start_q + r0, h), p.q_ss, valid,
                                 static_cast<E*>(fp.q_tiles) + t * kRows * kD,
                                 static_cast<E*>(fp.qt_tiles) + t * kRows * kD, fp.q_scale + t);
      return;
    }
    // delta = rowsum(dout o out) from the dequantized dout: the dP it is subtracted from is computed
    // from the same values, so dS = P (dP - delta) cancels as it should (exactly 0 for a row that
    // sees one key). Attention::backward_with's 16-bit delta pass is skipped for it.
    __shared__ float delta[kRows];
    quantize_tile<T, kDV, true>(row_at<const T>(p.dout, p.do_sb, p.do_ss, p.do_sh, b, s.start_q + r0, h), p.do_ss,
                                valid, static_cast<E*>(fp.do_tiles) + t * kRows * kDV,
                                static_cast<E*>(fp.dot_tiles) + t * kRows * kDV, fp.do_scale + t,
                                row_at<const T>(p.out, p.o_sb, p.o_ss, p.o_sh, b, s.start_q + r0, h), p.o_ss, delta);
    if (threadIdx.x < kRows) {
      const int r = threadIdx.x;
      const bool in = r < valid;
      const int64_t off = lse_offset(p, b, h, s.start_q + r0 + r);
      fp.lse2_tiles[t * kRows + r] = in ? p.lse[off] * kLog2e : INFINITY;
      fp.delta_tiles[t * kRows + r] = delta[r];
      if (in) p.delta[off] = delta[r];  // for the dQ kernel and dsink
    }
    return;
  }
  h -= 2 * p.heads_q;
  if (r0 >= s.len_k) return;
  const bool is_v = h >= p.heads_kv;
  if (is_v) h -= p.heads_kv;
  const int64_t t = tile_index(b, packed ? s.start_k : b * p.seqlen_k, nb) * p.heads_kv + h;
  const int valid = min(kRows, s.len_k - r0);
  if (!is_v)
    quantize_tile<T, kD, true>(row_at<const T>(p.k, p.k_sb, p.k_ss, p.k_sh, b, s.start_k + r0, h), p.k_ss, valid,
                               static_cast<E*>(fp.k_tiles) + t * kRows * kD,
                               static_cast<E*>(fp.kt_tiles) + t * kRows * kD, fp.k_scale + t);
  else
    quantize_tile<T, kDV, false>(row_at<const T>(p.v, p.v_sb, p.v_ss, p.v_sh, b, s.start_k + r0, h), p.v_ss, valid,
                                 static_cast<E*>(fp.v_tiles) + t * kRows * kDV, nullptr, fp.v_scale + t);
}

// The units of this thread's two accumulator rows (see the top of the file).
struct RowUnits {
  float unit[2] = {0.f, 0.f};

  // amax[r]: the largest |value| of row r among this thread's values of the block (the quad's
  // maximum is taken here); scale: the other operand's tile scale. Grows the units to cover
  // amax * scale / 448, rescaling the accumulator rows that grow, and gives the factors that turn
  // the block's values into E4M3 operand values.
  template <class Acc>
  __device__ __forceinline__ void cover(const float (&amax)[2], float scale, Acc& acc, float (&to_fp8)[2]) {
    float grow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float need = pow2_at_least(quad_max(amax[r]) * scale * (1.f / kE4m3Max));
      grow[r] = need > unit[r] ? unit[r] / need : 1.f;  // a row still at unit 0 holds zeros
      unit[r] = fmaxf(unit[r], need);
      to_fp8[r] = unit[r] > 0.f ? scale / unit[r] : 0.f;
    }
    if (grow[0] != 1.f || grow[1] != 1.f) {
#pragma unroll
      for (int e = 0; e < size(acc); ++e) acc(e) *= grow[(e >> 1) & 1];
    }
  }
};

// 64 columns of a warpgroup's accumulator (values times f[row]) into the 8 words of an 8-bit wgmma
// A operand: word w = r + 2 h + 4 kb holds row +8r's columns 32 kb + 16 h in vt_slot order, the
// accumulator pairs at columns 32 kb + 16 h + {2q, 2q + 1} and {2q + 8, 2q + 9} (q = lane % 4).
template <class Acc, class Words>
__device__ __forceinline__ void to_e4m3_operand(const Acc& acc, const float (&f)[2], Words& words) {
#pragma unroll
  for (int w = 0; w < size(words); ++w) {
    const int r = w & 1, h = (w >> 1) & 1, kb = w >> 2, e0 = 2 * r + 16 * kb + 8 * h;
    const uint32_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(acc(e0) * f[r], acc(e0 + 1) * f[r]), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(acc(e0 + 4) * f[r], acc(e0 + 5) * f[r]), __NV_SATFINITE, __NV_E4M3);
    words(w) = lo | (hi << 16);
  }
}

// A single-warpgroup wgmma of shape 64 x kN x kK: shared-memory operands, or a register A.
template <int kN, int kK>
using MmaSS = decltype(make_tiled_mma(GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kN>, Int<kK>>>(),
                                      Layout<Shape<_1, _1, _1>>{}));
template <int kN, int kK>
using MmaRS = decltype(make_tiled_mma(GMMA::rs_op_selector<E, E, float, Shape<_64, Int<kN>, Int<kK>>>(),
                                      Layout<Shape<_1, _1, _1>>{}));

template <int kD, int kDV>
constexpr bool fp8_backward_dims() {
  return kD == kDV && (kD == 64 || kD == 96 || kD == 128);
}

using Full = cutlass::arch::ClusterTransactionBarrier;
using Empty = cutlass::arch::ClusterBarrier;

// One bulk copy of `bytes` from global into shared memory, counted on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, int bytes, uint64_t* bar) {
  SM90_BULK_COPY_G2S::copy(src, bar, dst, bytes);
}

// The barriers of both kernels: `once` for the tiles a CTA keeps (one fill), and a ring of kStages
// buffers, each filled by the producer thread's bulk copies (a transaction barrier) and released by
// every consumer thread. Use i of the ring: buffer i % kStages, phase (i / kStages) & 1.
template <int kStages>
struct TileBarriers {
  uint64_t once, full[kStages], empty[kStages];

  __device__ __forceinline__ void init() {
    Full::init(&once, 1);
    for (int st = 0; st < kStages; ++st) {
      Full::init(&full[st], 1);
      Empty::init(&empty[st], kThreads - 128);
    }
    cutlass::arch::fence_barrier_init();
  }
  // Producer: wait until use i's buffer is free, then announce the bytes its copies will bring.
  __device__ __forceinline__ uint64_t* fill(int i, int bytes) {
    if (i >= kStages) Empty::wait(&empty[i % kStages], ((i / kStages) - 1) & 1);
    Full::arrive_and_expect_tx(&full[i % kStages], bytes);
    return &full[i % kStages];
  }
  __device__ __forceinline__ void wait_full(int i) { Full::wait(&full[i % kStages], (i / kStages) & 1); }
  __device__ __forceinline__ void release(int i) { Empty::arrive(&empty[i % kStages]); }
};

template <int kD, int kDV>
struct DkdvFp8 {
  static_assert(fp8_backward_dims<kD, kDV>(), "FP8 backward head dims");
  static constexpr int kBN = 2 * kRows, kBM = kRows, kStages = 3;
  static constexpr int kKBytes = kRows * kD, kVBytes = kRows * kDV, kQBytes = kBM * kD, kDoBytes = kBM * kDV;
  static constexpr int kStageBytes = 2 * kQBytes + 2 * kDoBytes + 2 * kBM * static_cast<int>(sizeof(float));
  using MmaS = MmaSS<kBM, kD>;    // S^T  = K Q^T      (64 keys x 64 queries)
  using MmaDp = MmaSS<kBM, kDV>;  // dP^T = V dO^T
  using MmaDv = MmaRS<kDV, kBM>;  // dV  += P^T (dO^T)^T
  using MmaDk = MmaRS<kD, kBM>;   // dK  += dS^T (Q^T)^T

  struct Smem {
    array_aligned<E, cosize_v<Img<kRows, kD>>, 1024> k[2];
    array_aligned<E, cosize_v<Img<kRows, kDV>>, 1024> v[2];
    array_aligned<E, cosize_v<Img<kBM, kD>>, 1024> q[kStages];
    array_aligned<E, cosize_v<Img<kD, kBM>>, 1024> qt[kStages];
    array_aligned<E, cosize_v<Img<kBM, kDV>>, 1024> dout[kStages];
    array_aligned<E, cosize_v<Img<kDV, kBM>>, 1024> dot[kStages];
    alignas(16) float lse2[kStages][kBM];
    alignas(16) float delta[kStages][kBM];
    TileBarriers<kStages> bars;  // once: K and V
  };
  static constexpr size_t kSmem = sizeof(Smem);
  static_assert(kSmem <= 227 * 1024, "shared memory of a CTA");
};

template <class T, int kD, int kDV>
__global__ void __launch_bounds__(kThreads, 1) attn_bwd_fp8_dkdv_kernel(const PtAttnFp8BwdParams fp) {
  using F = DkdvFp8<kD, kDV>;
  constexpr int kBN = F::kBN, kBM = F::kBM, kStages = F::kStages;
  const PtAttnParams& p = fp.base;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<typename F::Smem*>(smem_raw);

  const KeyBlock<kBN, kBM> blk(p);
  if (blk.valid_k <= 0) return;
  const int n0 = blk.n0, hk = blk.hk, valid_k = blk.valid_k, iters = blk.iters;
  const int64_t b = blk.b;
  const Sequence& s = blk.s;
  const Mask& mask = blk.mask;
  const bool packed = p.cu_seqlens_q != nullptr;
  const int64_t q_first = packed ? s.start_q : b * p.seqlen_q, k_first = packed ? s.start_k : b * p.seqlen_k;
  // Warpgroup w's key tile; past the sequence the first one's again (its rows are computed, never
  // stored). Iteration it's query tile: blk.head_of(it)'s block at blk.row_of(it).
  auto key_tile = [&](int w) {
    return (tile_index(b, k_first, n0 / kRows) + (w == 1 && valid_k > kRows ? 1 : 0)) * p.heads_kv + hk;
  };
  auto q_tile = [&](int it) { return tile_index(b, q_first, blk.row_of(it) / kBM) * p.heads_q + blk.head_of(it); };

  if (threadIdx.x == 0) smem.bars.init();
  __syncthreads();

  if (threadIdx.x < 128) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (threadIdx.x == 0) {
      Full::arrive_and_expect_tx(&smem.bars.once, 2 * (F::kKBytes + F::kVBytes));
      for (int w = 0; w < 2; ++w) {
        const int64_t t = key_tile(w);
        bulk_copy(smem.k[w].data(), static_cast<const E*>(fp.k_tiles) + t * F::kKBytes, F::kKBytes, &smem.bars.once);
        bulk_copy(smem.v[w].data(), static_cast<const E*>(fp.v_tiles) + t * F::kVBytes, F::kVBytes, &smem.bars.once);
      }
      for (int it = 0; it < iters; ++it) {
        const int st = it % kStages;
        uint64_t* bar = smem.bars.fill(it, F::kStageBytes);
        const int64_t t = q_tile(it);
        bulk_copy(smem.q[st].data(), static_cast<const E*>(fp.q_tiles) + t * F::kQBytes, F::kQBytes, bar);
        bulk_copy(smem.qt[st].data(), static_cast<const E*>(fp.qt_tiles) + t * F::kQBytes, F::kQBytes, bar);
        bulk_copy(smem.dout[st].data(), static_cast<const E*>(fp.do_tiles) + t * F::kDoBytes, F::kDoBytes, bar);
        bulk_copy(smem.dot[st].data(), static_cast<const E*>(fp.dot_tiles) + t * F::kDoBytes, F::kDoBytes, bar);
        bulk_copy(smem.lse2[st], fp.lse2_tiles + t * kBM, kBM * sizeof(float), bar);
        bulk_copy(smem.delta[st], fp.delta_tiles + t * kBM, kBM * sizeof(float), bar);
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<240>();
  const int tid = threadIdx.x - 128, wg = tid / 128, wt = tid % 128, warp = wt / 32, lane = tid % 32;
  typename F::MmaS mma_s;
  typename F::MmaDp mma_dp;
  typename F::MmaDv mma_dv;
  typename F::MmaDk mma_dk;
  auto thr_s = mma_s.get_thread_slice(wt);
  auto thr_dp = mma_dp.get_thread_slice(wt);
  auto thr_dv = mma_dv.get_thread_slice(wt);
  auto thr_dk = mma_dk.get_thread_slice(wt);
  Tensor tSrK = thr_s.partition_fragment_A(make_tensor(make_smem_ptr(smem.k[wg].data()), Img<kRows, kD>{}));
  Tensor tDPrV = thr_dp.partition_fragment_A(make_tensor(make_smem_ptr(smem.v[wg].data()), Img<kRows, kDV>{}));
  Tensor tSrS = partition_fragment_C(mma_s, Shape<_64, Int<kBM>>{});
  Tensor tDPrDP = partition_fragment_C(mma_dp, Shape<_64, Int<kBM>>{});
  Tensor tDVrDV = partition_fragment_C(mma_dv, Shape<_64, Int<kDV>>{});
  Tensor tDKrDK = partition_fragment_C(mma_dk, Shape<_64, Int<kD>>{});
  Tensor tDVrP = make_tensor<E>(partition_shape_A(mma_dv, Shape<_64, Int<kBM>>{}));
  Tensor tDKrDS = make_tensor<E>(partition_shape_A(mma_dk, Shape<_64, Int<kBM>>{}));
  Tensor p_words = recast<uint32_t>(tDVrP);
  Tensor ds_words = recast<uint32_t>(tDKrDS);
  static_assert(decltype(size(tSrS))::value == kBM / 2 && decltype(size(p_words))::value == 8, "64 x 64 a WG");
  clear(tDVrDV);
  clear(tDKrDK);

  const int key_lo = n0 + wg * kRows, key_base = key_lo + warp * 16 + lane / 4;  // + 8 r: this thread's keys
  const int64_t kt = key_tile(wg);
  const float ks = fp.k_scale[kt], vs = fp.v_scale[kt];
  const float scale_log2 = p.softmax_scale * kLog2e * ks;
  RowUnits unit_v, unit_k;

  Full::wait(&smem.bars.once, 0);
  for (int it = 0; it < iters; ++it) {
    const int st = it % kStages, m0 = blk.row_of(it);
    const int64_t t = q_tile(it);
    const float qs = fp.q_scale[t], dos = fp.do_scale[t];
    smem.bars.wait_full(it);
    Tensor sQ = make_tensor(make_smem_ptr(smem.q[st].data()), Img<kBM, kD>{});
    Tensor sDo = make_tensor(make_smem_ptr(smem.dout[st].data()), Img<kBM, kDV>{});
    Tensor sQt = make_tensor(make_smem_ptr(smem.qt[st].data()), Img<kD, kBM>{});
    Tensor sDot = make_tensor(make_smem_ptr(smem.dot[st].data()), Img<kDV, kBM>{});
    sm90::issue_ss_gemm(mma_s, tSrK, thr_s.partition_fragment_B(sQ), tSrS);
    sm90::issue_ss_gemm(mma_dp, tDPrV, thr_dp.partition_fragment_B(sDo), tDPrDP);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    warpgroup_fence_operand(tDPrDP);

    // P^T = exp2(S^T scale - lse) and dS^T = P^T o (dP^T - delta), in place of S^T and dP^T (rows are
    // keys, columns this block's queries), with their row maxima.
    const float c_s = scale_log2 * qs, c_dp = vs * dos;
    const float* lse2 = smem.lse2[st];
    const float* delta = smem.delta[st];
    float p_max[2] = {0.f, 0.f}, ds_max[2] = {0.f, 0.f};
    auto probs_and_grads = [&](auto masked) {
#pragma unroll
      for (int j = 0; j < size(tSrS) / 4; ++j) {
        const int col = 8 * j + 2 * (lane % 4);
        const float2 l = *reinterpret_cast<const float2*>(lse2 + col), d = *reinterpret_cast<const float2*>(delta + col);
        const float ls[2] = {l.x, l.y}, ds_off[2] = {d.x, d.y};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int c0 = 0; c0 < 2; ++c0) {
            const int i = 4 * j + 2 * r + c0;
            const float e2 = ex2(fmaf(tSrS(i), c_s, -ls[c0]));
            const float pr = (!decltype(masked)::value || mask.visible(m0 + col + c0, key_base + 8 * r)) ? e2 : 0.f;
            const float ds = pr * fmaf(tDPrDP(i), c_dp, -ds_off[c0]);
            tSrS(i) = pr;
            tDPrDP(i) = ds;
            p_max[r] = fmaxf(p_max[r], pr);
            ds_max[r] = fmaxf(ds_max[r], fabsf(ds));
          }
        }
      }
    };
    if (mask.all_visible(m0, m0 + kBM, key_lo, key_lo + kRows))
      probs_and_grads(std::false_type{});
    else
      probs_and_grads(std::true_type{});
    float to_p[2], to_ds[2];
    unit_v.cover(p_max, dos, tDVrDV, to_p);
    unit_k.cover(ds_max, qs, tDKrDK, to_ds);
    to_e4m3_operand(tSrS, to_p, p_words);
    to_e4m3_operand(tDPrDP, to_ds, ds_words);
    sm90::issue_rs_gemm(mma_dv, tDVrP, thr_dv.partition_fragment_B(sDot), tDVrDV);
    sm90::issue_rs_gemm(mma_dk, tDKrDS, thr_dk.partition_fragment_B(sQt), tDKrDK);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tDVrDV);
    warpgroup_fence_operand(tDKrDK);
    smem.bars.release(it);
  }

  T* dk_out = row_at<T>(p.dk, p.dk_sb, p.dk_ss, p.dk_sh, b, s.start_k + n0, hk);
  T* dv_out = row_at<T>(p.dv, p.dv_sb, p.dv_ss, p.dv_sh, b, s.start_k + n0, hk);
  const int local_key = wg * kRows + warp * 16 + lane / 4;
  const float dk_scale[2] = {unit_k.unit[0] * p.softmax_scale, unit_k.unit[1] * p.softmax_scale};
  sm90::store_rows_sm90<T>(tDKrDK, dk_out, p.dk_ss, local_key, valid_k, lane, dk_scale);
  sm90::store_rows_sm90<T>(tDVrDV, dv_out, p.dv_ss, local_key, valid_k, lane, unit_v.unit);
}

template <int kD, int kDV>
struct DqFp8 {
  static_assert(fp8_backward_dims<kD, kDV>(), "FP8 backward head dims");
  static constexpr int kBM = 2 * kRows, kBN = kRows, kStages = 4;
  static constexpr int kQBytes = kRows * kD, kDoBytes = kRows * kDV, kKBytes = kBN * kD, kVBytes = kBN * kDV;
  static constexpr int kStageBytes = 2 * kKBytes + kVBytes;
  using MmaS = MmaSS<kBN, kD>;    // S  = Q K^T   (64 queries x 64 keys)
  using MmaDp = MmaSS<kBN, kDV>;  // dP = dO V^T
  using MmaDq = MmaRS<kD, kBN>;   // dQ += dS (K^T)^T

  struct Smem {
    array_aligned<E, cosize_v<Img<kRows, kD>>, 1024> q[2];
    array_aligned<E, cosize_v<Img<kRows, kDV>>, 1024> dout[2];
    array_aligned<E, cosize_v<Img<kBN, kD>>, 1024> k[kStages];
    array_aligned<E, cosize_v<Img<kD, kBN>>, 1024> kt[kStages];
    array_aligned<E, cosize_v<Img<kBN, kDV>>, 1024> v[kStages];
    TileBarriers<kStages> bars;  // once: Q and dO
  };
  static constexpr size_t kSmem = sizeof(Smem);
  static_assert(kSmem <= 227 * 1024, "shared memory of a CTA");
};

template <class T, int kD, int kDV>
__global__ void __launch_bounds__(kThreads, 1) attn_bwd_fp8_dq_kernel(const PtAttnFp8BwdParams fp) {
  using F = DqFp8<kD, kDV>;
  constexpr int kBM = F::kBM, kBN = F::kBN, kStages = F::kStages;
  const PtAttnParams& p = fp.base;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<typename F::Smem*>(smem_raw);

  const QueryBlock<kBM, kBN> blk(p);
  if (blk.valid_q <= 0) return;
  const Mask& mask = blk.mask;
  const int m0 = blk.m0, valid_q = blk.valid_q, nb_lo = blk.nb_lo, nb_hi = blk.nb_hi;
  const bool packed = p.cu_seqlens_q != nullptr;
  const int64_t q_first = packed ? blk.s.start_q : blk.b * p.seqlen_q;
  const int64_t k_first = packed ? blk.s.start_k : blk.b * p.seqlen_k;
  // Warpgroup w's query tile; past the sequence the first one's again (computed, never stored).
  auto query_tile = [&](int w) {
    return (tile_index(blk.b, q_first, m0 / kRows) + (w == 1 && valid_q > kRows ? 1 : 0)) * p.heads_q + blk.h;
  };
  auto key_tile = [&](int nb) { return tile_index(blk.b, k_first, nb) * p.heads_kv + blk.hk; };

  if (threadIdx.x == 0) smem.bars.init();
  __syncthreads();

  if (threadIdx.x < 128) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (threadIdx.x == 0) {
      Full::arrive_and_expect_tx(&smem.bars.once, 2 * (F::kQBytes + F::kDoBytes));
      for (int w = 0; w < 2; ++w) {
        const int64_t t = query_tile(w);
        bulk_copy(smem.q[w].data(), static_cast<const E*>(fp.q_tiles) + t * F::kQBytes, F::kQBytes, &smem.bars.once);
        bulk_copy(smem.dout[w].data(), static_cast<const E*>(fp.do_tiles) + t * F::kDoBytes, F::kDoBytes,
                  &smem.bars.once);
      }
      for (int nb = nb_lo; nb < nb_hi; ++nb) {
        const int i = nb - nb_lo, st = i % kStages;
        uint64_t* bar = smem.bars.fill(i, F::kStageBytes);
        const int64_t t = key_tile(nb);
        bulk_copy(smem.k[st].data(), static_cast<const E*>(fp.k_tiles) + t * F::kKBytes, F::kKBytes, bar);
        bulk_copy(smem.kt[st].data(), static_cast<const E*>(fp.kt_tiles) + t * F::kKBytes, F::kKBytes, bar);
        bulk_copy(smem.v[st].data(), static_cast<const E*>(fp.v_tiles) + t * F::kVBytes, F::kVBytes, bar);
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<240>();
  const int tid = threadIdx.x - 128, wg = tid / 128, wt = tid % 128, warp = wt / 32, lane = tid % 32;
  typename F::MmaS mma_s;
  typename F::MmaDp mma_dp;
  typename F::MmaDq mma_dq;
  auto thr_s = mma_s.get_thread_slice(wt);
  auto thr_dp = mma_dp.get_thread_slice(wt);
  auto thr_dq = mma_dq.get_thread_slice(wt);
  Tensor tSrQ = thr_s.partition_fragment_A(make_tensor(make_smem_ptr(smem.q[wg].data()), Img<kRows, kD>{}));
  Tensor tDPrDo = thr_dp.partition_fragment_A(make_tensor(make_smem_ptr(smem.dout[wg].data()), Img<kRows, kDV>{}));
  Tensor tSrS = partition_fragment_C(mma_s, Shape<_64, Int<kBN>>{});
  Tensor tDPrDP = partition_fragment_C(mma_dp, Shape<_64, Int<kBN>>{});
  Tensor tDQrDQ = partition_fragment_C(mma_dq, Shape<_64, Int<kD>>{});
  Tensor tDQrDS = make_tensor<E>(partition_shape_A(mma_dq, Shape<_64, Int<kBN>>{}));
  Tensor ds_words = recast<uint32_t>(tDQrDS);
  static_assert(decltype(size(tSrS))::value == kBN / 2 && decltype(size(ds_words))::value == 8, "64 x 64 a WG");
  clear(tDQrDQ);

  const int local_row = wg * kRows + warp * 16 + lane / 4;  // + 8 r: this thread's two rows in the block
  const int64_t qt = query_tile(wg);
  const float qs = fp.q_scale[qt], dos = fp.do_scale[qt];
  const float scale_log2 = p.softmax_scale * kLog2e * qs;
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) lse_delta_at(p, blk.b, blk.h, blk.s, m0 + local_row + 8 * r, lse2[r], delta[r]);
  RowUnits unit_q;

  Full::wait(&smem.bars.once, 0);
  for (int nb = nb_lo; nb < nb_hi; ++nb) {
    const int i = nb - nb_lo, st = i % kStages, n0 = nb * kBN;
    const int64_t t = key_tile(nb);
    const float ks = fp.k_scale[t], vs = fp.v_scale[t];
    smem.bars.wait_full(i);
    Tensor sK = make_tensor(make_smem_ptr(smem.k[st].data()), Img<kBN, kD>{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v[st].data()), Img<kBN, kDV>{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.kt[st].data()), Img<kD, kBN>{});
    sm90::issue_ss_gemm(mma_s, tSrQ, thr_s.partition_fragment_B(sK), tSrS);
    sm90::issue_ss_gemm(mma_dp, tDPrDo, thr_dp.partition_fragment_B(sV), tDPrDP);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    warpgroup_fence_operand(tDPrDP);
    const float c_s = scale_log2 * ks, c_dp = dos * vs;
    float ds_max[2] = {0.f, 0.f};
    auto grads = [&](auto masked) {
#pragma unroll
      for (int e = 0; e < size(tSrS); ++e) {
        const int c0 = e & 1, r = (e >> 1) & 1, j = e >> 2;
        const float e2 = ex2(fmaf(tSrS(e), c_s, -lse2[r]));
        const bool vis =
            !decltype(masked)::value || mask.visible(m0 + local_row + 8 * r, n0 + 8 * j + 2 * (lane % 4) + c0);
        const float ds = (vis ? e2 : 0.f) * fmaf(tDPrDP(e), c_dp, -delta[r]);
        tSrS(e) = ds;
        ds_max[r] = fmaxf(ds_max[r], fabsf(ds));
      }
    };
    if (mask.all_visible(m0 + wg * kRows, m0 + wg * kRows + kRows, n0, n0 + kBN))
      grads(std::false_type{});
    else
      grads(std::true_type{});
    float to_ds[2];
    unit_q.cover(ds_max, ks, tDQrDQ, to_ds);
    to_e4m3_operand(tSrS, to_ds, ds_words);
    sm90::issue_rs_gemm(mma_dq, tDQrDS, thr_dq.partition_fragment_B(sKt), tDQrDQ);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tDQrDQ);
    smem.bars.release(i);
  }

  const float dq_scale[2] = {unit_q.unit[0] * p.softmax_scale, unit_q.unit[1] * p.softmax_scale};
  sm90::store_rows_sm90<T>(tDQrDQ, blk.template rows<T>(p.dq, p.dq_sb, p.dq_ss, p.dq_sh), p.dq_ss, local_row,
                           valid_q, lane, dq_scale);
}

// Host side: Attention's checks, delta, packed-sequence memsets and dsink around the quantization
// and the two kernels.
template <class T, int kD, int kDV>
struct AttentionFp8Bwd {
  static int backward(const PtAttnFp8BwdParams* fp, char* err, size_t err_len) {
    const PtAttnParams& base = fp->base;
    if (2 * int64_t{base.heads_q} + 2 * int64_t{base.heads_kv} > 65535) {
      snprintf(err, err_len, "FP8 attention backward: %d query and %d KV heads exceed the launch limit", base.heads_q,
               base.heads_kv);
      return 1;
    }
    // The quantization (first in the dK/dV step) writes delta from the dequantized dout.
    auto dkdv = [fp](const PtAttnParams& p, unsigned batch, cudaStream_t stream) {
      const int64_t rows = p.seqlen_q > p.seqlen_k ? p.seqlen_q : p.seqlen_k;
      const int64_t tiles = (rows + kRows - 1) / kRows;
      if (tiles <= 0) return;
      attn_fp8_bwd_quantize_kernel<T, kD, kDV>
          <<<dim3(static_cast<unsigned>(tiles), batch, static_cast<unsigned>(2 * p.heads_q + 2 * p.heads_kv)),
             kQuantThreads, 0, stream>>>(*fp);
      using F = DkdvFp8<kD, kDV>;
      const int64_t n_blocks = (p.seqlen_k + F::kBN - 1) / F::kBN;
      if (n_blocks <= 0) return;
      auto kernel = attn_bwd_fp8_dkdv_kernel<T, kD, kDV>;
      opt_in_smem(kernel, F::kSmem);
      kernel<<<dim3(static_cast<unsigned>(n_blocks), batch, static_cast<unsigned>(p.heads_kv)), kThreads, F::kSmem,
               stream>>>(*fp);
    };
    auto dq = [fp](const PtAttnParams& p, unsigned batch, cudaStream_t stream) {
      using F = DqFp8<kD, kDV>;
      const int64_t m_blocks = (p.seqlen_q + F::kBM - 1) / F::kBM;
      if (m_blocks <= 0) return;
      auto kernel = attn_bwd_fp8_dq_kernel<T, kD, kDV>;
      opt_in_smem(kernel, F::kSmem);
      kernel<<<dim3(static_cast<unsigned>(m_blocks), batch, static_cast<unsigned>(p.heads_q)), kThreads, F::kSmem,
               stream>>>(*fp);
    };
    return Attention<T, kD, kDV>::backward_with(&base, err, err_len, dkdv, dq, /*delta_pass=*/false);
  }
};

}  // namespace primus_turbo::kernels::attention::fp8_bwd

// Exports AttentionFp8Bwd<T, D, DV>::backward as pt_attn_fp8_bwd_run.
#define PT_JIT_EXPORT_ATTENTION_FP8_BWD(T, D, DV)                                                                      \
  PT_JIT_EXPORT_ABI_VERSION                                                                                            \
  extern "C" __attribute__((visibility("default"))) int pt_attn_fp8_bwd_run(const PtAttnFp8BwdParams* params,        \
                                                                            char* err, size_t err_len) {              \
    return primus_turbo::kernels::attention::fp8_bwd::AttentionFp8Bwd<T, D, DV>::backward(params, err, err_len);     \
  }
