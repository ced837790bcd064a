// Fused AdamW: one pass over each parameter's four tensors (param, grad, first and second moment),
// read once and written once, for up to PT_ADAMW_MAX_TENSORS tensors a launch
// (kernels/optim/adamw_abi.h). A CTA updates PT_ADAMW_BLOCK_ELEMS consecutive elements of one
// tensor, 8 a thread with 16-byte accesses where the tensor's pointers allow. The math is float32
// whatever the stored dtypes; each stored value is rounded once (to nearest even).
//
// With an amax slot, the CTA also reduces max |param| over the values it stored, one atomic a CTA:
// the FP8 layers' tensorwise weight quantization takes it instead of reading the weight again.
//
// With an FP8 dtype (adamw_fp8_blocks_kernel), a CTA updates one 128 x 128 tile of the param seen
// as [rows, cols], each thread an 8 x 8 block, keeps the stored tile in shared memory until the
// tile's amax is known, and writes the tile's FP8 copy with one scale for the tile (and, when asked,
// its transposed copy): the quantizer's 2-D blocks (quantize_tile_regs.cuh), the same arithmetic on
// the same stored values, so the copy is bit for bit the one quantizing the updated weight would
// give, without reading it again.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/common/convert.cuh"
#include "primus_turbo/kernels/common/smem_opt_in.cuh"
#include "primus_turbo/kernels/common/warp.cuh"
#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/optim/adamw_abi.h"
#include "primus_turbo/kernels/quantization/quant_formats.cuh"

namespace primus_turbo::kernels::optim {

constexpr int kThreads = 256;
constexpr int kItems = PT_ADAMW_BLOCK_ELEMS / kThreads;  // elements a thread updates
static_assert(kItems == 8, "a thread's elements are one 16-byte access of a 16-bit dtype");

// kItems consecutive values at element i of p (16-byte aligned there) in 16-byte accesses.
template <class T>
__device__ __forceinline__ void load_vec(const void* p, int64_t i, float (&v)[kItems]) {
  constexpr int kPer = 16 / sizeof(T);
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const T*>(p) + i);
#pragma unroll
  for (int w = 0; w < kItems / kPer; ++w) {
    const uint4 word = src[w];
    const T* e = reinterpret_cast<const T*>(&word);
#pragma unroll
    for (int j = 0; j < kPer; ++j) v[w * kPer + j] = to_float(e[j]);
  }
}

// kItems values rounded to T, as the 16-byte words that store them (one word of a 16-bit T, two of
// float32).
template <class T>
struct Packed {
  uint4 w[kItems * sizeof(T) / 16];
};

template <class T>
__device__ __forceinline__ Packed<T> pack(const float (&v)[kItems]) {
  constexpr int kPer = 16 / sizeof(T);
  Packed<T> out;
#pragma unroll
  for (int w = 0; w < kItems / kPer; ++w) {
    T* e = reinterpret_cast<T*>(&out.w[w]);
#pragma unroll
    for (int j = 0; j < kPer; ++j) e[j] = from_float<T>(v[w * kPer + j]);
  }
  return out;
}

// Value j of a Packed, as a float (exact).
template <class T>
__device__ __forceinline__ float unpack(const Packed<T>& p, int j) {
  const uint4& word = p.w[j * sizeof(T) / 16];
  const int in_word = j % (16 / sizeof(T));
  const uint32_t lane32 = in_word * sizeof(T) / 4 == 0   ? word.x
                          : in_word * sizeof(T) / 4 == 1 ? word.y
                          : in_word * sizeof(T) / 4 == 2 ? word.z
                                                          : word.w;
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(lane32);
  } else {
    const uint16_t bits = static_cast<uint16_t>(in_word % 2 ? lane32 >> 16 : lane32 & 0xffffu);
    return to_float(*reinterpret_cast<const T*>(&bits));
  }
}

template <class T>
__device__ __forceinline__ void store_packed(void* p, int64_t i, const Packed<T>& v) {
  uint4* dst = reinterpret_cast<uint4*>(static_cast<T*>(p) + i);
#pragma unroll
  for (int w = 0; w < kItems * static_cast<int>(sizeof(T)) / 16; ++w) dst[w] = v.w[w];
}

template <class T>
__device__ __forceinline__ void store_vec(void* p, int64_t i, const float (&v)[kItems]) {
  store_packed<T>(p, i, pack<T>(v));
}

struct Step {
  float decay, step_size, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps;
};

