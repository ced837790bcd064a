// What the grouped GEMM kernels (cutlass_grouped_gemm_sm90.cuh, cutlass_grouped_gemm_fp8_sm90.cuh)
// share around their CUTLASS pointer-array mainloops:
//   - the device-side group split: a one-block scan of group_lens (or group_offs) that clamps
//     every group into the packed extent (group_span);
//   - the per-group argument arrays the setup kernels write into the workspace (GroupArrays);
//   - zeroing the output of groups with an empty reduction (zero_empty_groups) and the forward
//     rows no group covers (zero_uncovered_rows);
//   - the host side of a call: workspace size and check, the setup launch, CUTLASS's
//     can_implement / initialize / run and their error messages (GroupedRunner).
#pragma once

#include <algorithm>
#include <cstdio>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/gemm.h"
#include "cutlass/kernel_hardware_info.h"
#include "primus_turbo/kernels/common/cute_stride.cuh"
#include "primus_turbo/kernels/gemm/cutlass_launch.cuh"

namespace primus_turbo::kernels::grouped {

constexpr int kSetupThreads = 256;
using GroupScan = cub::BlockScan<int64_t, kSetupThreads>;

struct GroupSpan {
  int64_t start;
  int64_t len;
};

__device__ inline int64_t clamp_rows(int64_t x, int64_t rows) { return x < 0 ? 0 : (x > rows ? rows : x); }

// A group's rows from its unclamped start and length: the start clamped into [0, rows], the length
// (negative -> 0) cut where the packed extent ends.
__device__ inline GroupSpan clamped_span(int64_t start, int64_t raw_len, int64_t rows) {
  start = clamp_rows(start, rows);
  const int64_t len = raw_len > 0 ? raw_len : 0;
  return {start, len < rows - start ? len : rows - start};
}

// The rows [start, start + len) of group g = base + threadIdx.x in one chunk of kSetupThreads
// groups. Starts come from group_offs when given, else from an exclusive prefix sum of the
// (negative -> 0) lengths; every group is clamped into [0, rows) so that lengths that do not add
// up to the packed extent can never address memory outside the operands. A thread past the last
// group gets {0, 0}. Every thread of the block calls it once per chunk, in order (a block scan and
// a barrier inside, after which storage may be reused); carry is the length total of the earlier
// chunks and is advanced past this one.
__device__ inline GroupSpan group_span(GroupScan::TempStorage& storage,
                                       const int64_t* __restrict__ group_lens,
                                       const int64_t* __restrict__ group_offs,
                                       int64_t num_groups, int64_t rows, int64_t g,
                                       int64_t& carry) {
  const int64_t raw = g < num_groups ? group_lens[g] : 0;
  const int64_t len_in = raw > 0 ? raw : 0;
  int64_t prefix, total;
  GroupScan(storage).ExclusiveSum(len_in, prefix, total);
  __syncthreads();  // storage is reused by the next scan
  const GroupSpan span = g < num_groups ? clamped_span(group_offs ? group_offs[g] : carry + prefix, raw, rows)
                                         : GroupSpan{0, 0};
  carry += total;
  return span;
}

// Where the setup kernel writes the per-group arguments (all arrays of num_groups entries), carved
// from the start of the workspace in 256-byte aligned pieces.
template <class Shape, class ElementA, class ElementB, class ElementD, class StrideA,
          class StrideB, class StrideD>
struct GroupArrays {
  Shape* shapes;
  const ElementA** ptr_a;
  const ElementB** ptr_b;
  ElementD** ptr_d;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;

