// FP8 flash-attention forward on Hopper: blockwise E4M3 quantization of q, k and v, then a
// warp-specialized wgmma kernel that reads the quantized tiles with bulk copies.
//
// Quantization (attn_fp8_quantize_kernel): one CTA per (128-row tile, sequence, kv head) stages
// the tile of k and of v in shared memory; for each it takes the amax of each 64-row half (or of
// the whole tile, scale_rows = 128), scales it into E4M3's 448 by a power of two and writes the
// tile in the byte image the forward's shared memory wants (K-major, swizzled as wgmma reads it; V
// transposed so that keys run along its rows, the K-major B operand of P V, in vt_slot's key
// order). Rows past the sequence are zeros. The tile indices are attention_fp8_abi.h's. On
// request it also writes the dequantized 16-bit operands for the backward. Q's tiles, each read by
// one forward CTA, are quantized by that CTA's consumers in shared memory (quantize_q_rows, the
// same rule): they never go through memory.
//
// Forward (attn_fwd_fp8_kernel): one CTA per (128 query rows, sequence, query head), three
// warpgroups. Warpgroup 0 is the producer: one thread issues a 1-D bulk copy per K or V tile (a
// tile is contiguous, already swizzled, so no tensor map is needed) into a ring of kStages buffers,
// each signalled by a transaction barrier and released by an "empty" barrier. Warpgroups 1 and 2
// each own 64 query rows: S = Q K^T (SS wgmma, E4M3 in, float out), the online softmax on the
// accumulators with the q and k scales folded into the exponent's factor, then P (scaled by 256,
// E4M3's headroom, and by the v scale of its key half) converted in registers into the A operand of
// O += P V^T (RS wgmma; V^T's key order makes the accumulator's pairs the operand's words). V's
// blocks have different scales: O is kept in units of the largest v scale seen so far (vref),
// rescaled with the softmax correction when a larger one arrives, and P carries each block's v
// scale / vref (<= 1). The two consumer warpgroups run unsynchronized, so one's softmax overlaps
// the other's products. A limit of this scheme: a V block whose scale is 2^10 or more below the
// largest seen by the same CTA gets P values near E4M3's subnormal range, so a row that attends
// mostly to such keys loses precision (its output is small against the block's others).
#pragma once

#include <cuda_fp8.h>

#include <type_traits>
#include <cutlass/arch/reg_reconfig.h>

#include <cute/arch/copy_sm90_tma.hpp>

#include "primus_turbo/kernels/attention/attention_fp8_abi.h"
#include "primus_turbo/kernels/attention/attn_fp8_tile_map.h"
#include "primus_turbo/kernels/attention/attn_fwd_sm90.cuh"
#include "primus_turbo/kernels/attention/warp_mma.cuh"

namespace primus_turbo::kernels::attention::fp8 {

using namespace cute;

using E = cutlass::float_e4m3_t;
constexpr float kE4m3Max = 448.f;
constexpr float kPScale = 256.f;  // P in [0, 1] scaled into E4M3's normal range (max 448)

template <int kMN, int kK>
using KMajorLayout = sm90::KMajorLayout<E, kMN, kK>;

__device__ __forceinline__ int64_t tile_index(int64_t b, int64_t first_token, int nb) {
  return b + first_token / kTileRows + nb;
}

template <int kD, int kDV>
struct Fp8Tiles {
  using LayoutQK = KMajorLayout<kTileRows, kD>;   // [rows, head dim]
  using LayoutVt = KMajorLayout<kDV, kTileRows>;  // [head dim of v, keys]
  static constexpr int kQKBytes = kTileRows * kD, kVtBytes = kDV * kTileRows;
};

// 8 values of a 16-bit chunk times `inv`, as 8 E4M3 bytes (the hardware conversion saturates, so
// a block with an infinite value gets inv = NaN from quantize_tile: it shows in the output as it
// would in 16 bits instead of turning into 448).
template <class T>
__device__ __forceinline__ uint2 to_e4m3x8(const uint4& chunk, float inv) {
  const T* x = reinterpret_cast<const T*>(&chunk);
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(float(x[4 * i]) * inv, float(x[4 * i + 1]) * inv),
                                                 __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(float(x[4 * i + 2]) * inv, float(x[4 * i + 3]) * inv),
                                                 __NV_SATFINITE, __NV_E4M3);
    w[i] = lo | (hi << 16);
  }
  return make_uint2(w[0], w[1]);
}

