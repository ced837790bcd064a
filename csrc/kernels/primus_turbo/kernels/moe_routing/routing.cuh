// MoE routing kernels: group-limited top-k routing with the aux-loss scores (forward and backward),
// indices <-> multihot conversion, and the token mask of a tokens-per-expert count.
//
// Routing takes one token per warp. Lane l holds experts l, l + 32, ... (kVpt of them, kVpt * 32 >=
// experts) in registers, so loads and stores of a row are coalesced. All math is in fp32:
//   s = sigmoid(x) or softmax(x) over the experts;
//   groups > 1: the experts split into `groups` contiguous groups; a group's score is the sum of
//   its top (topk / selected_groups) values of s; the best `selected_groups` groups stay eligible
//   (the warp's copy of s sits in shared memory, one lane scores one group);
//   top-k: topk rounds of a warp argmax over the eligible experts.
// Order and ties: larger s first; equal s -> the lower expert index (the lower group index for
// group scores), so the choice is deterministic. Scores are >= 0, so (value, index) packs into one
// 64-bit key (float bits above the inverted index) whose integer order is the ranking order: a
// scan or a warp reduction is one max. NaN logits give an unspecified choice.
// Outputs: sigmoid: probs = s_i / (sum of the chosen s + 1e-20) * scaling when topk > 1 (s_i *
// scaling for topk == 1); scores = s / (sum of all s + 1e-20) when topk > 1 (s for topk == 1).
// softmax: probs = s_i * scaling, scores = s.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/common/convert.cuh"
#include "primus_turbo/kernels/common/warp.cuh"
#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/moe_routing/routing_abi.h"

namespace primus_turbo::kernels::moe_routing {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxVpt = 32;  // experts <= 1024
constexpr int kMaxGroups = 64;
constexpr float kEps = 1e-20f;

// Ranking key of a non-negative score v (every score and group score is >= 0) at index i: the
// float's bits above ~i, so that a larger key means a larger value, then a lower index. 0 is below
// every valid key (~i != 0), so it stands for "none".
__device__ __forceinline__ uint64_t rank_key(float v, int i) {
  return (static_cast<uint64_t>(__float_as_uint(v)) << 32) | static_cast<uint32_t>(~i);
}
__device__ __forceinline__ float key_value(uint64_t k) { return __uint_as_float(static_cast<uint32_t>(k >> 32)); }
__device__ __forceinline__ int key_index(uint64_t k) { return static_cast<int>(~static_cast<uint32_t>(k)); }

__device__ __forceinline__ uint64_t warp_max_key(uint64_t k) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(k), o);
    k = other > k ? other : k;
  }
  return k;
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// Softmax of a warp's row held in registers (lane l holds experts l, l + 32, ...; E experts), in
// place; entries past the row become 0.
template <int kVpt>
__device__ __forceinline__ void warp_softmax(float (&s)[kVpt], int lane, int E) {
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kVpt; ++i) m = fmaxf(m, s[i]);
  m = warp_max(m);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kVpt; ++i) {
    s[i] = lane + 32 * i < E ? expf(s[i] - m) : 0.f;
    sum += s[i];
  }
  const float inv = 1.0f / warp_sum(sum);
#pragma unroll
  for (int i = 0; i < kVpt; ++i) s[i] *= inv;
}

// ---- forward -----------------------------------------------------------------------------------

template <class T, int kVpt>
__global__ void __launch_bounds__(kThreads) routing_fwd_kernel(PtRoutingFwdParams p) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (token >= p.tokens) return;  // whole warps leave together
  const int E = p.experts;
  const int64_t base = token * E;
  const T* x = static_cast<const T*>(p.logits) + base;

  float s[kVpt];
#pragma unroll
  for (int i = 0; i < kVpt; ++i) {
    const int e = lane + 32 * i;
    s[i] = e < E ? to_float(x[e]) : -INFINITY;
  }
  if (p.softmax) {
    warp_softmax(s, lane, E);
  } else {
#pragma unroll
    for (int i = 0; i < kVpt; ++i) s[i] = lane + 32 * i < E ? sigmoidf(s[i]) : 0.f;
  }

  // Eligible experts: bit i of `elig` for expert lane + 32 i.
  uint32_t elig = 0;
