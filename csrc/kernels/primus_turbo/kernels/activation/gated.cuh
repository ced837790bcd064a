// Gated activations (SwiGLU, GeGLU) over the last dimension, forward and backward, with the MoE
// variant's per-row routing probability and row mask fused in.
//
//   x = [gate | up] per row (cols elements each); a = act(gate), act = SiLU or exact (erf) GELU
//   forward : out = a * up * p                       p = probs[row] (1 without probs)
//   backward: dgate = dy * p * up * act'(gate),  dup = dy * p * a,  dp = sum over the row of dy * a * up
//   row_mask[row] == 0: out, dx and dp of the row are zeros and the row's inputs are not read.
//
// Memory bound: one warp per row (rows are many at training sizes), 16-byte accesses when the host
// found the pointers and cols allow them, kUnroll vectors of each input per lane loaded before
// any is used (outputs may alias nothing the compiler can prove, so the batching is explicit).
// dp is a warp sum: deterministic, no atomics. Arithmetic in fp32. With p.amax, each warp also
// merges the largest |output| it wrote (after rounding) into *p.amax with one atomic max.
//
// FP8 forward modules (kFp8, quantization/fused_fp8.cuh) also write out quantized to the format F,
// from the rounded out values in registers. A rowwise scale needs the row's amax before any byte
// is written, so these modules give each row a block: every thread keeps up to kFp8CacheIters
// output vectors in registers (rows up to 32768 2-byte elements), wider rows are computed twice
// (amax pass, then quantize pass). 1x128 scales are a shuffle max over the lanes of a block.
#pragma once

#include <algorithm>

#include "primus_turbo/kernels/common/vec.cuh"
#include "primus_turbo/kernels/common/warp.cuh"
#include "primus_turbo/kernels/jit_abi.h"
#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/quantization/fused_fp8.cuh"

namespace primus_turbo::kernels::gated {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;     // forward: vectors of gate and up per lane in flight
constexpr int kBwdUnroll = 2;  // backward: three inputs, so fewer per lane and more warps per SM
constexpr int kMinBlocks = 2;  // at most 128 registers: >= 16 resident warps per SM

constexpr int kFp8CacheIters = 8;      // FP8 forward: output vectors per thread held in registers
constexpr int kFp8LoadBatch = 4;       // FP8 forward: (gate, up) vector pairs per thread loaded before use
constexpr int kFp8VecsPerThread = 4;   // target vectors per thread when choosing the block size
constexpr int kFp8MaxThreads = 512;

enum Act { kSilu = 0, kGelu = 1 };

template <int kAct>
struct Activation;

// f(g), and for the backward f and f' together from one exponential (SiLU) or one erf (GELU).
// The sigmoid by a fast reciprocal (0 where exp overflows): an IEEE division per element made
// these memory-bound kernels issue-bound (SwiGLU forward at MoE widths 0.89 -> 0.95 of copy).
template <>
struct Activation<kSilu> {
  __device__ static __forceinline__ float sigmoid(float g) { return __fdividef(1.f, 1.f + __expf(-g)); }
  __device__ static __forceinline__ float f(float g) { return g * sigmoid(g); }
  __device__ static __forceinline__ void f_df(float g, float& a, float& da) {
    const float s = sigmoid(g);
    a = g * s;
    da = s * (1.f + g * (1.f - s));
  }
};

template <>
struct Activation<kGelu> {  // exact GELU (torch's approximate="none")
  __device__ static __forceinline__ float f(float g) { return 0.5f * g * (1.f + erff(g * 0.70710678118654752f)); }
  __device__ static __forceinline__ void f_df(float g, float& a, float& da) {
    const float cdf = 0.5f * (1.f + erff(g * 0.70710678118654752f));
    a = g * cdf;
    da = cdf + g * 0.39894228040143268f * __expf(-0.5f * g * g);
  }
};

template <class T, int kVec>
__device__ __forceinline__ Pack<T, kVec> zeros() {
  Pack<T, kVec> z;
#pragma unroll
  for (int j = 0; j < kVec; ++j) z.v[j] = from_float<T>(0.f);
  return z;
}

// Largest |v| of a pack, as rounded to T (what a quantizer of the output would read).
template <class T, int kVec>
__device__ __forceinline__ float abs_max(const Pack<T, kVec>& v, float m) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) m = fmaxf(m, fabsf(to_float(v.v[j])));
  return m;
}