template <class T>
__device__ __forceinline__ float chunk_amax(const uint4& chunk) {
  const T* x = reinterpret_cast<const T*>(&chunk);
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(float(x[i])));
  return m;
}

// 8 E4M3 bytes times `scale`, as 8 16-bit values: what the forward computes with (exact in bf16;
// fp16 saturates at its largest finite value, which a rounded-up amax near 65504 can exceed).
template <class T>
__device__ __forceinline__ uint4 from_e4m3x8(const uint2& q, float scale) {
  const E* x = reinterpret_cast<const E*>(&q);
  uint4 out;
  T* y = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float f = float(x[i]) * scale;
    if constexpr (std::is_same_v<T, __half>) {
      if (fabsf(f) > 65504.f) f = copysignf(65504.f, f);  // NaN stays NaN
    }
    y[i] = T(f);
  }
  return out;
}

// The scale of a block whose largest magnitude is amax, and the factor that quantizes it: a power
// of two at or above amax / 448, so dequantized values are exact in bf16 (and in fp16 within its
// normal range) and the backward's scores are the forward's. An all-zero block (rows past the
// sequence too) gets scale 0, so it never inflates the forward's running v scale; the exponent
// stays >= -126 (a subnormal scale would make 1 / scale infinite); a block holding an infinity
// is NaN throughout.
__device__ __forceinline__ void block_scale(float amax, float& scale, float& inv) {
  const bool finite = amax <= 3.4e38f, zero = amax == 0.f;
  const float pow2 = finite && !zero ? exp2f(fmaxf(ceilf(log2f(amax / kE4m3Max)), -126.f)) : 1.f;
  scale = zero ? 0.f : pow2;
  inv = finite ? 1.f / pow2 : __int_as_float(0x7fc00000);
}

// Column j of four rows' E4M3 bytes (a quad, see TileChunks) as one word: 4 x 4 byte transposes.
__device__ __forceinline__ void quad_columns(const uint2 (&q)[4], uint32_t (&col)[8]) {
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const uint32_t a = w ? q[0].y : q[0].x, b = w ? q[1].y : q[1].x;
    const uint32_t c = w ? q[2].y : q[2].x, d = w ? q[3].y : q[3].x;
    const uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);  // a0 b0 a1 b1 / a2 b2 a3 b3
    const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
    col[4 * w + 0] = __byte_perm(ab_lo, cd_lo, 0x5410);
    col[4 * w + 1] = __byte_perm(ab_lo, cd_lo, 0x7632);
    col[4 * w + 2] = __byte_perm(ab_hi, cd_hi, 0x5410);
    col[4 * w + 3] = __byte_perm(ab_hi, cd_hi, 0x7632);
  }
}

// Issues the asynchronous copies of one 128 x kCols tile of a 16-bit operand (rows from src, `valid`
// of them real; the rest zero-filled) into `staged` (row-major, kCols values a row), as one group.
template <class T, int kCols>
__device__ __forceinline__ void stage_tile(const T* src, int64_t stride, int valid, T* staged) {
  using Rows = TileChunks<kCols, false>;
#pragma unroll
  for (int i = 0; i < Rows::kPerThread; ++i) {
    int r, col;
    Rows::at(threadIdx.x, i, r, col);
    cp_async16(staged + r * kCols + col, r < valid ? src + r * stride + col : src, r < valid);
  }
  cp_async_commit();
}