  static size_t align(size_t x) { return (x + 255) & ~size_t(255); }
  static size_t bytes(int64_t g) {
    return align(g * sizeof(Shape)) + 3 * align(g * sizeof(void*)) + align(g * sizeof(StrideA)) +
           align(g * sizeof(StrideB)) + align(g * sizeof(StrideD));
  }
  static GroupArrays carve(void* base, int64_t g) {
    auto* p = static_cast<char*>(base);
    auto take = [&](size_t n) {
      char* r = p;
      p += align(n);
      return r;
    };
    GroupArrays r;
    r.shapes = reinterpret_cast<Shape*>(take(g * sizeof(Shape)));
    r.ptr_a = reinterpret_cast<const ElementA**>(take(g * sizeof(void*)));
    r.ptr_b = reinterpret_cast<const ElementB**>(take(g * sizeof(void*)));
    r.ptr_d = reinterpret_cast<ElementD**>(take(g * sizeof(void*)));
    r.stride_a = reinterpret_cast<StrideA*>(take(g * sizeof(StrideA)));
    r.stride_b = reinterpret_cast<StrideB*>(take(g * sizeof(StrideB)));
    r.stride_d = reinterpret_cast<StrideD*>(take(g * sizeof(StrideD)));
    return r;
  }
};

// GroupArrays plus one A and one B scale pointer per group (block-scaled FP8), carved after them.
template <class Shape, class ElementA, class ElementB, class ElementD, class StrideA,
          class StrideB, class StrideD>
struct ScaledGroupArrays
    : GroupArrays<Shape, ElementA, ElementB, ElementD, StrideA, StrideB, StrideD> {
  using Base = GroupArrays<Shape, ElementA, ElementB, ElementD, StrideA, StrideB, StrideD>;
  const float** ptr_sfa;
  const float** ptr_sfb;

  static size_t bytes(int64_t g) { return Base::bytes(g) + 2 * Base::align(g * sizeof(void*)); }
  static ScaledGroupArrays carve(void* base, int64_t g) {
    ScaledGroupArrays r;
    static_cast<Base&>(r) = Base::carve(base, g);
    char* p = static_cast<char*>(base) + Base::bytes(g);
    r.ptr_sfa = reinterpret_cast<const float**>(p);
    r.ptr_sfb = reinterpret_cast<const float**>(p + Base::align(g * sizeof(void*)));
    return r;
  }
};

// d[g] = 0 for every group whose reduction is empty (a K = 0 tile would leave garbage
// accumulators), in 16-byte stores (a group is m * n elements with n a multiple of 16 bytes).
// Grid (chunks, groups); a block of a non-empty group returns at once.
template <class Shape>
__global__ void zero_empty_groups(const Shape* __restrict__ shapes, uint4* d, int64_t group_vecs) {
  const int64_t g = blockIdx.y;
  if (cute::get<2>(shapes[g]) != 0) return;
  uint4* dst = d + g * group_vecs;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < group_vecs;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = make_uint4(0, 0, 0, 0);
  }
}

// Launches zero_empty_groups over num_groups outputs of m * n ElementD each.
template <class ElementD, class Shape>
void launch_zero_empty_groups(const Shape* shapes, void* d, int64_t num_groups, int64_t m,
                              int64_t n, cudaStream_t stream) {
  const int64_t vecs = m * n * int64_t(sizeof(ElementD)) / 16;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(128, (vecs + 255) / 256));
  zero_empty_groups<<<dim3(unsigned(chunks), unsigned(num_groups)), 256, 0, stream>>>(
      shapes, static_cast<uint4*>(d), vecs);
}

// Zeroes the forward output's rows that no group covers: rows [end, rows) with end the largest
// group end (start + clamped length; with group_offs, gaps between groups are not zeroed). When the
// lengths add up to the packed extent (the common case) every block returns after one short
// reduction over the group sizes; lengths that fall short (dropped or padded tokens) leave zeros
// instead of stale memory. Grid-stride over 16-byte units when rows are 16-byte multiples.
struct MaxOp {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return a > b ? a : b; }
};

