// Grouped GEMM for Hopper (sm_90a) with group sizes that live only on the device.
//
// A one-block setup kernel reads group_lens (and group_offs, or a prefix sum of group_lens),
// clamps every group to the packed extent the host knows, and writes the per-group problem
// shapes, pointers and strides into the workspace. A CUTLASS 3 pointer-array kernel then runs:
// TMA loads with per-group descriptors updated on the device, warp-specialized producer/consumer
// warpgroups, WGMMA, and a persistent tile scheduler that walks every group's tiles. Nothing is
// copied to the host, so a call is capturable in a CUDA graph and group sizes may change between
// replays.
//
// Two ways a call splits its packed operands (PtGroupedGemmParams::split):
//   rows      (forward, dgrad): group g owns rows [start, start + len) of A and D; B is b[g].
//             D_g[len, n] = A_g[len, k] @ B_g[k, n].  A is K-major; B either.
//   reduction (wgrad): group g owns rows [start, start + len) of both packed operands, which is
//             the GEMM's K. D_g = d[g][m, n] = A_g^T @ B_g with A, B M-/N-major. A group with
//             len == 0 gets an exact zero D_g (a K = 0 tile would leave garbage accumulators).
//
// Element types are template parameters so FP8 variants can reuse the scheduling and setup.
#pragma once

#include <algorithm>
#include <cstdio>

#include <cub/block/block_scan.cuh>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "primus_turbo/kernels/grouped_gemm/grouped_gemm_abi.h"

namespace primus_turbo::kernels::grouped {

struct Cooperative {
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
struct Pingpong {
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

// A rank-3 CuTe stride (M|N, K, L) with one dynamic mode: set that mode to ld.
template <class Stride>
__host__ __device__ Stride leading_stride(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  return s;
}

// Where the setup kernel writes the per-group arguments (all arrays of num_groups entries).
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

constexpr int kSetupThreads = 256;

// One block. Group starts come from group_offs when given, else from an exclusive prefix sum of
// the (negative -> 0) lengths; every group is clamped into [0, rows) so that lengths that do not
// add up to the packed extent can never address memory outside the operands.
template <bool kReduction, bool kAKMajor, bool kBKMajor, class Arrays, class ElementA,
          class ElementB, class ElementD>
__global__ void __launch_bounds__(kSetupThreads)
    setup_groups(Arrays out, const int64_t* __restrict__ group_lens,
                 const int64_t* __restrict__ group_offs, int64_t num_groups, int64_t rows, int m,
                 int n, int k, const ElementA* a, const ElementB* b, ElementD* d) {
  using Scan = cub::BlockScan<int64_t, kSetupThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  int64_t carry = 0;
  for (int64_t base = 0; base < num_groups; base += kSetupThreads) {
    const int64_t g = base + threadIdx.x;
    const int64_t raw = g < num_groups ? group_lens[g] : 0;
    const int64_t len_in = raw > 0 ? raw : 0;
    int64_t prefix, total;
    Scan(scan_storage).ExclusiveSum(len_in, prefix, total);
    __syncthreads();  // scan_storage is reused by the next chunk
    if (g < num_groups) {
      int64_t start = group_offs ? group_offs[g] : carry + prefix;
      start = start < 0 ? 0 : (start > rows ? rows : start);
      const int64_t len = len_in < rows - start ? len_in : rows - start;
      if constexpr (!kReduction) {
        // D_g = A_g @ B_g: A_g is rows [start, start+len) of a [rows, k]; B_g = b[g].
        out.shapes[g] = {static_cast<int>(len), n, k};
        out.ptr_a[g] = a + start * k;
        out.ptr_b[g] = b + g * int64_t(n) * k;
        out.ptr_d[g] = d + start * n;
        out.stride_a[g] = leading_stride<typename cute::remove_cvref_t<decltype(out.stride_a[g])>>(
            kAKMajor ? k : len);
        out.stride_b[g] = leading_stride<typename cute::remove_cvref_t<decltype(out.stride_b[g])>>(
            kBKMajor ? k : n);
      } else {
        // D_g = d[g] = A_g^T @ B_g over rows [start, start+len) of a [rows, m] and b [rows, n].
        // An empty group gets no tiles; zero_empty_groups writes its zeros.
        out.shapes[g] = {len > 0 ? m : 0, n, static_cast<int>(len)};
        out.ptr_a[g] = a + start * m;
        out.ptr_b[g] = b + start * n;
        out.ptr_d[g] = d + g * int64_t(m) * n;
        out.stride_a[g] = leading_stride<typename cute::remove_cvref_t<decltype(out.stride_a[g])>>(
            kAKMajor ? len : m);
        out.stride_b[g] = leading_stride<typename cute::remove_cvref_t<decltype(out.stride_b[g])>>(
            kBKMajor ? len : n);
      }
      out.stride_d[g] = leading_stride<typename cute::remove_cvref_t<decltype(out.stride_d[g])>>(n);
    }
    carry += total;
  }
}

// Reduction split: d[g] = 0 for every group whose reduction is empty, in 16-byte stores (a group
// is m * n elements with n a multiple of 16 bytes). Grid (chunks, groups); a block of a non-empty
// group returns at once.
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

template <class ElementAB, class ElementD, class LayoutA, class LayoutB, int kTileM, int kTileN,
          int kTileK, int kClusterM, int kClusterN, class Schedule>
struct CutlassGroupedGemmSm90 {
  using ElementA = ElementAB;
  using ElementB = ElementAB;
  using ElementAccumulator = float;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignA = 16 / sizeof(ElementA);
  static constexpr int kAlignB = 16 / sizeof(ElementB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  static constexpr bool kAKMajor = cute::is_same_v<LayoutA, cutlass::layout::RowMajor>;
  static constexpr bool kBKMajor = cute::is_same_v<LayoutB, cutlass::layout::ColumnMajor>;

  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;

  // No source operand (ElementC = void): D = acc, nothing is read back.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD,
      typename Schedule::Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlignA, ElementB,
      LayoutB*, kAlignB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Schedule::Kernel>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Arrays = GroupArrays<typename ProblemShape::UnderlyingProblemShape, ElementA, ElementB,
                             ElementD, StrideA, StrideB, StrideD>;

  static typename Gemm::Arguments make_arguments(const PtGroupedGemmParams& p, const Arrays& arr) {
    cutlass::KernelHardwareInfo hw_info;
    hw_info.device_id = p.device;
    hw_info.sm_count = p.num_sms > 0
                           ? p.num_sms
                           : cutlass::KernelHardwareInfo::query_device_multiprocessor_count(p.device);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {static_cast<int>(p.num_groups), arr.shapes, nullptr},  // sizes: device only
        {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b},
        {{}, nullptr, arr.stride_d, arr.ptr_d, arr.stride_d},
        hw_info};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    return args;
  }