// A staged tile (stage_tile; kPending groups issued after it may still be in flight) into its E4M3
// image at dst (layout: Layout, element (row, col), or (col, vt_slot(row)) with kTransposed), the
// two half scales into scale[0..1], and, unless deq is null, the dequantized rows into deq (row
// stride deq_stride): the operands whose gradients the backward computes. Staging through shared
// memory keeps no register busy across the amax barrier, and the next tile's copies run meanwhile.
template <class T, int kCols, bool kTransposed, class Layout, int kPending>
__device__ __forceinline__ void quantize_tile(const T* staged, int valid, E* dst, float* scale, int scale_rows, T* deq,
                                              int64_t deq_stride) {
  using Chunks = TileChunks<kCols, kTransposed>;
  using Rows = TileChunks<kCols, false>;  // amax goes row by row
  __shared__ float amax_warp[kQuantThreads / 32][2];
  __shared__ float inv_half[2], scale_half[2];
  cp_async_wait<kPending>();
  __syncthreads();
  float amax[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < Rows::kPerThread; ++i) {
    int r, col;
    Rows::at(threadIdx.x, i, r, col);
    const float m = chunk_amax<T>(*reinterpret_cast<const uint4*>(staged + r * kCols + col));
    if (r < 64)
      amax[0] = fmaxf(amax[0], m);
    else
      amax[1] = fmaxf(amax[1], m);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m = warp_max(amax[h]);
    if (lane == 0) amax_warp[warp][h] = m;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m[2] = {0.f, 0.f};
    for (int w = 0; w < kQuantThreads / 32; ++w)
      m[0] = fmaxf(m[0], amax_warp[w][0]), m[1] = fmaxf(m[1], amax_warp[w][1]);
    if (scale_rows == kTileRows) m[0] = m[1] = fmaxf(m[0], m[1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      block_scale(m[h], scale_half[h], inv_half[h]);
      scale[h] = scale_half[h];
    }
  }
  __syncthreads();
  Tensor tile = make_tensor(make_smem_ptr(dst), Layout{});
  // Transposed: a quad's four chunks at a time (their column words), else one.
  constexpr int kGroup = kTransposed ? 4 : 1;
#pragma unroll
  for (int g = 0; g < Chunks::kPerThread; g += kGroup) {
    uint2 q[kGroup];
    int r0, col;
    if (!Chunks::at(threadIdx.x, g, r0, col)) continue;
    const int half = r0 < 64 ? 0 : 1;  // the same for a quad's rows
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      int r;
      Chunks::at(threadIdx.x, g + i, r, col);
      q[i] = to_e4m3x8<T>(*reinterpret_cast<const uint4*>(staged + r * kCols + col), inv_half[half]);
      if (deq != nullptr && r < valid)
        *reinterpret_cast<uint4*>(deq + r * deq_stride + col) = from_e4m3x8<T>(q[i], scale_half[half]);
      if constexpr (!kTransposed) *reinterpret_cast<uint2*>(&tile(r, col)) = q[i];
    }
    if constexpr (kTransposed) {
      uint32_t words[8];
      quad_columns(q, words);
#pragma unroll
      for (int j = 0; j < 8; ++j) *reinterpret_cast<uint32_t*>(&tile(col + j, vt_slot(r0))) = words[j];
    }
  }
}

// A consumer warpgroup's 64 query rows (rows 64 wg.. of the CTA's tile from src, `valid` of them
// real) quantized by its 128 threads (t: thread in the warpgroup) into the CTA's Q tile in shared
// memory, with quantize_tile's scale rule; returns their scale. Q's tiles are read by one CTA
// only, so quantizing them here saves the pass that would write them to memory for this kernel to
// read back. With whole_tile (scale_rows 128) both warpgroups share one amax. Unless deq is null,
// also the dequantized rows (row stride deq_stride). The tile holds the values times `sign`.
// Named barriers 1 (both warpgroups) and 2 + wg.
template <class T, int kD, class Layout>
__device__ __forceinline__ float quantize_q_rows(const T* src, int64_t stride, int valid, E* sq, int wg, int t,
                                                 float (&amax_warp)[8], bool whole_tile, T* deq, int64_t deq_stride,
                                                 float sign) {
  constexpr int kChunksPerRow = kD / 8, kPerThread = 64 * kChunksPerRow / 128;
  static_assert(64 * kChunksPerRow % 128 == 0, "whole chunk rounds");
  uint4 chunk[kPerThread];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = t + i * 128, r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    chunk[i] = r < valid ? *reinterpret_cast<const uint4*>(src + r * stride + col) : make_uint4(0, 0, 0, 0);
    amax = fmaxf(amax, chunk_amax<T>(chunk[i]));
  }
  amax = warp_max(amax);
  if (t % 32 == 0) amax_warp[4 * wg + t / 32] = amax;
  if (whole_tile)
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
  else
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");
  float m = 0.f;
