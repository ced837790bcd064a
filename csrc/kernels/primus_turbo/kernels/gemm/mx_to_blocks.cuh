// MX (E8M0 per 32 along K) operands restated with one fp32 power-of-two scale per 1x128 K block,
// the granularity of Hopper's block-scaled FP8 GEMM (see ops/_mx_blocks.py for the numerics):
//
//   emax = max of the four exponents of the 128-block;  q' = q * 2^(e - emax);  scale' = 2^emax
//
// FP4 (E2M1) input is expanded to E4M3 holding value * 2^6 (scale' carries the 2^-6). One thread
// restates one 32-value sub-block of one row: it reads its 128-block's four exponents (cached),
// 32 (FP8) or 16 (packed FP4) bytes as 16-/8-byte vectors, and writes 32 bytes; the first thread
// of a 128-block writes its scale. Products are exact in fp32; the one rounding is the cast back to
// FP8 (round to nearest even, saturating), the same as the torch reference path.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/common/warp.cuh"
#include "primus_turbo/kernels/gemm/mx_blocks_abi.h"
#include "primus_turbo/kernels/jit_export.cuh"

namespace primus_turbo::kernels::mx_blocks {

enum Format { kE4M3 = 0, kE5M2 = 1, kFp4 = 2 };

constexpr int kThreads = 256;
constexpr int kE8m0Bias = 127;
constexpr int kFp4Shift = 6;

template <int kFmt>
__device__ __forceinline__ float decode(uint8_t b) {
  constexpr __nv_fp8_interpretation_t kInterp = kFmt == kE5M2 ? __NV_E5M2 : __NV_E4M3;
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), kInterp)));
}

template <int kFmt>
__device__ __forceinline__ uint8_t encode(float v) {
  constexpr __nv_fp8_interpretation_t kInterp = kFmt == kE5M2 ? __NV_E5M2 : __NV_E4M3;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kInterp));
}

// E2M1 nibble -> value * 2^6 (bit 3 is the sign).
__device__ __forceinline__ float fp4_value(uint32_t nib) {
  const uint32_t c = nib & 7u;
  const float mag = c < 2u ? 32.0f * static_cast<float>(c)
                           : ldexpf(1.0f + 0.5f * static_cast<float>(c & 1u), static_cast<int>(c >> 1) + 5);
  return (nib & 8u) ? -mag : mag;
}

template <int kFmt>
__global__ void __launch_bounds__(kThreads) mx_to_blocks_kernel(PtMxBlocksParams p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= p.rows * p.kb32) return;
  const int64_t r = idx / p.kb32;
  const int64_t j = idx - r * p.kb32;
  const uint8_t* srow = p.scale + (r / p.scale_row_div) * p.kb32;
  const int64_t j0 = j & ~int64_t{3};
  int emax = 0;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    if (j0 + t < p.kb32) emax = max(emax, static_cast<int>(__ldg(srow + j0 + t)));
  }
  const float factor = ldexpf(1.0f, static_cast<int>(__ldg(srow + j)) - emax);
  const int64_t k0 = j * 32;
  const int n = static_cast<int>(min(int64_t{32}, p.k - k0));  // 32, or 16 for a last half block
  uint8_t* out = static_cast<uint8_t*>(p.q_out) + r * p.k + k0;
  for (int v = 0; v < n; v += 16) {
    alignas(16) uint8_t res[16];
    if constexpr (kFmt == kFp4) {
      const uint8_t* in = static_cast<const uint8_t*>(p.q) + r * (p.k / 2) + (k0 + v) / 2;
      const uint2 x = __ldg(reinterpret_cast<const uint2*>(in));
      const uint32_t w[2] = {x.x, x.y};
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint32_t nib = (w[i / 8] >> (4 * (i % 8))) & 15u;
        res[i] = encode<kE4M3>(fp4_value(nib) * factor);
      }
    } else {
      const uint8_t* in = static_cast<const uint8_t*>(p.q) + r * p.k + k0 + v;
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(in));
      const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        res[i] = encode<kFmt>(decode<kFmt>(static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)))) * factor);
      }
    }
    *reinterpret_cast<uint4*>(out + v) = *reinterpret_cast<const uint4*>(res);
  }
  if ((j & 3) == 0) {
    const int shift = kFmt == kFp4 ? kFp4Shift : 0;
    const int64_t at = p.scale_ld_mn ? (j / 4) * p.scale_ld_mn + r : r * ((p.kb32 + 3) / 4) + j / 4;
    p.scale_out[at] = ldexpf(1.0f, emax - kE8m0Bias - shift);
  }
}

template <int kFmt>
struct MxToBlocks {
  static int run(const PtMxBlocksParams* p, char* err, size_t err_len) {
    const int64_t items = p->rows * p->kb32;
    if (items <= 0) return 0;
    if (p->k % 16 || p->kb32 != (p->k + 31) / 32 || (p->scale_row_div != 1 && p->scale_row_div != 32)) {
      snprintf(err, err_len, "MX restatement: k %lld must be a multiple of 16 with kb32 = ceil(k/32) (%lld)",
               static_cast<long long>(p->k), static_cast<long long>(p->kb32));
      return 1;
    }
    const int64_t grid = (items + kThreads - 1) / kThreads;
    if (grid > INT32_MAX) {
      snprintf(err, err_len, "MX restatement: %lld sub-blocks are too many for one launch",
               static_cast<long long>(items));
      return 1;
    }
    mx_to_blocks_kernel<kFmt><<<static_cast<unsigned>(grid), kThreads, 0, static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch("MX restatement", err, err_len);
  }
};

}  // namespace primus_turbo::kernels::mx_blocks

// Exports Kernel::run as pt_mx_blocks_run.
#define PT_JIT_EXPORT_MX_BLOCKS(Kernel)                                                               \
  PT_JIT_EXPORT_ABI_VERSION                                                                           \
  extern "C" __attribute__((visibility("default"))) int pt_mx_blocks_run(const PtMxBlocksParams* params, \
                                                                         char* err, size_t err_len) { \
    return Kernel::run(params, err, err_len);                                                         \
  }
