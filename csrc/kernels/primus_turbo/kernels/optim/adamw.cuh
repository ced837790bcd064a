// Fused AdamW: one pass over each parameter's four tensors (param, grad, first and second moment),
// read once and written once, for up to PT_ADAMW_MAX_TENSORS tensors a launch
// (kernels/optim/adamw_abi.h). A CTA updates PT_ADAMW_BLOCK_ELEMS consecutive elements of one
// tensor, 8 a thread with 16-byte accesses where the tensor's pointers allow. The math is float32
// whatever the stored dtypes; each stored value is rounded once (to nearest even).
//
// With an amax slot, the CTA also reduces max |param| over the values it stored, one atomic a CTA:
// the FP8 layers' tensorwise weight quantization takes it instead of reading the weight again.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/common/warp.cuh"
#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/optim/adamw_abi.h"

namespace primus_turbo::kernels::optim {

constexpr int kThreads = 256;
constexpr int kItems = PT_ADAMW_BLOCK_ELEMS / kThreads;  // elements a thread updates
static_assert(kItems == 8, "a thread's elements are one 16-byte access of a 16-bit dtype");

template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float(float v) { return v; }
template <>
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }

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

template <class T>
__device__ __forceinline__ void store_vec(void* p, int64_t i, const float (&v)[kItems]) {
  constexpr int kPer = 16 / sizeof(T);
  uint4* dst = reinterpret_cast<uint4*>(static_cast<T*>(p) + i);
#pragma unroll
  for (int w = 0; w < kItems / kPer; ++w) {
    uint4 word;
    T* e = reinterpret_cast<T*>(&word);
#pragma unroll
    for (int j = 0; j < kPer; ++j) e[j] = from_float<T>(v[w * kPer + j]);
    dst[w] = word;
  }
}

struct Step {
  float decay, step_size, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps;
};

// One element's update; returns the parameter as stored (rounded to TP), as a float.
template <class TP>
__device__ __forceinline__ float update(float& p, float g, float& m, float& v, const Step& s) {
  p *= s.decay;
  m = m + (g - m) * s.one_minus_beta1;  // torch's lerp for a weight below 0.5
  v = v * s.beta2 + s.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  p = p + -s.step_size * (m / denom);
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

struct AdamW {
  template <class TP, class TS>
  static void launch(const PtAdamWParams& p, cudaStream_t stream) {
    adamw_kernel<TP, TS><<<static_cast<unsigned>(p.blocks), kThreads, 0, stream>>>(p);
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
    if (p->count < 1 || p->count > PT_ADAMW_MAX_TENSORS || p->blocks < 1 || p->blocks > 0x7fffffff) {
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