#pragma unroll
  for (int w = 0; w < 8; ++w)
    if (whole_tile || w / 4 == wg) m = fmaxf(m, amax_warp[w]);
  float scale, inv;
  block_scale(m, scale, inv);
  Tensor tile = make_tensor(make_smem_ptr(sq), Layout{});
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = t + i * 128, r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const uint2 q = to_e4m3x8<T>(chunk[i], inv * sign);
    *reinterpret_cast<uint2*>(&tile(64 * wg + r, col)) = q;
    if (deq != nullptr && r < valid)
      *reinterpret_cast<uint4*>(deq + r * deq_stride + col) = from_e4m3x8<T>(q, scale * sign);
  }
  cutlass::arch::fence_view_async_shared();  // the tile's generic-proxy writes, before wgmma reads them
  asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");
  return scale;
}

// Grid (tiles of k, batch, heads_kv): each CTA quantizes one tile of k and the same rows of v, the
// copies of both issued first, so v's arrive while k's are quantized. (q's tiles are quantized by
// the forward itself: quantize_q_rows.)
template <class T, int kD, int kDV>
__global__ void __launch_bounds__(kQuantThreads) attn_fp8_quantize_kernel(const PtAttnFp8Params fp) {
  using Tiles = Fp8Tiles<kD, kDV>;
  const PtAttnParams& p = fp.base;
  const int64_t b = blockIdx.y;
  const Sequence s = sequence(p, b);
  const int nb = blockIdx.x, r0 = nb * kTileRows, h = blockIdx.z;
  if (r0 >= s.len_k) return;
  // The dequantized copy of an operand [tokens, heads, cols] at token `first + r0`, or null.
  const int64_t first = p.cu_seqlens_q != nullptr ? s.start_k : b * p.seqlen_k;
  auto deq_rows = [&](void* deq, int cols) {
    return deq == nullptr ? nullptr : static_cast<T*>(deq) + ((first + r0) * p.heads_kv + h) * cols;
  };
  const int64_t t = tile_index(b, first, nb) * p.heads_kv + h;
  const int valid = min(kTileRows, s.len_k - r0);
  extern __shared__ __align__(16) uint8_t quant_smem[];
  T* staged_k = reinterpret_cast<T*>(quant_smem);
  T* staged_v = staged_k + kTileRows * kD;
  stage_tile<T, kD>(row_at<const T>(p.k, p.k_sb, p.k_ss, p.k_sh, b, s.start_k + r0, h), p.k_ss, valid, staged_k);
  stage_tile<T, kDV>(row_at<const T>(p.v, p.v_sb, p.v_ss, p.v_sh, b, s.start_k + r0, h), p.v_ss, valid, staged_v);
  quantize_tile<T, kD, false, typename Tiles::LayoutQK, 1>(staged_k, valid,
                                                          static_cast<E*>(fp.k_tiles) + t * Tiles::kQKBytes,
                                                          fp.k_scale + 2 * t, fp.scale_rows, deq_rows(fp.k_deq, kD),
                                                          int64_t{p.heads_kv} * kD);
  quantize_tile<T, kDV, true, typename Tiles::LayoutVt, 0>(staged_v, valid,
                                                          static_cast<E*>(fp.vt_tiles) + t * Tiles::kVtBytes,
                                                          fp.v_scale + 2 * t, fp.scale_rows, deq_rows(fp.v_deq, kDV),
                                                          int64_t{p.heads_kv} * kDV);
}

