// Rows of grouped tokens (mixture-of-experts) moved between the tight layout and a padded one in
// which every group starts at a multiple of an alignment (kernels/layout/group_rows_abi.h): the
// padding that block quantization along the tokens needs, and its inverse. One launch, no host
// synchronization (the group sizes stay on the device), every output row written (copied or zeroed).
//
// Each CTA first builds the group tables from the index tensors in shared memory (a few scans over
// at most kMaxGroups entries), then its warps take output rows: a binary search finds a row's
// group, and the warp copies the row in 16-, 4- or 1-byte words.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/layout/group_rows_abi.h"

namespace primus_turbo::kernels::layout {

constexpr int kGroupRowsThreads = 256;
constexpr int kMaxGroups = PT_GROUP_ROWS_MAX_GROUPS;
constexpr int kItems = kMaxGroups / kGroupRowsThreads;  // table entries a thread scans

__device__ __forceinline__ int64_t load_index(const void* p, int bytes, int64_t i) {
  return bytes == 8 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

__device__ __forceinline__ int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// In place: a[i] <- a[0] + ... + a[i - 1] over n <= kMaxGroups entries; returns the total. Each
// thread sums its kItems consecutive entries, the thread totals are scanned in shared memory.
__device__ int64_t exclusive_scan(int64_t* a, int n, int64_t* totals) {
  const int t = threadIdx.x, first = t * kItems;
  int64_t local = 0;
  for (int i = 0; i < kItems; ++i)
    if (first + i < n) local += a[first + i];
  totals[t] = local;
  __syncthreads();
  for (int step = 1; step < kGroupRowsThreads; step *= 2) {
    const int64_t add = t >= step ? totals[t - step] : 0;
    __syncthreads();
    totals[t] += add;
    __syncthreads();
  }
  int64_t run = totals[t] - local;
  for (int i = 0; i < kItems; ++i) {
    if (first + i < n) {
      const int64_t v = a[first + i];
      a[first + i] = run;
      run += v;
    }
  }
  const int64_t total = totals[kGroupRowsThreads - 1];
  __syncthreads();
  return total;
}

template <int kBytes>
struct alignas(kBytes) RowWord {
  uint8_t b[kBytes];
};

// Shared tables: group g's y rows [y_start[g], y_start[g] + count[g]) are x rows from x_start[g].
struct GroupTables {
  int64_t y_start[kMaxGroups], x_start[kMaxGroups], count[kMaxGroups], scratch[kMaxGroups];
  int64_t totals[kGroupRowsThreads];
};

__device__ void build_tables(const PtGroupRowsParams& p, GroupTables& s) {
  const int G = p.groups;
  if (p.mode == PT_GROUP_ROWS_PAD) {
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
      const int64_t len = max(load_index(p.lens, p.lens_bytes, g), int64_t(0));
      s.count[g] = len;
      s.x_start[g] = p.offs ? load_index(p.offs, p.offs_bytes, g) : len;
    }
    __syncthreads();
    if (!p.offs) exclusive_scan(s.x_start, G, s.totals);  // back to back
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
      const int64_t start = min(max(s.x_start[g], int64_t(0)), p.x_rows);
      const int64_t len = s.count[g];
      s.x_start[g] = start;
      s.count[g] = min(len, p.x_rows - start);
      s.y_start[g] = round_up(s.count[g], p.align);
      s.scratch[g] = round_up(len, p.align);  // the padded lens reported (of max(lens, 0), unclamped)
    }
    __syncthreads();
    exclusive_scan(s.y_start, G, s.totals);
    if (blockIdx.x == 0 && p.lens_out) {
      for (int g = threadIdx.x; g < G; g += blockDim.x) p.lens_out[g] = s.scratch[g];
    }
    __syncthreads();
    const int64_t total = exclusive_scan(s.scratch, G, s.totals);
    if (blockIdx.x == 0 && p.offs_out) {
      for (int g = threadIdx.x; g < G; g += blockDim.x) p.offs_out[g] = s.scratch[g];
      if (threadIdx.x == 0) p.offs_out[G] = total;
    }
  } else {
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
      const int64_t start = load_index(p.offs, p.offs_bytes, g);
      const int64_t end = p.lens ? start + max(load_index(p.lens, p.lens_bytes, g), int64_t(0))
                                 : load_index(p.offs, p.offs_bytes, g + 1);
      s.y_start[g] = start;
      s.count[g] = max(end - start, int64_t(0));
      s.x_start[g] = load_index(p.offs_padded, p.offs_padded_bytes, g);
    }
  }
  __syncthreads();
}