// x summed over the block (or, with largest, its maximum), returned to every thread. A kernel may
// call it more than once: each call's barrier orders the next call's use of the shared storage.
__device__ inline int64_t block_total(int64_t x, bool largest) {
  using Reduce = cub::BlockReduce<int64_t, kSetupThreads>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ int64_t total;
  __syncthreads();  // an earlier call's readers of `total` and `storage` are done
  const int64_t t = largest ? Reduce(storage).Reduce(x, MaxOp{}) : Reduce(storage).Sum(x);
  if (threadIdx.x == 0) total = t;
  __syncthreads();
  return total;
}

// The end of the rows the groups cover: the sum of the lengths clamped into [0, rows] (no
// offsets) or the largest clamped start + clamped length (offsets), then clamped to rows. Every
// thread of the block calls it and gets the result.
__device__ inline int64_t covered_rows(const int64_t* __restrict__ group_lens,
                                       const int64_t* __restrict__ group_offs, int64_t num_groups,
                                       int64_t rows) {
  int64_t local = 0;  // sum of lengths (no offsets) or the largest group end (offsets)
  for (int64_t g = threadIdx.x; g < num_groups; g += kSetupThreads) {
    // Each length clamped into [0, rows]: a sum of G of them cannot overflow.
    const int64_t len = clamp_rows(group_lens[g], rows);
    if (group_offs) {
      const int64_t end = clamp_rows(group_offs[g], rows) + len;
      local = end > local ? end : local;
    } else {
      local += len;
    }
  }
  return clamp_rows(block_total(local, group_offs != nullptr), rows);
}

// d's rows [end, rows) (n ElementD each) set to 0 by every thread of the grid, in 16-byte stores
// where the rows allow.
template <class ElementD>
__device__ inline void zero_rows_from(int64_t end, int64_t rows, int64_t n, ElementD* d) {
  if (end >= rows) return;
  const int64_t first = end * n, count = (rows - end) * n;  // elements to zero
  const int64_t blocks = int64_t(gridDim.x) * gridDim.y;
  const int64_t tid = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = blocks * blockDim.x;
  constexpr int64_t kPerVec = 16 / sizeof(ElementD);
  if ((n * int64_t(sizeof(ElementD))) % 16 == 0 && reinterpret_cast<uintptr_t>(d) % 16 == 0) {
    uint4* dst = reinterpret_cast<uint4*>(d + first);
    for (int64_t i = tid; i < count / kPerVec; i += stride) dst[i] = make_uint4(0, 0, 0, 0);
  } else {
    for (int64_t i = tid; i < count; i += stride) d[first + i] = ElementD(0);
  }
}

template <class ElementD>
__global__ void __launch_bounds__(kSetupThreads)
    zero_uncovered_rows(const int64_t* __restrict__ group_lens,
                        const int64_t* __restrict__ group_offs, int64_t num_groups, int64_t rows,
                        int64_t n, ElementD* d) {
  zero_rows_from(covered_rows(group_lens, group_offs, num_groups, rows), rows, n, d);
}

// Group g's clamped span as group_span gives it, found by one block on its own (a reduction over
// the groups before g): for kernels whose CTAs each serve one group, with no setup launch before.
// Every thread of the block calls it and gets the result.
__device__ inline GroupSpan own_group_span(const int64_t* __restrict__ group_lens,
                                           const int64_t* __restrict__ group_offs, int64_t rows,
                                           int64_t g) {
  if (group_offs) return clamped_span(group_offs[g], group_lens[g], rows);
  int64_t before = 0;  // the non-negative lengths of the groups before g, as group_span sums them
  for (int64_t j = threadIdx.x; j < g; j += kSetupThreads) before += group_lens[j] > 0 ? group_lens[j] : 0;
  return clamped_span(block_total(before, false), group_lens[g], rows);
}

template <class ElementD>
void launch_zero_uncovered_rows(const int64_t* group_lens, const int64_t* group_offs,
                                int64_t num_groups, int64_t rows, int64_t n, void* d,
                                cudaStream_t stream) {
  const int64_t vecs = rows * n * int64_t(sizeof(ElementD)) / 16;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(264, (vecs + kSetupThreads - 1) / kSetupThreads));
  zero_uncovered_rows<ElementD><<<unsigned(blocks), kSetupThreads, 0, stream>>>(
      group_lens, group_offs, num_groups, rows, n, static_cast<ElementD*>(d));
}