template <class T, int kD, int kDV>
struct FwdFp8 {
  static_assert(kD % 32 == 0 && kDV % 32 == 0 && kD <= 256 && kDV <= 128, "FP8 head dims");
  using Tiles = Fp8Tiles<kD, kDV>;
  static constexpr int kBM = kTileRows, kBN = kTileRows, kThreads = 384;
  static constexpr int kStages = 3;  // K/V ring: 144 KiB of shared memory at head dims 192/128
  using LayoutQK = typename Tiles::LayoutQK;
  using LayoutVt = typename Tiles::LayoutVt;
  // Two consumer warpgroups of 64 rows: each issues its own half of every product.
  using MmaQK = decltype(make_tiled_mma(GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kBN>, Int<kD>>>(),
                                        Layout<Shape<_2, _1, _1>>{}));
  using MmaPV = decltype(make_tiled_mma(GMMA::rs_op_selector<E, E, float, Shape<_64, Int<kDV>, Int<kBN>>>(),
                                        Layout<Shape<_2, _1, _1>>{}));

  struct Smem {
    array_aligned<E, cosize_v<LayoutQK>, 1024> q;
    array_aligned<E, cosize_v<LayoutQK>, 1024> k[kStages];
    array_aligned<E, cosize_v<LayoutVt>, 1024> vt[kStages];
    uint64_t k_full[kStages], v_full[kStages], kv_empty[kStages];
    float q_amax[8];  // quantize_q_rows' per-warp maxima
  };
  static constexpr size_t kSmem = sizeof(Smem);
};