#pragma unroll
  for (int i = 0; i < kVpt; ++i)
    if (lane + 32 * i < E) elig |= 1u << i;

  if (p.groups > 1 && p.selected_groups < p.groups) {  // all groups selected: no limit
    const int G = p.groups, epg = E / G, per_group = p.topk / p.selected_groups;
    const int stride = epg + 1;  // one float of padding per group spreads the groups' lanes over the banks
    float* buf = smem + warp * (G * stride + kMaxGroups);
    float* gscore = buf + G * stride;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      const int e = lane + 32 * i;
      if (e < E) buf[(e / epg) * stride + e % epg] = s[i];
    }
    __syncwarp();
    // A group's score: L lanes per group (L a power of two, G * L <= 32; more groups than
    // lanes take several passes with L = 1) each scan a strided share of the group for the
    // best key below the previous pick, then max over the group's L lanes (aligned xor segments).
    // Every lane runs the same loops, so the shuffles are warp-uniform.
    int L = 1;
    while (L * 2 * G <= 32) L *= 2;
    for (int first = 0; first < G * L; first += 32) {
      const int slot = first + lane, g = slot / L, sub = slot % L;
      const bool active = g < G;
      const float* v = buf + (active ? g : 0) * stride;
      uint64_t prev = ~0ull;  // the previous pick; the next one ranks right below it
      float total = 0.f;
      for (int r = 0; r < per_group; ++r) {
        uint64_t best = 0;
        if (active) {
          for (int j = sub; j < epg; j += L) {
            const uint64_t k = rank_key(v[j], j);
            if (k < prev && k > best) best = k;
          }
        }
        for (int o = 1; o < L; o <<= 1) {
          const uint64_t other = __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(best), o);
          best = other > best ? other : best;
        }
        if (best != 0) total += key_value(best), prev = best;
      }
      if (active && sub == 0) gscore[g] = total;
    }
    __syncwarp();
    uint64_t chosen = 0;
    for (int r = 0; r < p.selected_groups; ++r) {
      uint64_t best = 0;
      for (int g = lane; g < G; g += 32) {
        const uint64_t k = ((chosen >> g) & 1ull) ? 0 : rank_key(gscore[g], g);
        best = k > best ? k : best;
      }
      best = warp_max_key(best);
      if (best == 0) break;
      chosen |= 1ull << key_index(best);
    }
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !((chosen >> (e / epg)) & 1ull)) elig &= ~(1u << i);
    }
  }

  uint32_t taken = 0;
  float chosen_sum = 0.f;
  for (int r = 0; r < p.topk; ++r) {
    const uint32_t avail = elig & ~taken;
    uint64_t best = 0;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      const uint64_t k = ((avail >> i) & 1u) ? rank_key(s[i], lane + 32 * i) : 0;
      best = k > best ? k : best;
    }
    best = warp_max_key(best);
    if (best == 0) break;
    const int e = key_index(best);
    if ((e & 31) == lane) taken |= 1u << (e >> 5);
    chosen_sum += key_value(best);
  }

  const bool sigmoid = !p.softmax;
  const bool normalize = sigmoid && p.topk > 1;
  float score_scale = 1.f;
  if (normalize) {
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) total += s[i];  // padding holds 0
    score_scale = 1.0f / (warp_sum(total) + kEps);
  }
  const float prob_scale = normalize ? p.scaling / (chosen_sum + kEps) : p.scaling;
  T* scores = static_cast<T*>(p.scores) + base;
  T* probs = static_cast<T*>(p.probs) + base;
  uint8_t* map = p.routing_map + base;
#pragma unroll
  for (int i = 0; i < kVpt; ++i) {
    const int e = lane + 32 * i;
    if (e < E) {
      const bool on = (taken >> i) & 1u;
      scores[e] = from_float<T>(normalize ? s[i] * score_scale : s[i]);
      probs[e] = from_float<T>(on ? s[i] * prob_scale : 0.f);
      map[e] = on ? 1 : 0;
    }
  }
}