// The warp's largest |output| into *amax (non-negative floats order like their bits).
__device__ __forceinline__ void merge_amax(float* amax, float m) {
  if (amax == nullptr) return;
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0 && m > 0.f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

template <class T, int kAct, int kVec>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocks) gated_fwd(PtGatedActParams p) {
  using TP = Pack<T, kVec>;
  using A = Activation<kAct>;
  const int lane = threadIdx.x & 31;
  const int nvec = static_cast<int>(p.cols / kVec);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  float amax = 0.f;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); row < p.rows;
       row += step) {
    TP* out = reinterpret_cast<TP*>(static_cast<T*>(p.out) + row * p.cols);
    if (p.row_mask != nullptr && p.row_mask[row] == 0) {
      for (int c = lane; c < nvec; c += 32) store_stream(out + c, zeros<T, kVec>());
      continue;
    }
    const float prob = p.probs != nullptr ? p.probs[row] : 1.f;
    const TP* gate = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + row * 2 * p.cols);
    const TP* up = gate + nvec;
    for (int base = lane; base < nvec; base += 32 * kUnroll) {
      TP gv[kUnroll], uv[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int c = base + 32 * k;
        if (c < nvec) {
          gv[k] = load_stream(gate + c);
          uv[k] = load_stream(up + c);
        }
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int c = base + 32 * k;
        if (c < nvec) {
          TP o;
#pragma unroll
          for (int j = 0; j < kVec; ++j) o.v[j] = from_float<T>(A::f(to_float(gv[k].v[j])) * to_float(uv[k].v[j]) * prob);
          store_stream(out + c, o);
          if (p.amax != nullptr) amax = abs_max(o, amax);
        }
      }
    }
  }
  merge_amax(p.amax, amax);
}

template <class T, int kAct, int kVec>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocks) gated_bwd(PtGatedActParams p) {
  using TP = Pack<T, kVec>;
  using A = Activation<kAct>;
  const int lane = threadIdx.x & 31;
  const int nvec = static_cast<int>(p.cols / kVec);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  float amax = 0.f;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); row < p.rows;
       row += step) {
    TP* dgate = reinterpret_cast<TP*>(static_cast<T*>(p.out) + row * 2 * p.cols);
    TP* dup = dgate + nvec;
    if (p.row_mask != nullptr && p.row_mask[row] == 0) {
      for (int c = lane; c < nvec; c += 32) {
        store_stream(dgate + c, zeros<T, kVec>());
        store_stream(dup + c, zeros<T, kVec>());
      }
      if (p.dprobs != nullptr && lane == 0) p.dprobs[row] = 0.f;
      continue;
    }
    const float prob = p.probs != nullptr ? p.probs[row] : 1.f;
    const TP* gate = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + row * 2 * p.cols);
    const TP* up = gate + nvec;
    const TP* dy = reinterpret_cast<const TP*>(static_cast<const T*>(p.dy) + row * p.cols);
    float dprob = 0.f;
    for (int base = lane; base < nvec; base += 32 * kBwdUnroll) {
      TP gv[kBwdUnroll], uv[kBwdUnroll], dv[kBwdUnroll];
#pragma unroll
      for (int k = 0; k < kBwdUnroll; ++k) {
        const int c = base + 32 * k;
        if (c < nvec) {
          gv[k] = load_stream(gate + c);
          uv[k] = load_stream(up + c);
          dv[k] = load_stream(dy + c);
        }
      }
#pragma unroll
      for (int k = 0; k < kBwdUnroll; ++k) {
        const int c = base + 32 * k;
        if (c < nvec) {
          TP dg, du;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float g = to_float(gv[k].v[j]), u = to_float(uv[k].v[j]), d = to_float(dv[k].v[j]);
            float a, da;
            A::f_df(g, a, da);
            dprob += d * a * u;
            const float dp = d * prob;
            dg.v[j] = from_float<T>(dp * u * da);
            du.v[j] = from_float<T>(dp * a);
          }
          store_stream(dgate + c, dg);
          store_stream(dup + c, du);
          if (p.amax != nullptr) amax = abs_max(du, abs_max(dg, amax));
        }
      }
    }
    if (p.dprobs != nullptr) {
      dprob = warp_sum(dprob);
      if (lane == 0) p.dprobs[row] = dprob;
    }
  }
  merge_amax(p.amax, amax);
}