template <class T, int kD, int kDV>
__global__ void __launch_bounds__(384, 1) attn_fwd_fp8_kernel(const PtAttnFp8Params fp) {
  using F = FwdFp8<T, kD, kDV>;
  using Full = cutlass::arch::ClusterTransactionBarrier;
  using Empty = cutlass::arch::ClusterBarrier;
  constexpr int kBM = F::kBM, kBN = F::kBN, kStages = F::kStages;
  constexpr int kQKBytes = F::Tiles::kQKBytes, kVtBytes = F::Tiles::kVtBytes;
  const PtAttnParams& p = fp.base;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<typename F::Smem*>(smem_raw);

  const QueryBlock<kBM, kBN> blk(p);
  if (blk.valid_q <= 0) return;
  const bool packed = p.cu_seqlens_q != nullptr;
  const int64_t k_tile0 = tile_index(blk.b, packed ? blk.s.start_k : blk.b * p.seqlen_k, 0);
  const int nb_lo = blk.nb_lo, nb_hi = blk.nb_hi;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      Full::init(&smem.k_full[s], 1);
      Full::init(&smem.v_full[s], 1);
      Empty::init(&smem.kv_empty[s],
                  256);  // every consumer thread releases its reads
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (threadIdx.x == 0) {
      for (int nb = nb_lo; nb < nb_hi; ++nb) {
        const int i = nb - nb_lo, st = i % kStages;
        if (i >= kStages) Empty::wait(&smem.kv_empty[st], ((i / kStages) - 1) & 1);
        const int64_t t = (k_tile0 + nb) * p.heads_kv + blk.hk;
        Full::arrive_and_expect_tx(&smem.k_full[st], kQKBytes);
        SM90_BULK_COPY_G2S::copy(static_cast<const E*>(fp.k_tiles) + t * kQKBytes, &smem.k_full[st], smem.k[st].data(),
                                 kQKBytes);
        Full::arrive_and_expect_tx(&smem.v_full[st], kVtBytes);
        SM90_BULK_COPY_G2S::copy(static_cast<const E*>(fp.vt_tiles) + t * kVtBytes, &smem.v_full[st],
                                 smem.vt[st].data(), kVtBytes);
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<240>();
  const int tid = threadIdx.x - 128;  // in the two consumer warpgroups
  const int cw = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  typename F::MmaQK mma_qk;
  typename F::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename F::LayoutQK{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tOrP = make_tensor<E>(partition_shape_A(mma_pv, Shape<Int<kBM>, Int<kBN>>{}));
  Tensor tOrP_words = recast<uint32_t>(tOrP);  // 4 keys (vt_slot order) of one row per word
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBM>, Int<kBN>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBM>, Int<kDV>>{});
  static_assert(decltype(size(tSrS))::value == kBN / 2, "64 rows a warpgroup");
  clear(tOrO);

  const Mask& mask = blk.mask;
  const int m0 = blk.m0;
  const int local_row = cw * 64 + warp * 16 + lane / 4;  // + 8 r: this thread's two rows in the block
  const int row_base = m0 + local_row;
  const float sign = p.softmax_scale < 0.f ? -1.f : 1.f;  // the exponent factor is then >= 0
  T* q_deq = fp.q_deq == nullptr ? nullptr
                                 : static_cast<T*>(fp.q_deq) +
                                       ((packed ? blk.s.start_q : blk.b * p.seqlen_q) + m0 + 64 * cw) * p.heads_q * kD +
                                       int64_t{blk.h} * kD;
  const float q_scale = quantize_q_rows<T, kD, typename F::LayoutQK>(
      blk.template rows<const T>(p.q, p.q_sb, p.q_ss, p.q_sh) + 64 * cw * p.q_ss, p.q_ss, blk.valid_q - 64 * cw,
      smem.q.data(), cw, tid % 128, smem.q_amax, fp.scale_rows == kTileRows, q_deq, int64_t{p.heads_q} * kD, sign);
  const float scale_log2 = fabsf(p.softmax_scale) * kLog2e * q_scale;  // >= 0: q's tiles carry the sign
  const float sink2 = p.sink != nullptr ? p.sink[blk.h] * kLog2e : -INFINITY;
  float row_max[2] = {sink2, sink2};
  float row_sum[2];
  row_sum[0] = row_sum[1] = (p.sink != nullptr && lane % 4 == 0) ? 1.f : 0.f;
  float vref = 0.f;  // O is in units of vref / kPScale

  // The softmax of key block nb on S's accumulators (ks, vs: its k and v scales per 64-key half):
  // scores scaled (and masked with kMasked), the row statistics updated, S replaced by P times
  // its per-half factor 256 * v scale / vref (a power of two, folded into the exponent; 1 where
  // the half's V is all zeros); corr receives O's correction per row (with the growth of O's v
  // unit). Unmasked blocks take the maximum of the raw accumulators (the factors are >= 0) and one
  // FFMA per exponent.
  auto softmax = [&](auto masked, int nb, float2 ks, float2 vs, float (&corr)[2]) {
    constexpr bool kMasked = decltype(masked)::value;
    const int n0 = nb * kBN;
    const float sc[2] = {scale_log2 * ks.x, scale_log2 * ks.y};
    float mx[2] = {row_max[0], row_max[1]};
    if constexpr (kMasked) {
#pragma unroll
      for (int e = 0; e < size(tSrS); ++e) {
        const int c0 = e & 1, r = (e >> 1) & 1, j = e >> 2;
        float x = tSrS(e) * sc[j >= kBN / 16];
        if (!mask.visible(row_base + 8 * r, n0 + 8 * j + 2 * (lane % 4) + c0)) x = -INFINITY;
        tSrS(e) = x;
        mx[r] = fmaxf(mx[r], x);
      }
    } else {
      // Eight independent maxima (row, key half, column pair) keep the FMNMX chains short.
      float raw[2][2][2];
#pragma unroll
      for (int i = 0; i < 8; ++i) (&raw[0][0][0])[i] = -INFINITY;
#pragma unroll
      for (int e = 0; e < size(tSrS); ++e) {
        const int c = e & 1, r = (e >> 1) & 1, h = (e >> 2) >= kBN / 16;
        raw[r][h][c] = fmaxf(raw[r][h][c], tSrS(e));
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m0 = fmaxf(raw[r][0][0], raw[r][0][1]), m1 = fmaxf(raw[r][1][0], raw[r][1][1]);
        mx[r] = fmaxf(mx[r], fmaxf(m0 * sc[0], m1 * sc[1]));
      }
    }
    // O's unit moves to the larger v scale (O is 0 before the first block, and while V is all
    // zeros). Scales are powers of two (or 0): the ratios are exponent differences, no division.
    const float vnew = fmaxf(vref, fmaxf(vs.x, vs.y));
    const int e_new = pow2_exponent(vnew);
    const float grow = vnew > 0.f ? pow2_ratio(vref, vnew) : 1.f;
    vref = vnew;
    float lpv[2], inv_pv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float v = h ? vs.y : vs.x;
      // log2 of the half's P factor 256 * v / vref; >= -126 so that its inverse stays finite.
      const int l = v > 0.f ? max(pow2_exponent(v) + 8 - e_new, -126) : 0;
      lpv[h] = static_cast<float>(l);
      inv_pv[h] = exp2i(-l);
    }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      base[r] = mx[r] == -INFINITY ? 0.f : mx[r];
      corr[r] = ex2(row_max[r] - base[r]);
      row_max[r] = mx[r];
      row_sum[r] *= corr[r];
      corr[r] *= grow;
    }
    float sums[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int e = 0; e < size(tSrS); ++e) {
      const int r = (e >> 1) & 1, h = (e >> 2) >= kBN / 16;
      const float pe = kMasked ? ex2(tSrS(e) + (lpv[h] - base[r])) : ex2(fmaf(tSrS(e), sc[h], lpv[h] - base[r]));
      tSrS(e) = pe;
      sums[r][h] += pe;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] += sums[r][0] * inv_pv[0] + sums[r][1] * inv_pv[1];
  };
  // P into the A operand of P V^T. Word w = r + 2 h + 4 kb holds row +8r's keys 32 kb + 16 h in
  // vt_slot order: the accumulator pairs at columns 32 kb + 16 h + {2q, 2q + 1} and {2q + 8, 2q + 9}.
  auto to_p = [&] {
#pragma unroll
    for (int w = 0; w < size(tOrP_words); ++w) {
      const int r = w & 1, h = (w >> 1) & 1, kb = w >> 2, e0 = 2 * r + 16 * kb + 8 * h;
      const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(tSrS(e0), tSrS(e0 + 1)), __NV_SATFINITE, __NV_E4M3);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(tSrS(e0 + 4), tSrS(e0 + 5)), __NV_SATFINITE, __NV_E4M3);
      tOrP_words(w) = lo | (hi << 16);
    }
  };
  // The softmax of block nb, masked only where some pair of the tile is not visible.
  auto softmax_block = [&](int nb, float2 ks, float2 vs, float (&corr)[2]) {
    if (mask.all_visible(m0, m0 + kBM, nb * kBN, nb * kBN + kBN))
      softmax(std::false_type{}, nb, ks, vs, corr);
    else
      softmax(std::true_type{}, nb, ks, vs, corr);
  };
  // Asynchronous products (committed, not waited for): S = Q K^T of stage st, O += P V^T of stage st.
  auto issue_qk = [&](int st) {
    Tensor sK = make_tensor(make_smem_ptr(smem.k[st].data()), typename F::LayoutQK{});
    sm90::issue_ss_gemm(mma_qk, tSrQ, thr_qk.partition_fragment_B(sK), tSrS);
  };
  auto issue_pv = [&](int st) {
    Tensor sVt = make_tensor(make_smem_ptr(smem.vt[st].data()), typename F::LayoutVt{});
    sm90::issue_rs_gemm(mma_pv, tOrP, thr_pv.partition_fragment_B(sVt), tOrO);
  };
  auto scales = [&](const float* base, int nb) {
    return *reinterpret_cast<const float2*>(base + 2 * ((k_tile0 + nb) * p.heads_kv + blk.hk));
  };

  // Block i's S = Q K^T runs while block i - 1's P V^T does: the softmax of block i waits for its
  // S only, and O's correction waits for the P V^T before it.
  // The next block's scales are loaded one block ahead: a load from L2 would stall the softmax.
  float2 ks_next = {0.f, 0.f}, vs_next = {0.f, 0.f};
  auto prefetch_scales = [&](int nb) {
    if (nb < nb_hi) ks_next = scales(fp.k_scale, nb), vs_next = scales(fp.v_scale, nb);
  };
  if (nb_lo < nb_hi) {
    float corr[2];
    prefetch_scales(nb_lo);
    const float2 ks0 = ks_next, vs0 = vs_next;
    prefetch_scales(nb_lo + 1);
    Full::wait(&smem.k_full[0], 0);
    issue_qk(0);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    softmax_block(nb_lo, ks0, vs0, corr);  // O is still 0: nothing to correct
    to_p();
    for (int nb = nb_lo + 1; nb < nb_hi; ++nb) {
      const int i = nb - nb_lo, st = i % kStages, prev = (i - 1) % kStages;
      const float2 ks = ks_next, vs = vs_next;
      prefetch_scales(nb + 1);
      Full::wait(&smem.k_full[st], (i / kStages) & 1);
      issue_qk(st);
      Full::wait(&smem.v_full[prev], ((i - 1) / kStages) & 1);
      issue_pv(prev);
      warpgroup_wait<1>();  // this block's S; the last block's P V^T may still run
      warpgroup_fence_operand(tSrS);
      softmax_block(nb, ks, vs, corr);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      Empty::arrive(&smem.kv_empty[prev]);
      // Most blocks move no row maximum and no v unit of any row of the warp: O stays as it is.
      if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
        for (int e = 0; e < size(tOrO); ++e) tOrO(e) *= corr[(e >> 1) & 1];
      }
      to_p();
    }
    const int i = nb_hi - 1 - nb_lo, last = i % kStages;
    Full::wait(&smem.v_full[last], (i / kStages) & 1);
    issue_pv(last);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    Empty::arrive(&smem.kv_empty[last]);
  }

  sm90::store_forward_rows<T>(p, blk, tOrO, row_max, row_sum, vref / kPScale, local_row, lane);
}