  // Workspace: the per-group arrays, then CUTLASS's own (device-side TMA descriptors per SM).
  static size_t cutlass_workspace(const PtGroupedGemmParams& p) {
    Arrays none{};
    return Gemm::get_workspace_size(make_arguments(p, none));
  }
  static int workspace(const PtGroupedGemmParams* p, size_t* bytes, char*, size_t) {
    *bytes = Arrays::bytes(p->num_groups) + Arrays::align(cutlass_workspace(*p));
    return 0;
  }

  static int run(const PtGroupedGemmParams* p, char* err, size_t err_len) {
    const size_t array_bytes = Arrays::bytes(p->num_groups);
    const size_t needed = array_bytes + Arrays::align(cutlass_workspace(*p));
    if (needed > p->workspace_bytes) {
      std::snprintf(err, err_len, "workspace too small: need %zu bytes, have %zu", needed,
                    p->workspace_bytes);
      return 1;
    }
    auto stream = static_cast<cudaStream_t>(p->stream);
    Arrays arr = Arrays::carve(p->workspace, p->num_groups);
    if (p->split == PT_GROUPED_SPLIT_REDUCTION) {
      setup_groups<true, kAKMajor, kBKMajor><<<1, kSetupThreads, 0, stream>>>(
          arr, p->group_lens, p->group_offs, p->num_groups, p->rows, int(p->m), int(p->n),
          int(p->k), static_cast<const ElementA*>(p->a), static_cast<const ElementB*>(p->b),
          static_cast<ElementD*>(p->d));
      const int64_t vecs = p->m * p->n * int64_t(sizeof(ElementD)) / 16;
      const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(128, (vecs + 255) / 256));
      zero_empty_groups<<<dim3(unsigned(chunks), unsigned(p->num_groups)), 256, 0, stream>>>(
          arr.shapes, static_cast<uint4*>(p->d), vecs);
    } else {
      setup_groups<false, kAKMajor, kBKMajor><<<1, kSetupThreads, 0, stream>>>(
          arr, p->group_lens, p->group_offs, p->num_groups, p->rows, int(p->m), int(p->n),
          int(p->k), static_cast<const ElementA*>(p->a), static_cast<const ElementB*>(p->b),
          static_cast<ElementD*>(p->d));
    }
    cudaError_t setup = cudaGetLastError();
    if (setup != cudaSuccess) {
      std::snprintf(err, err_len, "group setup launch failed: %s", cudaGetErrorString(setup));
      return 1;
    }
    Gemm gemm;
    auto args = make_arguments(*p, arr);
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess) {
      std::snprintf(err, err_len, "CUTLASS cannot implement this grouped problem: %s",
                    cutlassGetStatusString(status));
      return 1;
    }
    status = gemm.initialize(args, static_cast<char*>(p->workspace) + array_bytes, stream);
    if (status == cutlass::Status::kSuccess) status = gemm.run(stream);
    cudaError_t launch = cudaGetLastError();
    if (status != cutlass::Status::kSuccess || launch != cudaSuccess) {
      std::snprintf(err, err_len, "CUTLASS grouped launch failed: %s (%s)",
                    cutlassGetStatusString(status), cudaGetErrorString(launch));
      return 1;
    }
    return 0;
  }
};

}  // namespace primus_turbo::kernels::grouped