// ---- backward ----------------------------------------------------------------------------------
// sigmoid, topk > 1: probs_j = c s_j / D (D = sum of the chosen s + eps), so for a chosen j
//   dL/ds_j = c (gp_j - sum_i gp_i s_i / D) / D; scores_j = s_j / T (T = sum of all s + eps):
//   dL/ds_j += (gs_j - sum_i gs_i s_i / T) / T; dL/dx_j = dL/ds_j s_j (1 - s_j).
// sigmoid, topk == 1: dL/ds_j = c gp_j [chosen] + gs_j.
// softmax: with u_j = c gp_j [chosen] + gs_j, dL/dx_j = s_j (u_j - sum_i u_i s_i).

template <class T, int kVpt>
__global__ void __launch_bounds__(kThreads) routing_bwd_kernel(PtRoutingBwdParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (token >= p.tokens) return;
  const int E = p.experts;
  const int64_t base = token * E;
  const T* x = static_cast<const T*>(p.logits) + base;
  const T* gp = p.grad_probs ? static_cast<const T*>(p.grad_probs) + base : nullptr;
  const T* gs = p.grad_scores ? static_cast<const T*>(p.grad_scores) + base : nullptr;
  const uint8_t* map = p.routing_map + base;

  float s[kVpt], a[kVpt], b[kVpt];  // scores; scaled grad of probs (chosen only); grad of scores
  bool on[kVpt];
#pragma unroll
  for (int i = 0; i < kVpt; ++i) {
    const int e = lane + 32 * i;
    const bool in = e < E;
    s[i] = in ? to_float(x[e]) : -INFINITY;
    on[i] = in && map[e] != 0;
    a[i] = (gp && on[i]) ? p.scaling * to_float(gp[e]) : 0.f;
    b[i] = (gs && in) ? to_float(gs[e]) : 0.f;
  }
  T* dx = static_cast<T*>(p.grad_logits) + base;
  if (p.softmax) {
    warp_softmax(s, lane, E);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) dot += (a[i] + b[i]) * s[i];
    dot = warp_sum(dot);
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      const int e = lane + 32 * i;
      if (e < E) dx[e] = from_float<T>(s[i] * (a[i] + b[i] - dot));
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kVpt; ++i) s[i] = lane + 32 * i < E ? sigmoidf(s[i]) : 0.f;
  float ds[kVpt];
  if (p.topk > 1) {
    float chosen = 0.f, total = 0.f, ga = 0.f, gb = 0.f;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      chosen += on[i] ? s[i] : 0.f;
      total += s[i];
      ga += a[i] * s[i];
      gb += b[i] * s[i];
    }
    const float D = warp_sum(chosen) + kEps, Tt = warp_sum(total) + kEps;
    ga = warp_sum(ga) / D;
    gb = warp_sum(gb) / Tt;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) ds[i] = (on[i] ? (a[i] - ga) / D : 0.f) + (b[i] - gb) / Tt;
  } else {
#pragma unroll
    for (int i = 0; i < kVpt; ++i) ds[i] = a[i] + b[i];
  }
#pragma unroll
  for (int i = 0; i < kVpt; ++i) {
    const int e = lane + 32 * i;
    if (e < E) dx[e] = from_float<T>(ds[i] * s[i] * (1.f - s[i]));
  }
}

inline unsigned routing_grid(int64_t tokens) { return static_cast<unsigned>((tokens + kWarps - 1) / kWarps); }