// out of vector c of a row: act(gate) * up * prob, rounded to T.
template <class T, int kAct, int kVec>
__device__ __forceinline__ Pack<T, kVec> gated_value(const Pack<T, kVec>& g, const Pack<T, kVec>& u, float prob) {
  Pack<T, kVec> o;
#pragma unroll
  for (int j = 0; j < kVec; ++j) o.v[j] = from_float<T>(Activation<kAct>::f(to_float(g.v[j])) * to_float(u.v[j]) * prob);
  return o;
}

// FP8 forward: one block per row (grid-stride), blockDim.x a multiple of 32.
template <class T, int kAct, int kVec, int kFp8, class F>
__global__ void __launch_bounds__(kFp8MaxThreads) gated_fwd_fp8(PtGatedActParams p) {
  using TP = Pack<T, kVec>;
  __shared__ float scratch[33];
  const int rank = static_cast<int>(threadIdx.x), size = static_cast<int>(blockDim.x);
  const int nvec = static_cast<int>(p.cols / kVec);
  const bool cached = nvec <= size * kFp8CacheIters;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const quant::Fp8Row out = quant::fp8_row(p.q, p.q_scale_inv, row, p.cols, kFp8);
    TP* hp = p.out != nullptr ? reinterpret_cast<TP*>(static_cast<T*>(p.out) + row * p.cols) : nullptr;
    if (p.row_mask != nullptr && p.row_mask[row] == 0) {  // zeros, quantized as quantize_fp8 does
      const TP z = zeros<T, kVec>();
      for (int c = rank; c < nvec; c += size) {
        if (hp != nullptr) store_stream(hp + c, z);
        quant::store_fp8<F, T, kVec>(out.q + static_cast<int64_t>(c) * kVec, z, 1.f);
      }
      const int scales =
          kFp8 == quant::kFp8Rowwise ? 1 : static_cast<int>((p.cols + quant::kFusedBlock - 1) / quant::kFusedBlock);
      for (int b = rank; b < scales; b += size) out.scale[b] = quant::zero_scale_inv<F>();
      continue;
    }
    const float prob = p.probs != nullptr ? p.probs[row] : 1.f;
    const TP* gate = reinterpret_cast<const TP*>(static_cast<const T*>(p.x) + row * 2 * p.cols);
    const TP* up = gate + nvec;
    if (cached) {
      // Loads in batches of kFp8LoadBatch pairs: enough in flight, and the registers of a batch's
      // "up" vectors are free again before the next batch (no spills at 128 registers).
      TP o[kFp8CacheIters];
      float amax = 0.f;
#pragma unroll
      for (int i0 = 0; i0 < kFp8CacheIters; i0 += kFp8LoadBatch) {
        TP u[kFp8LoadBatch];
#pragma unroll
        for (int k = 0; k < kFp8LoadBatch; ++k) {
          const int c = rank + (i0 + k) * size;
          if (c < nvec) {
            o[i0 + k] = load_stream(gate + c);
            u[k] = load_stream(up + c);
          }
        }
#pragma unroll
        for (int k = 0; k < kFp8LoadBatch; ++k) {
          const int c = rank + (i0 + k) * size;
          if (c < nvec) {
            o[i0 + k] = gated_value<T, kAct, kVec>(o[i0 + k], u[k], prob);
            if (hp != nullptr) store_stream(hp + c, o[i0 + k]);
            if constexpr (kFp8 == quant::kFp8Rowwise) amax = fmaxf(amax, quant::pack_amax<T, kVec>(o[i0 + k]));
          }
        }
      }
      if constexpr (kFp8 == quant::kFp8Rowwise) {
        const quant::Scale sc = quant::make_scale<F>(quant::block_max(amax, scratch), false);
        if (rank == 0) out.scale[0] = sc.inv;
#pragma unroll
        for (int i = 0; i < kFp8CacheIters; ++i) {
          const int c = rank + i * size;
          if (c < nvec) quant::store_fp8<F, T, kVec>(out.q + static_cast<int64_t>(c) * kVec, o[i], sc.mult);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kFp8CacheIters; ++i) {
          if (i * size >= nvec) break;  // uniform over the block
          const int c = rank + i * size;
          quant::quantize_block128<F, T, kVec>(out, o[i], c, c < nvec);
        }
      }
    } else if constexpr (kFp8 == quant::kFp8Rowwise) {
      float amax = 0.f;
#pragma unroll 2
      for (int c = rank; c < nvec; c += size) {
        const TP o = gated_value<T, kAct, kVec>(load_stream(gate + c), load_stream(up + c), prob);
        if (hp != nullptr) store_stream(hp + c, o);
        amax = fmaxf(amax, quant::pack_amax<T, kVec>(o));
      }
      const quant::Scale sc = quant::make_scale<F>(quant::block_max(amax, scratch), false);
      if (rank == 0) out.scale[0] = sc.inv;
#pragma unroll 2
      for (int c = rank; c < nvec; c += size) {
        quant::store_fp8<F, T, kVec>(out.q + static_cast<int64_t>(c) * kVec,
                                     gated_value<T, kAct, kVec>(load_stream(gate + c), load_stream(up + c), prob),
                                     sc.mult);
      }
    } else {
      for (int base = 0; base < nvec; base += size) {  // uniform trip count: every lane joins the shuffles
        const int c = base + rank;
        TP o{};
        if (c < nvec) {
          o = gated_value<T, kAct, kVec>(load_stream(gate + c), load_stream(up + c), prob);
          if (hp != nullptr) store_stream(hp + c, o);
        }
        quant::quantize_block128<F, T, kVec>(out, o, c, c < nvec);
      }
    }
  }
}

