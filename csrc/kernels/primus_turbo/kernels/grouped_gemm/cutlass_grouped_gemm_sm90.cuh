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
#include "primus_turbo/kernels/grouped_gemm/grouped_setup.cuh"

namespace primus_turbo::kernels::grouped {

struct Cooperative {
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
struct Pingpong {
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

// One block: the per-group arguments of either split, from the clamped spans (group_span).
template <bool kReduction, bool kAKMajor, bool kBKMajor, class Arrays, class ElementA,
          class ElementB, class ElementD>
__global__ void __launch_bounds__(kSetupThreads)
    setup_groups(Arrays out, const int64_t* __restrict__ group_lens,
                 const int64_t* __restrict__ group_offs, int64_t num_groups, int64_t rows, int m,
                 int n, int k, const ElementA* a, const ElementB* b, ElementD* d) {
  __shared__ GroupScan::TempStorage scan_storage;
  int64_t carry = 0;
  for (int64_t base = 0; base < num_groups; base += kSetupThreads) {
    const int64_t g = base + threadIdx.x;
    const GroupSpan span =
        group_span(scan_storage, group_lens, group_offs, num_groups, rows, g, carry);
    if (g < num_groups) {
      const int64_t start = span.start, len = span.len;
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
  }
}

template <class ElementAB, class ElementD, class LayoutA, class LayoutB, int kTileM, int kTileN,
          int kTileK, int kClusterM, int kClusterN, class Schedule>
struct CutlassGroupedGemmSm90
    : GroupedRunner<CutlassGroupedGemmSm90<ElementAB, ElementD, LayoutA, LayoutB, kTileM, kTileN,
                                           kTileK, kClusterM, kClusterN, Schedule>,
                    PtGroupedGemmParams> {
  static constexpr const char* kName = "grouped";
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
    return grouped_arguments<Gemm>(p, arr, {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b});
  }

  static int setup(const PtGroupedGemmParams& p, const Arrays& arr, void*, cudaStream_t stream,
                   char*, size_t) {
    if (p.split == PT_GROUPED_SPLIT_REDUCTION) {
      setup_groups<true, kAKMajor, kBKMajor><<<1, kSetupThreads, 0, stream>>>(
          arr, p.group_lens, p.group_offs, p.num_groups, p.rows, int(p.m), int(p.n), int(p.k),
          static_cast<const ElementA*>(p.a), static_cast<const ElementB*>(p.b),
          static_cast<ElementD*>(p.d));
      launch_zero_empty_groups<ElementD>(arr.shapes, p.d, p.num_groups, p.m, p.n, stream);
    } else {
      setup_groups<false, kAKMajor, kBKMajor><<<1, kSetupThreads, 0, stream>>>(
          arr, p.group_lens, p.group_offs, p.num_groups, p.rows, int(p.m), int(p.n), int(p.k),
          static_cast<const ElementA*>(p.a), static_cast<const ElementB*>(p.b),
          static_cast<ElementD*>(p.d));
      launch_zero_uncovered_rows<ElementD>(p.group_lens, p.group_offs, p.num_groups, p.rows, p.n,
                                           p.d, stream);
    }
    return 0;
  }
};

}  // namespace primus_turbo::kernels::grouped