// Host side: Attention's checks and packed-sequence memsets around the quantization and the
// forward.
template <class T, int kD, int kDV>
struct AttentionFp8 {
  static int forward(const PtAttnFp8Params* fp, char* err, size_t err_len) {
    if (fp->scale_rows != 64 && fp->scale_rows != kTileRows) {
      snprintf(err, err_len, "FP8 attention: scale_rows is %d; expected 64 or 128", fp->scale_rows);
      return 1;
    }
    auto launch = [fp](const PtAttnParams& p, cudaStream_t stream) {
      using F = FwdFp8<T, kD, kDV>;
      const int64_t tiles = (p.seqlen_k + kTileRows - 1) / kTileRows, m_blocks = (p.seqlen_q + F::kBM - 1) / F::kBM;
      if (tiles > 0) {
        auto quantize = attn_fp8_quantize_kernel<T, kD, kDV>;
        constexpr size_t kStaged = sizeof(T) * kTileRows * (kD + kDV);
        opt_in_smem(quantize, kStaged);
        quantize<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.batch),
                        static_cast<unsigned>(p.heads_kv)),
                   kQuantThreads, kStaged, stream>>>(*fp);
      }
      if (m_blocks <= 0) return;
      auto kernel = attn_fwd_fp8_kernel<T, kD, kDV>;
      opt_in_smem(kernel, F::kSmem);
      kernel<<<dim3(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.batch), static_cast<unsigned>(p.heads_q)),
               F::kThreads, F::kSmem, stream>>>(*fp);
    };
    if (fp->base.heads_kv > 65535) {
      snprintf(err, err_len, "FP8 attention: %d KV heads exceed the launch limit", fp->base.heads_kv);
      return 1;
    }
    return Attention<T, kD, kDV>::forward_with(&fp->base, err, err_len, "FP8 attention forward", launch);
  }
};

}  // namespace primus_turbo::kernels::attention::fp8

// Exports AttentionFp8<T, D, DV>::forward as pt_attn_fp8_fwd_run.
#define PT_JIT_EXPORT_ATTENTION_FP8(T, D, DV)                                                                         \
  PT_JIT_EXPORT_ABI_VERSION                                                                                           \
  extern "C" __attribute__((visibility("default"))) int pt_attn_fp8_fwd_run(const PtAttnFp8Params* params, char* err, \
                                                                            size_t err_len) {                         \
    return primus_turbo::kernels::attention::fp8::AttentionFp8<T, D, DV>::forward(params, err, err_len);              \
  }
