// FP8 output written by a memory-bound kernel in the same pass as its high-precision result
// (normalization, gated activations): the value quantized is the result already rounded to the
// op's output dtype, so q and scale_inv are bit-identical to running turbo.ops.quantize_fp8 on
// that output. Scales and rounding are quant_formats.cuh's (make_scale, F::encode).
//
//   kFp8Rowwise : one scale per row, from the row's amax (known once the whole row is computed);
//                 scale_inv [rows].
//   kFp8Block128: one scale per 128 consecutive elements of a row (the last block may be partial);
//                 scale_inv [rows, ceil(cols / 128)], row-major: quantize_fp8's 1x128 layout
//                 along the last dim, which gemm_fp8 takes as a pre-quantized operand.
//
// With 16-byte accesses a 128-element block is 128 / kVec consecutive vectors. The kernels lay
// vectors out so that consecutive lanes of a warp hold consecutive vectors, so a block's amax is
// a shuffle reduction over 128 / kVec lanes (16 for 2-byte types, 32 for fp32) of one warp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "primus_turbo/kernels/common/vec.cuh"
#include "primus_turbo/kernels/quantization/quant_formats.cuh"

namespace primus_turbo::kernels::quant {

enum FusedFp8 { kFp8None = 0, kFp8Rowwise = 1, kFp8Block128 = 2 };

constexpr int kFusedBlock = 128;

// Lanes that hold one 128-element block when each lane holds kVec consecutive elements.
template <int kVec>
constexpr int kBlockLanes = kFusedBlock / kVec;

// amax of one vector, from the values as stored in T.
template <class T, int kVec>
__device__ __forceinline__ float pack_amax(const Pack<T, kVec>& y) {
  float a = 0.f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) a = fmaxf(a, fabsf(to_float(y.v[j])));
  return a;
}

// Max over the lanes of one 128-element block; every lane of the warp must call it.
template <int kVec>
__device__ __forceinline__ float block128_max(float a) {
  static_assert(kBlockLanes<kVec> <= 32 && kBlockLanes<kVec> >= 1, "a 128-block must fit in one warp");
#pragma unroll
  for (int o = 1; o < kBlockLanes<kVec>; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

using kernels::warp_max;  // also named quant::warp_max by its users

// Max over a block whose size is a multiple of 32; every thread gets it. scratch: 33 floats. Two
// barriers make back-to-back calls (and reuse of scratch by other reductions) safe.
__device__ __forceinline__ float block_max(float a, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  a = warp_max(a);
  if (lane == 0) scratch[warp] = a;
  __syncthreads();
  if (warp == 0) {
    float m = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.f;
    m = warp_max(m);
    if (lane == 0) scratch[32] = m;
  }
  __syncthreads();
  const float r = scratch[32];
  __syncthreads();
  return r;
}

// Encodes one vector (value * mult, RNE, saturating) and stores its kVec bytes at dst, which is
// aligned to kVec bytes.
template <class F, class T, int kVec>
__device__ __forceinline__ void store_fp8(uint8_t* dst, const Pack<T, kVec>& y, float mult) {
  uint8_t q[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) q[j] = F::encode(to_float(y.v[j]) * mult);
  if constexpr (kVec == 8) {
    uint2 w;
    w.x = q[0] | (q[1] << 8) | (q[2] << 16) | (static_cast<uint32_t>(q[3]) << 24);
    w.y = q[4] | (q[5] << 8) | (q[6] << 16) | (static_cast<uint32_t>(q[7]) << 24);
    *reinterpret_cast<uint2*>(dst) = w;
  } else if constexpr (kVec == 4) {
    *reinterpret_cast<uint32_t*>(dst) = q[0] | (q[1] << 8) | (q[2] << 16) | (static_cast<uint32_t>(q[3]) << 24);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) dst[j] = q[j];
  }
}

// Where a row's FP8 output goes: q [rows, cols] bytes and its scale_inv.
struct Fp8Row {
  uint8_t* q;      // the row's first byte
  float* scale;    // rowwise: &scale_inv[row]; 1x128: &scale_inv[row * ceil(cols / 128)]
};

__device__ __forceinline__ Fp8Row fp8_row(void* q, float* scale_inv, int64_t row, int64_t cols, int mode) {
  const int64_t blocks = mode == kFp8Rowwise ? 1 : (cols + kFusedBlock - 1) / kFusedBlock;
  return Fp8Row{static_cast<uint8_t*>(q) + row * cols, scale_inv + row * blocks};
}

// 1x128 blocks: quantizes vector c (kVec elements) of a row; every lane of the warp calls it
// (valid == false: a lane past the row's end, which still joins the shuffle).
template <class F, class T, int kVec>
__device__ __forceinline__ void quantize_block128(const Fp8Row& out, const Pack<T, kVec>& y, int c, bool valid) {
  const float amax = block128_max<kVec>(valid ? pack_amax<T, kVec>(y) : 0.f);
  if (!valid) return;
  const Scale sc = make_scale<F>(amax, false);
  if ((c % kBlockLanes<kVec>) == 0) out.scale[c / kBlockLanes<kVec>] = sc.inv;
  store_fp8<F, T, kVec>(out.q + static_cast<int64_t>(c) * kVec, y, sc.mult);
}

// The scale a row of zeros gets (amax 0): what quantize_fp8 gives an all-zero group.
template <class F>
__device__ __forceinline__ float zero_scale_inv() {
  return make_scale<F>(0.f, false).inv;
}

}  // namespace primus_turbo::kernels::quant
