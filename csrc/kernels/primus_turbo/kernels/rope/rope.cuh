// Rotary position embedding of q and k in one launch, forward and backward.
//
//   half-rotated (GPT-NeoX, Llama), h = rotary_dim / 2, j < h:
//     y[j]     = x[j] * cos_j - x[j + h] * sin_j
//     y[j + h] = x[j + h] * cos_j + x[j] * sin_j
//   interleaved (GPT-J): the pair is (x[2j], x[2j + 1]) instead of (x[j], x[j + h]).
//   Features rotary_dim..head_dim-1 are copied. angle_j = position * theta^(-2j / rotary_dim), or
//   cos_j / sin_j read from a table row. The backward is the rotation by -angle (sin negated).
//
// Memory bound: one block per token covers every head of q and k, so the token's cos/sin row is
// produced once (read from the table, or computed in fp64-reduced fp32) into shared memory and
// reused by all heads. Work items are vectors (16 bytes when the host allowed it) of one head;
// consecutive threads take consecutive items, and each thread loads up to kItems items before it
// computes, so several loads are in flight.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/rope/rope_abi.h"

namespace primus_turbo::kernels::rope {

constexpr int kItems = 4;  // items a thread loads before computing

// N elements moved together; kAlign is 16 on the vector path and the element size on the scalar
// path (where an interleaved pair is two scalar accesses: the pointers may be element-aligned only).
template <class E, int N, int kAlign>
struct alignas(kAlign) Pack {
  E v[N];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class E>
__device__ __forceinline__ E from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <class I>
__device__ __forceinline__ int64_t load_index(const void* p, int64_t i) {
  return static_cast<int64_t>(static_cast<const I*>(p)[i]);
}

// The rotary position of token t = i0 * n1 + i1.
__device__ __forceinline__ int64_t token_position(const PtRopeParams& p, int64_t t, int64_t i0, int64_t i1) {
  const int64_t seq_index = p.seq_dim == 0 ? i0 : i1;
  switch (p.pos_mode) {
    case PT_ROPE_POS_SHARED:
      return p.positions_int64 ? load_index<int64_t>(p.positions, seq_index) : load_index<int32_t>(p.positions, seq_index);
    case PT_ROPE_POS_PER_TOKEN:
      return p.positions_int64 ? load_index<int64_t>(p.positions, t) : load_index<int32_t>(p.positions, t);
    case PT_ROPE_POS_CU_SEQLENS: {
      // The last sequence start <= t (binary search; every thread finds the same one).
      int64_t lo = 0, hi = p.num_seqs;  // invariant: cu[lo] <= t, answer in [lo, hi)
      while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (p.cu_seqlens[mid] <= t) lo = mid; else hi = mid;
      }
      return t - p.cu_seqlens[lo];
    }
    default:
      return seq_index;
  }
}

// cos/sin of the token's angles into shared memory (sin negated for the backward).
template <bool kTable>
__device__ __forceinline__ void fill_angles(const PtRopeParams& p, int64_t pos, float* cs, float* sn) {
  const int half = p.rotary_dim / 2;
  const float sign = p.backward ? -1.f : 1.f;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    float c, s;
    if constexpr (kTable) {
      if (pos >= 0 && pos < p.table_len) {
        c = p.cos[pos * half + j];
        s = p.sin[pos * half + j];
      } else {
        c = s = __int_as_float(0x7fc00000);  // out-of-range position: NaN, visible downstream
      }
    } else {
      // The angle in fp64, reduced to [-pi, pi] there, so fp32 sincos stays accurate at long
      // positions (an fp32 product would lose ~1e-3 rad at position 32K).
      const double inv_freq = exp2(-(2.0 * j / p.rotary_dim) * p.log2_theta);
      const double angle = static_cast<double>(pos) * inv_freq;
      constexpr double kTwoPi = 6.283185307179586476925286766559;
      const double r = angle - kTwoPi * rint(angle * (1.0 / kTwoPi));
      sincosf(static_cast<float>(r), &s, &c);
    }
    cs[j] = c;
    sn[j] = sign * s;
  }
}