// The group whose y range starts last at or before row r (-1: none), as searchsorted(right) - 1.
__device__ __forceinline__ int group_of(const GroupTables& s, int groups, int64_t r) {
  int lo = 0, hi = groups;  // first g with y_start[g] > r lies in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (s.y_start[mid] <= r) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

template <int kBytes>
__global__ void __launch_bounds__(kGroupRowsThreads) group_rows_kernel(PtGroupRowsParams p) {
  __shared__ GroupTables s;
  build_tables(p, s);
  using W = RowWord<kBytes>;
  const int64_t words = p.row_bytes / kBytes;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (kGroupRowsThreads / 32);
  for (int64_t r = int64_t(blockIdx.x) * (kGroupRowsThreads / 32) + threadIdx.x / 32; r < p.y_rows; r += warps) {
    const int g = group_of(s, p.groups, r);
    int64_t src = -1;
    if (g >= 0 && r - s.y_start[g] < s.count[g]) {
      src = s.x_start[g] + (r - s.y_start[g]);
      if (src < 0 || src >= p.x_rows) src = -1;  // offsets that point outside x: zeros, never a stray read
    }
    W* dst = reinterpret_cast<W*>(static_cast<uint8_t*>(p.y) + r * p.row_bytes);
    if (src < 0) {
      const W zero{};
      for (int64_t i = lane; i < words; i += 32) dst[i] = zero;
    } else {
      const W* from = reinterpret_cast<const W*>(static_cast<const uint8_t*>(p.x) + src * p.row_bytes);
      for (int64_t i = lane; i < words; i += 32) dst[i] = from[i];
    }
  }
}

struct GroupRows {
  static int run(const PtGroupRowsParams* p, char* err, size_t err_len) {
    if (p->groups < 1 || p->groups > kMaxGroups) {
      std::snprintf(err, err_len, "group rows: %d groups; 1 to %d supported", p->groups, kMaxGroups);
      return 1;
    }
    // Nothing to copy, but the padded lens / offsets are still reported: one CTA.
    const int64_t ctas = (p->y_rows + 7) / 8;  // 8 warps a CTA, a row a warp
    const int64_t blocks = p->y_rows == 0 ? 1 : (ctas < 2048 ? ctas : 2048);
    auto stream = static_cast<cudaStream_t>(p->stream);
    const auto aligned = [&](int a) {
      return p->row_bytes % a == 0 && reinterpret_cast<uintptr_t>(p->x) % a == 0 &&
             reinterpret_cast<uintptr_t>(p->y) % a == 0;
    };
    const dim3 grid(static_cast<unsigned>(blocks));
    if (aligned(16)) {
      group_rows_kernel<16><<<grid, kGroupRowsThreads, 0, stream>>>(*p);
    } else if (aligned(4)) {
      group_rows_kernel<4><<<grid, kGroupRowsThreads, 0, stream>>>(*p);
    } else {
      group_rows_kernel<1><<<grid, kGroupRowsThreads, 0, stream>>>(*p);
    }
    const cudaError_t launch = cudaGetLastError();
    if (launch != cudaSuccess) {
      std::snprintf(err, err_len, "group rows launch failed: %s", cudaGetErrorString(launch));
      return 1;
    }
    return 0;
  }
};

}  // namespace primus_turbo::kernels::layout
