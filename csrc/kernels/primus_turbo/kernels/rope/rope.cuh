// Rotary position embedding of q and k in one launch, forward and backward.
//
//   half-rotated (GPT-NeoX, Llama), h = rotary_dim / 2, j < h:
//     y[j]     = x[j] * cos_j - x[j + h] * sin_j
//     y[j + h] = x[j + h] * cos_j + x[j] * sin_j
//   interleaved (GPT-J): the pair is (x[2j], x[2j + 1]) instead of (x[j], x[j + h]).
//   Features rotary_dim..head_dim-1 are copied. angle_j = position * theta^(-2j / rotary_dim), or
//   cos_j / sin_j read from a table row. The backward is the rotation by -angle (sin negated).
//
// Memory bound, so every load should be independent of the others: a block covers a few whole
// tokens (all heads of q and k); the per-token facts (offsets, position, found by division and
// binary search) are computed once into shared memory, then the block's work items (one 16-byte
// vector of one head, with its partner half for half-rotated pairs) are spread over the threads,
// each issuing the loads of kItems items before using them. cos/sin rows are read after the data
// loads (the row is shared by every head of the token, so these hit L1) or computed with the angle
// reduced in fp64 (inverse frequencies once per block in shared memory).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/common/convert.cuh"
#include "primus_turbo/kernels/common/warp.cuh"
#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/rope/rope_abi.h"

namespace primus_turbo::kernels::rope {

constexpr int kBlockThreads = 256;
constexpr int kMinBlocksPerSm = 4;  // <= 64 registers: 1024 threads an SM keep enough loads in flight
constexpr int kMaxTokensPerBlock = 64;

// N elements moved together; kAlign is 16 on the vector path and the element size on the scalar
// path (where an interleaved pair is two scalar accesses: the pointers may be element-aligned only).
template <class E, int N, int kAlign>
struct alignas(kAlign) Pack {
  E v[N];
};

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

// What every item of one token needs, computed once per block (the 64-bit divisions, the
// position search) and kept in shared memory.
struct TokenInfo {
  int64_t q_off, k_off;  // element offsets of the token in q and k
  double pos;            // its rotary position
};

template <class T, int N, int kAlign>
__device__ __forceinline__ void rotate(const Pack<T, N, kAlign>& x0, const Pack<T, N, kAlign>& x1, const float* c,
                                       const float* s, Pack<T, N, kAlign>& y0, Pack<T, N, kAlign>& y1) {
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const float a = to_float(x0.v[e]), b = to_float(x1.v[e]);
    y0.v[e] = from_float<T>(a * c[e] - b * s[e]);
    y1.v[e] = from_float<T>(b * c[e] + a * s[e]);
  }
}