// kVec: elements per access (1 or 16 / sizeof(T)); kInterleaved: the pair layout; kTable: cos/sin
// from p.cos / p.sin rather than computed.
template <class T, int kVec, bool kInterleaved, bool kTable>
__global__ void rope_kernel(PtRopeParams p) {
  // An interleaved item holds whole pairs: at least two elements.
  constexpr int kItemElems = kInterleaved && kVec < 2 ? 2 : kVec;
  constexpr int kAlign = kVec > 1 ? 16 : static_cast<int>(sizeof(T));
  using P = Pack<T, kItemElems, kAlign>;  // a rotated item
  using C = Pack<T, kVec, kAlign>;        // a copied (pass-through) item
  extern __shared__ float smem[];
  const int half = p.rotary_dim / 2;
  float* cs = smem;
  float* sn = smem + half;

  const int rot_items = kInterleaved ? p.rotary_dim / kItemElems : half / kItemElems;
  const int pass_items = (p.head_dim - p.rotary_dim) / kVec;
  const int items_per_head = rot_items + pass_items;
  const int heads = p.heads_q + p.heads_k;
  const int total = heads * items_per_head;
  const int64_t tokens = p.n0 * p.n1;

  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int64_t i0 = t / p.n1, i1 = t - i0 * p.n1;
    fill_angles<kTable>(p, token_position(p, t, i0, i1), cs, sn);
    __syncthreads();
    const T* q_in = static_cast<const T*>(p.q) + i0 * p.q_stride0 + i1 * p.q_stride1;
    const T* k_in = static_cast<const T*>(p.k) + i0 * p.k_stride0 + i1 * p.k_stride1;
    T* q_out = static_cast<T*>(p.q_out) + t * p.heads_q * p.head_dim;
    T* k_out = static_cast<T*>(p.k_out) + t * p.heads_k * p.head_dim;

    for (int base = threadIdx.x; base < total; base += kItems * blockDim.x) {
      P a[kItems], b[kItems];
      C c[kItems];
      const T* src[kItems];
      T* dst[kItems];
      int col[kItems];  // first feature of the item (of its first half, for half-rotated pairs)
#pragma unroll
      for (int u = 0; u < kItems; ++u) {
        const int item = base + u * blockDim.x;
        src[u] = nullptr;
        if (item >= total) continue;
        const int head = item / items_per_head;
        const int r = item - head * items_per_head;
        const bool is_q = head < p.heads_q;
        const int h = is_q ? head : head - p.heads_q;
        src[u] = is_q ? q_in + h * p.q_stride_h : k_in + h * p.k_stride_h;
        dst[u] = (is_q ? q_out : k_out) + static_cast<int64_t>(h) * p.head_dim;
        if (r < rot_items) {
          col[u] = r * kItemElems;
          a[u] = *reinterpret_cast<const P*>(src[u] + col[u]);
          if (!kInterleaved) b[u] = *reinterpret_cast<const P*>(src[u] + col[u] + half);
        } else {
          col[u] = p.rotary_dim + (r - rot_items) * kVec;  // pass-through
          c[u] = *reinterpret_cast<const C*>(src[u] + col[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kItems; ++u) {
        if (src[u] == nullptr) continue;
        const int c0 = col[u];
        if (c0 >= p.rotary_dim) {
          *reinterpret_cast<C*>(dst[u] + c0) = c[u];
        } else if constexpr (kInterleaved) {
          P y;
#pragma unroll
          for (int e = 0; e < kItemElems; e += 2) {
            const int j = (c0 + e) / 2;
            const float x0 = to_float(a[u].v[e]), x1 = to_float(a[u].v[e + 1]);
            y.v[e] = from_float<T>(x0 * cs[j] - x1 * sn[j]);
            y.v[e + 1] = from_float<T>(x1 * cs[j] + x0 * sn[j]);
          }
          *reinterpret_cast<P*>(dst[u] + c0) = y;
        } else {
          P y0, y1;
#pragma unroll
          for (int e = 0; e < kItemElems; ++e) {
            const int j = c0 + e;
            const float x0 = to_float(a[u].v[e]), x1 = to_float(b[u].v[e]);
            y0.v[e] = from_float<T>(x0 * cs[j] - x1 * sn[j]);
            y1.v[e] = from_float<T>(x1 * cs[j] + x0 * sn[j]);
          }
          *reinterpret_cast<P*>(dst[u] + c0) = y0;
          *reinterpret_cast<P*>(dst[u] + c0 + half) = y1;
        }
      }
    }
    __syncthreads();  // cs / sn are rewritten for the next token
  }
}

inline int report_launch(const char* what, char* err, size_t err_len) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  snprintf(err, err_len, "%s launch failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return 1;
}

template <class T, bool kVectorized, bool kInterleaved, bool kTable>
struct Rope {
  static constexpr int kVec = kVectorized ? static_cast<int>(16 / sizeof(T)) : 1;
  static constexpr int kItemElems = kInterleaved && kVec < 2 ? 2 : kVec;

  static int run(const PtRopeParams* p, char* err, size_t err_len) {
    const int64_t tokens = p->n0 * p->n1;
    if (tokens <= 0 || p->heads_q + p->heads_k <= 0) return 0;
    const int half = p->rotary_dim / 2;
    const int rot_elems = kInterleaved ? p->rotary_dim : half;
    if (p->rotary_dim < 2 || p->rotary_dim % 2 || p->rotary_dim > p->head_dim || rot_elems % kItemElems ||
        (p->head_dim - p->rotary_dim) % kVec || (kTable && (p->cos == nullptr || p->sin == nullptr)) ||
        p->block_threads < 32 || p->block_threads > 1024 || p->block_threads % 32) {
      snprintf(err, err_len, "RoPE module (vector %d, interleaved %d) cannot take head_dim %d, rotary_dim %d, %d threads",
               kVec, static_cast<int>(kInterleaved), p->head_dim, p->rotary_dim, p->block_threads);
      return 1;
    }
    const unsigned grid = static_cast<unsigned>(tokens < (int64_t{1} << 30) ? tokens : (int64_t{1} << 30));
    const size_t smem = 2 * sizeof(float) * half;
    rope_kernel<T, kVec, kInterleaved, kTable>
        <<<grid, p->block_threads, smem, static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch(p->backward ? "RoPE backward" : "RoPE forward", err, err_len);
  }
};

}  // namespace primus_turbo::kernels::rope

// Exports Kernel::run as pt_rope_run.
#define PT_JIT_EXPORT_ROPE(Kernel)                                                                    \
  PT_JIT_EXPORT_ABI_VERSION                                                                           \
  extern "C" __attribute__((visibility("default"))) int pt_rope_run(const PtRopeParams* params, char* err, \
                                                                    size_t err_len) {                 \
    return Kernel::run(params, err, err_len);                                                         \
  }