// The GEMM arguments of a grouped call whose sizes stay on the device: D = acc (no source).
template <class Gemm, class Params, class Arrays>
typename Gemm::Arguments grouped_arguments(
    const Params& p, const Arrays& arr,
    const typename Gemm::GemmKernel::CollectiveMainloop::Arguments& mainloop) {
  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = p.device;
  hw_info.sm_count = p.num_sms > 0
                         ? p.num_sms
                         : cutlass::KernelHardwareInfo::query_device_multiprocessor_count(p.device);
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {static_cast<int>(p.num_groups), arr.shapes, nullptr},  // sizes: device only
      mainloop,
      {{}, nullptr, arr.stride_d, arr.ptr_d, arr.stride_d},
      hw_info};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  return args;
}

// The host side of a grouped kernel K, which provides Gemm, Arrays,
// make_arguments(const Params&, const Arrays&), kName ("grouped", "FP8 grouped": used in error
// messages) and setup(const Params&, const Arrays&, void* scratch, cudaStream_t, char* err,
// size_t err_len), which launches the setup kernels (returns nonzero with err filled to refuse the
// call). K may hide scratch_bytes(const Params&) to get scratch device memory for its setup.
// Workspace: the per-group arrays, K's scratch, then CUTLASS's own (TMA descriptors per SM).
template <class K, class Params>
struct GroupedRunner {
  static size_t scratch_bytes(const Params&) { return 0; }
  static size_t cutlass_workspace(const Params& p) {
    typename K::Arrays none{};
    return K::Gemm::get_workspace_size(K::make_arguments(p, none));
  }
  // Bytes before CUTLASS's workspace: the arrays and the scratch.
  static size_t own_bytes(const Params& p) {
    return K::Arrays::bytes(p.num_groups) + K::Arrays::align(K::scratch_bytes(p));
  }
  static int workspace(const Params* p, size_t* bytes, char*, size_t) {
    *bytes = own_bytes(*p) + K::Arrays::align(cutlass_workspace(*p));
    return 0;
  }

  static int run(const Params* p, char* err, size_t err_len) {
    using Arrays = typename K::Arrays;
    const size_t before_cutlass = own_bytes(*p);
    const size_t needed = before_cutlass + Arrays::align(cutlass_workspace(*p));
    if (needed > p->workspace_bytes) {
      std::snprintf(err, err_len, "workspace too small: need %zu bytes, have %zu", needed,
                    p->workspace_bytes);
      return 1;
    }
    auto stream = static_cast<cudaStream_t>(p->stream);
    char* base = static_cast<char*>(p->workspace);
    Arrays arr = Arrays::carve(base, p->num_groups);
    void* scratch = base + Arrays::bytes(p->num_groups);
    if (int refused = K::setup(*p, arr, scratch, stream, err, err_len)) return refused;
    cudaError_t setup = cudaGetLastError();
    if (setup != cudaSuccess) {
      std::snprintf(err, err_len, "group setup launch failed: %s", cudaGetErrorString(setup));
      return 1;
    }
    typename K::Gemm gemm;
    auto args = K::make_arguments(*p, arr);
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess) {
      std::snprintf(err, err_len, "CUTLASS cannot implement this %s problem: %s", K::kName,
                    cutlassGetStatusString(status));
      return 1;
    }
    status = initialize_and_run<typename K::Gemm>(args, base + before_cutlass, stream);
    cudaError_t launch = cudaGetLastError();
    if (status != cutlass::Status::kSuccess || launch != cudaSuccess) {
      std::snprintf(err, err_len, "CUTLASS %s launch failed: %s (%s)", K::kName,
                    cutlassGetStatusString(status), cudaGetErrorString(launch));
      return 1;
    }
    return 0;
  }
};

}  // namespace primus_turbo::kernels::grouped