// kVec: elements per access (1 or 16 / sizeof(T)); kInterleaved: the pair layout; kTable: cos/sin
// from p.cos / p.sin rather than computed. Block b covers tokens [b, b + 1) * tokens_per_block; its
// work items (token, head, vector) are independent, so loads of several items are in flight at once.
template <class T, int kVec, bool kInterleaved, bool kTable>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm) rope_kernel(PtRopeParams p) {
  // An interleaved item holds whole pairs: at least two elements.
  constexpr int kItemElems = kInterleaved && kVec < 2 ? 2 : kVec;
  constexpr int kPairs = kInterleaved ? kItemElems / 2 : kItemElems;  // angles per rotated item
  constexpr int kAlign = kVec > 1 ? 16 : static_cast<int>(sizeof(T));
  using P = Pack<T, kItemElems, kAlign>;  // a rotated item (half-rotated: and its partner)
  using C = Pack<T, kVec, kAlign>;        // a copied (pass-through) item
  constexpr bool kSame = kItemElems == kVec;
  // Items a thread loads before computing: 64 bytes in flight (a half-rotated item reads two vectors).
  constexpr int kItems = kInterleaved ? 4 : 2;
  constexpr int kAngleAlign = kVec > 1 ? (kPairs * 4 >= 16 ? 16 : kPairs * 4) : 4;
  using A = Pack<float, kPairs, kAngleAlign>;

  __shared__ TokenInfo tok[kMaxTokensPerBlock];
  extern __shared__ double inv_freq[];  // [rotary_dim / 2], theta mode only
  const int half = p.rotary_dim / 2;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * p.tokens_per_block;
  const int64_t tokens = p.n0 * p.n1;
  const int ntok = static_cast<int>(tokens - t0 < p.tokens_per_block ? tokens - t0 : p.tokens_per_block);
  for (int i = threadIdx.x; i < ntok; i += blockDim.x) {
    const int64_t t = t0 + i, i0 = t / p.n1, i1 = t - i0 * p.n1;
    tok[i].q_off = i0 * p.q_stride0 + i1 * p.q_stride1;
    tok[i].k_off = i0 * p.k_stride0 + i1 * p.k_stride1;
    tok[i].pos = static_cast<double>(token_position(p, t, i0, i1));
  }
  if constexpr (!kTable) {
    for (int j = threadIdx.x; j < half; j += blockDim.x) inv_freq[j] = exp2(-(2.0 * j / p.rotary_dim) * p.log2_theta);
  }
  __syncthreads();

  const int rot_items = kInterleaved ? p.rotary_dim / kItemElems : half / kItemElems;
  const int items_per_head = rot_items + (p.head_dim - p.rotary_dim) / kVec;
  const int items_per_token = (p.heads_q + p.heads_k) * items_per_head;
  const int total = ntok * items_per_token;
  const float sign = p.backward ? -1.f : 1.f;

  for (int base = threadIdx.x; base < total; base += kItems * blockDim.x) {
    P a[kItems], b[kItems];
    C c[kItems];
#pragma unroll
    for (int u = 0; u < kItems; ++u) {  // issue every load first
      const int item = base + u * blockDim.x;
      if (item >= total) break;
      const int tl = item / items_per_token, rem = item - tl * items_per_token;
      const int head = rem / items_per_head, r = rem - head * items_per_head;
      const bool is_q = head < p.heads_q;
      const int h = is_q ? head : head - p.heads_q;
      const T* src = is_q ? static_cast<const T*>(p.q) + tok[tl].q_off + h * p.q_stride_h
                          : static_cast<const T*>(p.k) + tok[tl].k_off + h * p.k_stride_h;
      if (r < rot_items) {
        const int col = r * kItemElems;
        a[u] = *reinterpret_cast<const P*>(src + col);
        if (!kInterleaved) b[u] = *reinterpret_cast<const P*>(src + col + half);
      } else {
        const C v = *reinterpret_cast<const C*>(src + p.rotary_dim + (r - rot_items) * kVec);
        if constexpr (kSame) a[u] = v; else c[u] = v;  // one register set when the types agree
      }
    }
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      const int item = base + u * blockDim.x;
      if (item >= total) break;
      const int tl = item / items_per_token, rem = item - tl * items_per_token;
      const int head = rem / items_per_head, r = rem - head * items_per_head;
      const bool is_q = head < p.heads_q;
      const int h = is_q ? head : head - p.heads_q;
      const int heads = is_q ? p.heads_q : p.heads_k;
      T* dst = static_cast<T*>(is_q ? p.q_out : p.k_out) + ((t0 + tl) * heads + h) * p.head_dim;
      if (r >= rot_items) {
        if constexpr (kSame) {
          *reinterpret_cast<C*>(dst + p.rotary_dim + (r - rot_items) * kVec) = a[u];
        } else {
          *reinterpret_cast<C*>(dst + p.rotary_dim + (r - rot_items) * kVec) = c[u];
        }
        continue;
      }
      const int col = r * kItemElems;
      const int j0 = kInterleaved ? col / 2 : col;  // first angle of the item
      float cs[kPairs], sn[kPairs];
      const double pos = tok[tl].pos;
      if constexpr (kTable) {
        if (pos >= 0 && pos < static_cast<double>(p.table_len)) {
          const int64_t row = static_cast<int64_t>(pos) * half + j0;
          const A cv = *reinterpret_cast<const A*>(p.cos + row), sv = *reinterpret_cast<const A*>(p.sin + row);
#pragma unroll
          for (int e = 0; e < kPairs; ++e) cs[e] = cv.v[e], sn[e] = sign * sv.v[e];
        } else {
#pragma unroll
          for (int e = 0; e < kPairs; ++e) cs[e] = sn[e] = __int_as_float(0x7fc00000);  // NaN: visible downstream
        }
      } else {
#pragma unroll
        for (int e = 0; e < kPairs; ++e) {
          // The angle in fp64, reduced to [-pi, pi] there, so fp32 sincos stays accurate at long
          // positions (an fp32 product would lose ~1e-3 rad at position 32K).
          const double angle = pos * inv_freq[j0 + e];
          constexpr double kTwoPi = 6.283185307179586476925286766559;
          const float rr = static_cast<float>(angle - kTwoPi * rint(angle * (1.0 / kTwoPi)));
          float sv;
          sincosf(rr, &sv, &cs[e]);
          sn[e] = sign * sv;
        }
      }
      if constexpr (kInterleaved) {
        Pack<T, kPairs, 2 * sizeof(T)> x0, x1, y0, y1;  // even / odd elements
#pragma unroll
        for (int e = 0; e < kPairs; ++e) x0.v[e] = a[u].v[2 * e], x1.v[e] = a[u].v[2 * e + 1];
        rotate(x0, x1, cs, sn, y0, y1);
        P y;
#pragma unroll
        for (int e = 0; e < kPairs; ++e) y.v[2 * e] = y0.v[e], y.v[2 * e + 1] = y1.v[e];
        *reinterpret_cast<P*>(dst + col) = y;
      } else {
        P y0, y1;
        rotate(a[u], b[u], cs, sn, y0, y1);
        *reinterpret_cast<P*>(dst + col) = y0;
        *reinterpret_cast<P*>(dst + col + half) = y1;
      }
    }
  }
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
        p->tokens_per_block < 1 || p->tokens_per_block > kMaxTokensPerBlock ||
        static_cast<int64_t>(p->tokens_per_block) * (p->heads_q + p->heads_k) * p->head_dim > INT32_MAX) {
      snprintf(err, err_len, "RoPE module (vector %d, interleaved %d) cannot take head_dim %d, rotary_dim %d, %d tokens a block",
               kVec, static_cast<int>(kInterleaved), p->head_dim, p->rotary_dim, p->tokens_per_block);
      return 1;
    }
    const int64_t grid = (tokens + p->tokens_per_block - 1) / p->tokens_per_block;
    if (grid > INT32_MAX) {
      snprintf(err, err_len, "RoPE: %lld tokens are too many for one launch", static_cast<long long>(tokens));
      return 1;
    }
    const size_t smem = kTable ? 0 : sizeof(double) * half;
    rope_kernel<T, kVec, kInterleaved, kTable>
        <<<static_cast<unsigned>(grid), kBlockThreads, smem, static_cast<cudaStream_t>(p->stream)>>>(*p);
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