// One element's update; returns the parameter as stored (rounded to TP), as a float. Every operation
// is an explicit round-to-nearest intrinsic, so no code path (vector, scalar, the FP8 tile kernel)
// contracts differently from another: the same inputs give the same bits everywhere.
template <class TP>
__device__ __forceinline__ float update(float& p, float g, float& m, float& v, const Step& s) {
  p = __fmul_rn(p, s.decay);
  m = __fmaf_rn(s.one_minus_beta1, __fsub_rn(g, m), m);  // torch's lerp for a weight below 0.5
  v = __fmaf_rn(__fmul_rn(s.one_minus_beta2, g), g, __fmul_rn(v, s.beta2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  p = __fmaf_rn(-s.step_size, __fdiv_rn(m, denom), p);
  return to_float(from_float<TP>(p));
}

// The tensor CTA b works on: the last entry whose first block is at or before b.
__device__ __forceinline__ int tensor_of(const PtAdamWParams& p, int64_t b) {
  int t = 0;
  for (int i = 1; i < p.count; ++i)
    if (p.tensors[i].first_block <= b) t = i;
  return t;
}

template <class TP, class TS>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const __grid_constant__ PtAdamWParams p) {
  const int64_t b = blockIdx.x;
  const PtAdamWTensor& t = p.tensors[tensor_of(p, b)];
  const Step s{p.decay, p.step_size, 1.0f - p.beta1, p.beta2, 1.0f - p.beta2, p.bias_correction2_sqrt, p.eps};
  const int64_t first = (b - t.first_block) * PT_ADAMW_BLOCK_ELEMS + int64_t(threadIdx.x) * kItems;
  float amax = 0.0f;
  if (t.vec && first + kItems <= t.numel) {
    float pv[kItems], gv[kItems], mv[kItems], vv[kItems];
    load_vec<TP>(t.param, first, pv);
    load_vec<TP>(t.grad, first, gv);
    load_vec<TS>(t.exp_avg, first, mv);
    load_vec<TS>(t.exp_avg_sq, first, vv);
#pragma unroll
    for (int j = 0; j < kItems; ++j) amax = fmaxf(amax, fabsf(update<TP>(pv[j], gv[j], mv[j], vv[j], s)));
    store_vec<TP>(t.param, first, pv);
    store_vec<TS>(t.exp_avg, first, mv);
    store_vec<TS>(t.exp_avg_sq, first, vv);
  } else {
    TP* param = static_cast<TP*>(t.param);
    const TP* grad = static_cast<const TP*>(t.grad);
    TS* exp_avg = static_cast<TS*>(t.exp_avg);
    TS* exp_avg_sq = static_cast<TS*>(t.exp_avg_sq);
    for (int64_t i = first; i < first + kItems && i < t.numel; ++i) {
      float pv = to_float(param[i]), mv = to_float(exp_avg[i]), vv = to_float(exp_avg_sq[i]);
      amax = fmaxf(amax, fabsf(update<TP>(pv, to_float(grad[i]), mv, vv, s)));
      param[i] = from_float<TP>(pv);
      exp_avg[i] = from_float<TS>(mv);
      exp_avg_sq[i] = from_float<TS>(vv);
    }
  }
  if (t.amax == nullptr) return;  // uniform over the CTA
  __shared__ float warp_amax[kThreads / 32];
  amax = warp_max(amax);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = warp_amax[0];
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, warp_amax[w]);
    // Non-negative floats order as their bit patterns: an integer max is a float max.
    atomicMax(reinterpret_cast<int*>(t.amax), __float_as_int(m));
  }
}

// Thread (tr, tc) of the 16 x 16 grid owns rows 8 tr.. and columns 8 tc.. of the tile; the 16
// threads of a half warp cover 128 consecutive columns of a row (coalesced). The updated tile waits
// in shared memory, as stored, for the tile's scale (a register copy would cost the occupancy that
// keeps enough loads in flight); the transposed copy's codes are staged there too, in 8-byte
// chunks swizzled by the thread's column group, so both outputs leave in full 128-byte lines.
template <class TP>
constexpr int fp8_tile_smem_bytes() {
  return PT_ADAMW_FP8_TILE * PT_ADAMW_FP8_TILE * (static_cast<int>(sizeof(TP)) + 1);
}