template <class T>
struct Routing {
  template <int kVpt>
  static int forward_vpt(const PtRoutingFwdParams* p, char* err, size_t err_len) {
    size_t smem = 0;
    if (p->groups > 1 && p->selected_groups < p->groups) {
      smem = sizeof(float) * kWarps * (p->groups * (p->experts / p->groups + 1) + kMaxGroups);
      if (smem > 48 * 1024) {
        cudaFuncSetAttribute(routing_fwd_kernel<T, kVpt>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
      }
    }
    routing_fwd_kernel<T, kVpt>
        <<<routing_grid(p->tokens), kThreads, smem, static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch("MoE routing forward", err, err_len);
  }
  template <int kVpt>
  static int backward_vpt(const PtRoutingBwdParams* p, char* err, size_t err_len) {
    routing_bwd_kernel<T, kVpt>
        <<<routing_grid(p->tokens), kThreads, 0, static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch("MoE routing backward", err, err_len);
  }

  static int forward(const PtRoutingFwdParams* p, char* err, size_t err_len) {
    if (p->tokens <= 0 || p->experts <= 0) return 0;
    if (p->experts > 32 * kMaxVpt || p->topk < 1 || p->topk > p->experts || p->groups < 1 ||
        p->groups > kMaxGroups || p->experts % p->groups || p->selected_groups < 1 ||
        p->selected_groups > p->groups || p->topk / p->selected_groups < 1 ||
        routing_grid(p->tokens) > INT32_MAX) {
      snprintf(err, err_len, "MoE routing module cannot take %d experts, topk %d, %d groups, %d selected", p->experts,
               p->topk, p->groups, p->selected_groups);
      return 1;
    }
    const int v = (p->experts + 31) / 32;
    if (v <= 1) return forward_vpt<1>(p, err, err_len);
    if (v <= 2) return forward_vpt<2>(p, err, err_len);
    if (v <= 4) return forward_vpt<4>(p, err, err_len);
    if (v <= 8) return forward_vpt<8>(p, err, err_len);
    if (v <= 16) return forward_vpt<16>(p, err, err_len);
    return forward_vpt<32>(p, err, err_len);
  }

  static int backward(const PtRoutingBwdParams* p, char* err, size_t err_len) {
    if (p->tokens <= 0 || p->experts <= 0) return 0;
    if (p->experts > 32 * kMaxVpt || routing_grid(p->tokens) > INT32_MAX) {
      snprintf(err, err_len, "MoE routing module cannot take %d experts", p->experts);
      return 1;
    }
    const int v = (p->experts + 31) / 32;
    if (v <= 1) return backward_vpt<1>(p, err, err_len);
    if (v <= 2) return backward_vpt<2>(p, err, err_len);
    if (v <= 4) return backward_vpt<4>(p, err, err_len);
    if (v <= 8) return backward_vpt<8>(p, err, err_len);
    if (v <= 16) return backward_vpt<16>(p, err, err_len);
    return backward_vpt<32>(p, err, err_len);
  }
};

// ---- indices <-> multihot ----------------------------------------------------------------------

__device__ __forceinline__ int64_t load_index(const void* p, int dtype, int64_t i) {
  return dtype == 8 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}
// pt_dtype codes: 0 float32, 1 float16, 2 bfloat16.
__device__ __forceinline__ float load_value(const void* p, int dtype, int64_t i) {
  if (dtype == 1) return __half2float(static_cast<const __half*>(p)[i]);
  if (dtype == 2) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_value(void* p, int dtype, int64_t i, float v) {
  if (dtype == 1) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else if (dtype == 2) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<float*>(p)[i] = v;
}

// One warp per token; every output element is written exactly once.
__global__ void __launch_bounds__(kThreads) multihot_fwd_kernel(PtMultihotParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (token >= p.tokens) return;
  const int64_t in_base = token * p.topk, out_base = token * p.experts;
  for (int e = lane; e < p.experts; e += 32) {
    int pos = -1;
    for (int k = 0; k < p.topk; ++k)
      if (load_index(p.indices, p.indices_dtype, in_base + k) == e) pos = k;
    p.multihot[out_base + e] = pos >= 0 ? 1 : 0;
    store_value(p.probs_out, p.probs_out_dtype, out_base + e,
                pos >= 0 ? load_value(p.probs, p.probs_dtype, in_base + pos) : 0.f);
  }
}

// One thread per (token, k).
__global__ void __launch_bounds__(kThreads) multihot_bwd_kernel(PtMultihotParams p) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (n >= p.tokens * p.topk) return;
  const int64_t token = n / p.topk;
  const int k = static_cast<int>(n - token * p.topk);
  const int64_t in_base = token * p.topk;
  const int64_t idx = load_index(p.indices, p.indices_dtype, n);
  bool live = idx >= 0 && idx < p.experts;
  for (int j = k + 1; live && j < p.topk; ++j) live = load_index(p.indices, p.indices_dtype, in_base + j) != idx;
  store_value(p.grad_probs, p.probs_dtype, n,
              live ? load_value(p.grad_multihot, p.probs_out_dtype, token * p.experts + idx) : 0.f);
}

__global__ void __launch_bounds__(kThreads) tokens_mask_kernel(PtTokensMaskParams p) {
  __shared__ long long total;
  if (threadIdx.x < 32) {
    long long sum = 0;
    for (int64_t e = threadIdx.x; e < p.experts; e += 32) sum += load_index(p.tokens_per_expert, p.counts_dtype, e);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x == 0) total = sum;
  }
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < p.num_tokens) p.mask[i] = i < total ? 1 : 0;
}