// T: x / out / dy / dx element type. kAct: kSilu or kGelu. kVectorized: 16-byte accesses (the host
// checked that cols and every row pointer allow them). kFp8: quant::kFp8None, or an FP8 forward
// module (out quantized to F with a rowwise or 1x128 scale; needs 16-byte accesses; its backward
// is the plain module's).
template <class T, int kAct, bool kVectorized, int kFp8 = quant::kFp8None, class F = quant::E4M3>
struct GatedAct {
  static constexpr int kVec = kVectorized ? static_cast<int>(16 / sizeof(T)) : 1;
  static_assert(kFp8 == quant::kFp8None || (kVectorized && quant::kBlockLanes<kVec> <= 32),
                "FP8 gated modules need 16-byte accesses");

  static bool check(const PtGatedActParams* p, char* err, size_t err_len) {
    if (p->cols < 1 || p->cols > INT32_MAX || p->cols % kVec != 0) {
      snprintf(err, err_len, "gated activation module (vector width %d) cannot take cols %lld", kVec,
               static_cast<long long>(p->cols));
      return false;
    }
    return true;
  }

  static unsigned grid(const PtGatedActParams* p) {
    const int64_t sms = p->num_sms > 0 ? p->num_sms : 132;
    // Enough resident warps to cover HBM latency; more blocks than that only add scheduling.
    return static_cast<unsigned>(std::min<int64_t>(ceil_div(p->rows, kWarpsPerBlock), sms * 8));
  }

  static int forward(const PtGatedActParams* p, char* err, size_t err_len) {
    if (!check(p, err, err_len)) return 1;
    if (p->rows <= 0) return 0;
    if constexpr (kFp8 != quant::kFp8None) {
      if (p->q == nullptr || p->q_scale_inv == nullptr) {
        snprintf(err, err_len, "FP8 gated activation module: q and q_scale_inv are required");
        return 1;
      }
      const int nvec = static_cast<int>(p->cols / kVec);
      const int threads = std::clamp(ceil_div(ceil_div(nvec, kFp8VecsPerThread), 32) * 32, 32, kFp8MaxThreads);
      const int64_t sms = p->num_sms > 0 ? p->num_sms : 132;
      const int64_t grid = std::min<int64_t>(p->rows, sms * std::min(32, 2048 / threads));
      gated_fwd_fp8<T, kAct, kVec, kFp8, F>
          <<<static_cast<unsigned>(grid), threads, 0, static_cast<cudaStream_t>(p->stream)>>>(*p);
      return report_launch("gated activation FP8 forward", err, err_len);
    }
    gated_fwd<T, kAct, kVec><<<grid(p), kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch("gated activation forward", err, err_len);
  }

  static int backward(const PtGatedActParams* p, char* err, size_t err_len) {
    if (!check(p, err, err_len)) return 1;
    if (p->rows <= 0) return 0;
    gated_bwd<T, kAct, kVec><<<grid(p), kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch("gated activation backward", err, err_len);
  }
};

}  // namespace primus_turbo::kernels::gated