template <class TP, class TS, class F>
__global__ void __launch_bounds__(kThreads) adamw_fp8_blocks_kernel(const __grid_constant__ PtAdamWParams p) {
  constexpr int kTile = PT_ADAMW_FP8_TILE, kSide = kItems, kWords = kItems * sizeof(TP) / 16;
  extern __shared__ uint4 smem[];
  Packed<TP>* stash = reinterpret_cast<Packed<TP>*>(smem);  // [128 rows][16 column groups]
  uint2* codes_t = reinterpret_cast<uint2*>(smem + kTile * 16 * kWords);  // [128 columns][16 chunks]
  const int64_t b = blockIdx.x;
  const PtAdamWTensor& t = p.tensors[tensor_of(p, b)];
  const Step s{p.decay, p.step_size, 1.0f - p.beta1, p.beta2, 1.0f - p.beta2, p.bias_correction2_sqrt, p.eps};
  const int64_t tiles_per_row = (t.cols + kTile - 1) / kTile, tile = b - t.first_block;
  const int64_t r0 = (tile / tiles_per_row) * kTile, c0 = (tile % tiles_per_row) * kTile;
  const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
  const int64_t col = c0 + kSide * tc;
  const bool full_cols = t.vec && col + kSide <= t.cols;
  float amax = 0.0f;
#pragma unroll 2
  for (int r = 0; r < kSide; ++r) {
    const int64_t row = r0 + kSide * tr + r;
    float pv[kSide], gv[kSide], mv[kSide], vv[kSide];
#pragma unroll
    for (int j = 0; j < kSide; ++j) pv[j] = 0.0f;  // zeros outside the tensor
    if (row < t.rows) {
      const int64_t at = row * t.cols + col;
      if (full_cols) {
        load_vec<TP>(t.param, at, pv);
        load_vec<TP>(t.grad, at, gv);
        load_vec<TS>(t.exp_avg, at, mv);
        load_vec<TS>(t.exp_avg_sq, at, vv);
#pragma unroll
        for (int j = 0; j < kSide; ++j) update<TP>(pv[j], gv[j], mv[j], vv[j], s);
        store_vec<TS>(t.exp_avg, at, mv);
        store_vec<TS>(t.exp_avg_sq, at, vv);
      } else {
        TP* param = static_cast<TP*>(t.param);
        const TP* grad = static_cast<const TP*>(t.grad);
        TS* exp_avg = static_cast<TS*>(t.exp_avg);
        TS* exp_avg_sq = static_cast<TS*>(t.exp_avg_sq);
#pragma unroll
        for (int j = 0; j < kSide; ++j) {
          if (col + j >= t.cols) continue;
          float m = to_float(exp_avg[at + j]), v = to_float(exp_avg_sq[at + j]);
          pv[j] = to_float(param[at + j]);
          update<TP>(pv[j], to_float(grad[at + j]), m, v, s);
          param[at + j] = from_float<TP>(pv[j]);
          exp_avg[at + j] = from_float<TS>(m);
          exp_avg_sq[at + j] = from_float<TS>(v);
        }
      }
    }
    const Packed<TP> stored = pack<TP>(pv);
    if (full_cols && row < t.rows) store_packed<TP>(t.param, row * t.cols + col, stored);
    stash[(kSide * tr + r) * 16 + tc] = stored;
#pragma unroll
    for (int j = 0; j < kSide; ++j) amax = fmaxf(amax, fabsf(unpack<TP>(stored, j)));
  }
  __shared__ float warp_amax[kThreads / 32];
  amax = warp_max(amax);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_amax[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
  const quant::Scale sc = quant::make_scale<F>(amax, false);
  if (threadIdx.x == 0) t.scale_inv[(r0 / kTile) * tiles_per_row + c0 / kTile] = sc.inv;
  uint8_t* q = static_cast<uint8_t*>(t.q);
  uint2 col_codes[kSide] = {};  // column j's codes of the thread's 8 rows, row r in byte r
#pragma unroll
  for (int r = 0; r < kSide; ++r) {
    const int64_t row = r0 + kSide * tr + r;
    const Packed<TP> stored = stash[(kSide * tr + r) * 16 + tc];
    const auto v = [&](int j) { return unpack<TP>(stored, j); };
    const uint2 codes = make_uint2(quant::encode4<F>(v(0), v(1), v(2), v(3), sc.mult),
                                   quant::encode4<F>(v(4), v(5), v(6), v(7), sc.mult));
#pragma unroll
    for (int j = 0; j < kSide; ++j) {
      const uint32_t byte = ((j < 4 ? codes.x : codes.y) >> (8 * (j % 4))) & 0xffu;
      (r < 4 ? col_codes[j].x : col_codes[j].y) |= byte << (8 * (r % 4));
    }
    if (row >= t.rows) continue;
    const int64_t at = row * t.cols + col;
    if (full_cols) {
      *reinterpret_cast<uint2*>(q + at) = codes;  // 8-byte aligned: cols % 8 == 0 (vec)
    } else {
      for (int j = 0; j < kSide && col + j < t.cols; ++j) {
        q[at + j] = static_cast<uint8_t>((j < 4 ? codes.x : codes.y) >> (8 * (j % 4)));
      }
    }
  }
  if (t.qt == nullptr) return;  // uniform over the CTA
  // Column c of the tile is row c of the transposed tile; its chunk of rows 8 tr.. goes to slot
  // tr ^ tc (tc = c / 8), so a half warp's stores hit 16 different banks.
#pragma unroll
  for (int j = 0; j < kSide; ++j) codes_t[(kSide * tc + j) * 16 + (tr ^ tc)] = col_codes[j];
  __syncthreads();
  // qt: matrix m = r0 / matrix_rows (a tile never spans two), [cols, matrix_rows] each.
  const int64_t mrows = t.matrix_rows, m = r0 / mrows, n0 = r0 % mrows;
  uint8_t* qt = static_cast<uint8_t*>(t.qt) + m * mrows * t.cols;
  const bool vec_t = mrows % 8 == 0 && (reinterpret_cast<uintptr_t>(t.qt) % 8) == 0;
  for (int i = threadIdx.x; i < kTile * 16; i += kThreads) {
    const int c = i / 16, chunk = i % 16;  // transposed row c (a column of the tile), rows 8 chunk..
    const int64_t k = c0 + c, n = n0 + kSide * chunk;
    if (k >= t.cols || n >= mrows) continue;
    const uint2 w = codes_t[c * 16 + (chunk ^ (c / kSide))];
    uint8_t* dst = qt + k * mrows + n;
    if (vec_t && n + kSide <= mrows) {
      *reinterpret_cast<uint2*>(dst) = w;
    } else {
      for (int e = 0; e < kSide && n + e < mrows; ++e) dst[e] = static_cast<uint8_t>((e < 4 ? w.x : w.y) >> (8 * (e % 4)));
    }
  }
}

struct AdamW {
  template <class TP, class TS, class F>
  static void launch_fp8(const PtAdamWParams& p, unsigned grid, cudaStream_t stream) {
    constexpr int bytes = fp8_tile_smem_bytes<TP>();
    opt_in_smem(adamw_fp8_blocks_kernel<TP, TS, F>, bytes);  // above 48 KiB for float32 params
    adamw_fp8_blocks_kernel<TP, TS, F><<<grid, kThreads, bytes, stream>>>(p);
  }

  template <class TP, class TS>
  static void launch(const PtAdamWParams& p, cudaStream_t stream) {
    const unsigned grid = static_cast<unsigned>(p.blocks);
    if (p.fp8_dtype == 3) {  // PT_FLOAT8_E4M3
      launch_fp8<TP, TS, quant::E4M3>(p, grid, stream);
    } else if (p.fp8_dtype == 4) {  // PT_FLOAT8_E5M2
      launch_fp8<TP, TS, quant::E5M2>(p, grid, stream);
    } else {
      adamw_kernel<TP, TS><<<grid, kThreads, 0, stream>>>(p);
    }
  }

  template <class TP>
  static int launch_states(const PtAdamWParams& p, cudaStream_t stream, char* err, size_t err_len) {
    if (p.state_dtype == 0) {  // PT_FLOAT32
      launch<TP, float>(p, stream);
    } else if (p.state_dtype == p.param_dtype) {
      launch<TP, TP>(p, stream);
    } else {
      std::snprintf(err, err_len, "adamw: state dtype %d with param dtype %d", p.state_dtype, p.param_dtype);
      return 1;
    }
    return 0;
  }

  static int run(const PtAdamWParams* p, char* err, size_t err_len) {
    if (p->count < 1 || p->count > PT_ADAMW_MAX_TENSORS || p->blocks < 1 || p->blocks > 0x7fffffff ||
        (p->fp8_dtype != 0 && p->fp8_dtype != 3 && p->fp8_dtype != 4)) {
      std::snprintf(err, err_len, "adamw: %d tensors in %lld CTAs", p->count, static_cast<long long>(p->blocks));
      return 1;
    }
    auto stream = static_cast<cudaStream_t>(p->stream);
    int rc;
    switch (p->param_dtype) {  // pt_dtype
      case 0: rc = launch_states<float>(*p, stream, err, err_len); break;
      case 1: rc = launch_states<__half>(*p, stream, err, err_len); break;
      case 2: rc = launch_states<__nv_bfloat16>(*p, stream, err, err_len); break;
      default:
        std::snprintf(err, err_len, "adamw: param dtype %d", p->param_dtype);
        return 1;
    }
    return rc ? rc : report_launch("adamw", err, err_len);
  }
};

}  // namespace primus_turbo::kernels::optim