struct RoutingUtils {
  static int multihot_forward(const PtMultihotParams* p, char* err, size_t err_len) {
    if (p->tokens <= 0 || p->experts <= 0) return 0;
    multihot_fwd_kernel<<<routing_grid(p->tokens), kThreads, 0, static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch("indices_to_multihot forward", err, err_len);
  }
  static int multihot_backward(const PtMultihotParams* p, char* err, size_t err_len) {
    const int64_t n = p->tokens * p->topk;
    if (n <= 0) return 0;
    multihot_bwd_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                          static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch("indices_to_multihot backward", err, err_len);
  }
  static int tokens_mask(const PtTokensMaskParams* p, char* err, size_t err_len) {
    if (p->num_tokens <= 0) return 0;
    tokens_mask_kernel<<<static_cast<unsigned>((p->num_tokens + kThreads - 1) / kThreads), kThreads, 0,
                         static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch("tokens_per_expert_to_mask", err, err_len);
  }
};

}  // namespace primus_turbo::kernels::moe_routing

// Exports Kernel::forward / Kernel::backward as pt_routing_fwd_run / pt_routing_bwd_run.
#define PT_JIT_EXPORT_MOE_ROUTING(Kernel)                                                                  \
  PT_JIT_EXPORT_ABI_VERSION                                                                                \
  extern "C" __attribute__((visibility("default"))) int pt_routing_fwd_run(const PtRoutingFwdParams* params, \
                                                                           char* err, size_t err_len) {    \
    return Kernel::forward(params, err, err_len);                                                          \
  }                                                                                                        \
  extern "C" __attribute__((visibility("default"))) int pt_routing_bwd_run(const PtRoutingBwdParams* params, \
                                                                           char* err, size_t err_len) {    \
    return Kernel::backward(params, err, err_len);                                                         \
  }

// Exports the dtype-generic helpers of RoutingUtils.
#define PT_JIT_EXPORT_MOE_ROUTING_UTILS                                                                      \
  PT_JIT_EXPORT_ABI_VERSION                                                                                  \
  extern "C" __attribute__((visibility("default"))) int pt_multihot_fwd_run(const PtMultihotParams* params,  \
                                                                            char* err, size_t err_len) {     \
    return primus_turbo::kernels::moe_routing::RoutingUtils::multihot_forward(params, err, err_len);         \
  }                                                                                                          \
  extern "C" __attribute__((visibility("default"))) int pt_multihot_bwd_run(const PtMultihotParams* params,  \
                                                                            char* err, size_t err_len) {     \
    return primus_turbo::kernels::moe_routing::RoutingUtils::multihot_backward(params, err, err_len);        \
  }                                                                                                          \
  extern "C" __attribute__((visibility("default"))) int pt_tokens_mask_run(const PtTokensMaskParams* params, \
                                                                           char* err, size_t err_len) {      \
    return primus_turbo::kernels::moe_routing::RoutingUtils::tokens_mask(params, err, err_len);              \
  }
