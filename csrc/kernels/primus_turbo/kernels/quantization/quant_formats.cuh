// Element formats of the quantization kernels: FP8 (E4M3, E5M2), FP4 (E2M1, two per byte), the
// scales (fp32 or E8M0 power of two), the counter-based hash behind stochastic rounding and the
// 16-point random Hadamard transform.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "primus_turbo/kernels/common/convert.cuh"

namespace primus_turbo::kernels::quant {

// An all-zero block still gets a finite scale (FP8_MAX / 1e-30 fits in fp32), so q is 0 and
// scale_inv is a tiny positive number: no inf or nan anywhere.
constexpr float kAmaxEps = 1e-30f;

// 2^e as a float for e in [-149, 127] (exact, denormals included).
__device__ __forceinline__ float pow2f(int e) {
  return e >= -126 ? __uint_as_float(static_cast<uint32_t>(e + 127) << 23) : __uint_as_float(1u << (e + 149));
}

// ceil(log2(a)) for a normal a >= 0, exact (from the bits, not log2f); zero and denormals give -127
// (the smallest E8M0 exponent).
__device__ __forceinline__ int ceil_log2(float a) {
  const uint32_t bits = __float_as_uint(a);
  const int e = static_cast<int>((bits >> 23) & 0xff);
  return e == 0 ? -127 : e - 127 + ((bits & 0x7fffffu) != 0);
}

struct E4M3 {
  static constexpr float kMax = 448.0f;
  static constexpr bool kFp4 = false;
  __device__ static uint8_t encode(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }
  // Two values in one conversion instruction: a in the low byte, b in the high byte.
  __device__ static uint16_t encode2(float a, float b) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  }
  __device__ static float decode(uint8_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
  }
};

struct E5M2 {
  static constexpr float kMax = 57344.0f;
  static constexpr bool kFp4 = false;
  __device__ static uint8_t encode(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2); }
  __device__ static uint16_t encode2(float a, float b) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E5M2);
  }
  __device__ static float decode(uint8_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E5M2)));
  }
};

// E2M1 codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
struct E2M1 {
  static constexpr float kMax = 6.0f;
  static constexpr bool kFp4 = true;
  // Round to nearest, ties to the even code, saturating at 6.
  __device__ static uint8_t encode(float v) {
    const float a = fabsf(v);
    uint8_t c = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3 : a <= 2.5f ? 4 : a < 3.5f ? 5 : a <= 5.0f ? 6 : 7;
    return c | (signbit(v) ? 8 : 0);
  }
  // Stochastic rounding: up to the next code with probability (a - lo) / (hi - lo); u in [0, 1).
  __device__ static uint8_t encode_sr(float v, float u) {
    const float a = fminf(fabsf(v), kMax);
    float lo, step;
    uint8_t c;
    if (a < 2.0f) {
      c = static_cast<uint8_t>(a * 2.0f);
      lo = c * 0.5f;
      step = 0.5f;
    } else if (a < 4.0f) {
      lo = floorf(a);
      c = lo == 2.0f ? 4 : 5;
      step = 1.0f;
    } else {
      lo = 4.0f;
      c = 6;
      step = 2.0f;
    }
    if (c < 7 && u * step < a - lo) ++c;
    return c | (signbit(v) ? 8 : 0);
  }
  __device__ static float decode(uint8_t b) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float m = mag[b & 7];
    return (b & 8) ? -m : m;
  }
};

// The multiplier applied before rounding, the scale_inv stored (fp32) and its E8M0 byte.
struct Scale {
  float mult;
  float inv;
  uint8_t e8m0;
};

template <class F>
__device__ __forceinline__ Scale make_scale(float amax, bool e8m0) {
  Scale s;
  if (e8m0) {
    // The smallest power of two that brings the block's amax within the element format's range:
    // ceil(log2(amax / max)), so no element clips (OCP MX's floor(log2(amax)) - emax can leave the
    // largest values up to 2x past the range, where they saturate).
    int e = ceil_log2(__fdiv_rn(amax, F::kMax));
    e = max(-127, min(127, e));
    s.mult = pow2f(-e);
    s.inv = pow2f(e);
    s.e8m0 = static_cast<uint8_t>(e + 127);
  } else {
    s.mult = __fdiv_rn(F::kMax, fmaxf(amax, kAmaxEps));
    s.inv = __frcp_rn(s.mult);
    s.e8m0 = 0;
  }
  return s;
}

// Four FP8 codes of v * mult packed into a word, first value in the low byte (two conversions).
template <class F>
__device__ __forceinline__ uint32_t encode4(float a, float b, float c, float d, float mult) {
  return static_cast<uint32_t>(F::encode2(a * mult, b * mult)) |
         (static_cast<uint32_t>(F::encode2(c * mult, d * mult)) << 16);
}

__device__ __forceinline__ void store_scale_at(void* dst, int64_t i, const Scale& sc, bool e8m0) {
  if (e8m0) {
    static_cast<uint8_t*>(dst)[i] = sc.e8m0;
  } else {
    static_cast<float*>(dst)[i] = sc.inv;
  }
}

__device__ __forceinline__ float decode_scale(const void* s, int64_t i, bool e8m0) {
  if (e8m0) return pow2f(static_cast<int>(static_cast<const uint8_t*>(s)[i]) - 127);
  return static_cast<const float*>(s)[i];
}

// Uniform in [0, 1) from (seed, element index): splitmix64 finalizer, 24 bits.
__device__ __forceinline__ float hash_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// Random Hadamard transform on 16 consecutive elements of the quantized dim:
// y = H16 * diag(sign) * x / 4 (orthonormal; the inverse is diag(sign) * H16 * y / 4). Bit i of
// kRhtSigns set means element i of each group of 16 is negated.
constexpr uint32_t kRhtSigns = 0x9A5Cu;

__device__ __forceinline__ float rht_sign(int i) { return (kRhtSigns >> (i & 15)) & 1 ? -1.0f : 1.0f; }

// In-register 16-point transform.
__device__ __forceinline__ void rht16(float (&v)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] *= rht_sign(i);
#pragma unroll
  for (int h = 1; h < 16; h <<= 1) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if ((i & h) == 0) {
        const float a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] *= 0.25f;
}

// The same transform when each lane holds 4 consecutive elements: a group of 16 is 4 lanes.
__device__ __forceinline__ void rht16_lanes(float (&v)[4], int lane) {
  const int base = (lane & 3) * 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] *= rht_sign(base + j);
  const float h0 = v[0] + v[1], h1 = v[0] - v[1], h2 = v[2] + v[3], h3 = v[2] - v[3];
  v[0] = h0 + h2;
  v[1] = h1 + h3;
  v[2] = h0 - h2;
  v[3] = h1 - h3;
#pragma unroll
  for (int bit = 1; bit <= 2; bit <<= 1) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p = __shfl_xor_sync(0xffffffffu, v[j], bit);
      v[j] = (lane & bit) ? p - v[j] : v[j] + p;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] *= 0.25f;
}

}  // namespace primus_turbo::kernels::quant
