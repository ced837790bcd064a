// FP8 grouped GEMM for Hopper (sm_90a) with group sizes that live only on the device.
//
// The same scheme as the bf16 grouped GEMM (cutlass_grouped_gemm_sm90.cuh): a one-block setup
// kernel turns group_lens / group_offs into per-group problem shapes, operand pointers and scale
// pointers (clamped into the packed extent), then a CUTLASS 3 pointer-array kernel runs with the
// sizes left on the device. The mainloop is CUTLASS's FP8 block-scaled ptr-array collective: TMA
// loads, FP8 WGMMA (QGMMA) accumulating one 128-deep K block, promoted into FP32 registers times
// that block's A and B scales; persistent cooperative schedule; D = acc in bf16/fp16/fp32.
//
// Both operands are K-major (what FP8 WGMMA reads): A = a [rows, k], B = b[g] [n, k]. Scales:
//   A: one per row and K block (1x128), K-major [rows, kb] - the quantizer's own layout, so a
//      group's scales start at sfa + start * kb. (The collective derives each group's scale layout
//      from the group's shape and the K-major stride depends on k only, which is what makes a
//      slice of the packed tensor a valid per-group layout.)
//   B: per expert, 1x128 ([n, kb]) or 128x128 ([ceil(n/128), kb]) blocks, K-major.
// Tensorwise and rowwise scalings are restated in these layouts by the caller.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "primus_turbo/kernels/grouped_gemm/grouped_gemm_fp8_abi.h"
#include "primus_turbo/kernels/grouped_gemm/grouped_setup.cuh"

namespace primus_turbo::kernels::grouped_fp8 {

using grouped::group_span;
using grouped::GroupScan;
using grouped::GroupSpan;
using grouped::kSetupThreads;

constexpr int kBlockK = 128;     // K depth of one scale

// One block: the forward / dgrad (row split) arguments from the clamped spans (group_span), with
// each group's scale pointers. b_scale_rows: scale rows per expert in sfb.
template <class Arrays, class ElementA, class ElementB, class ElementD>
__global__ void __launch_bounds__(kSetupThreads)
    setup_fp8_groups(Arrays out, const int64_t* __restrict__ group_lens,
                     const int64_t* __restrict__ group_offs, int64_t num_groups, int64_t rows,
                     int n, int k, int64_t b_scale_rows, const ElementA* a, const float* sfa,
                     const ElementB* b, const float* sfb, ElementD* d) {
  __shared__ GroupScan::TempStorage scan_storage;
  const int64_t kb = (k + kBlockK - 1) / kBlockK;
  int64_t carry = 0;
  for (int64_t base = 0; base < num_groups; base += kSetupThreads) {
    const int64_t g = base + threadIdx.x;
    const GroupSpan span =
        group_span(scan_storage, group_lens, group_offs, num_groups, rows, g, carry);
    if (g < num_groups) {
      const int64_t start = span.start, len = span.len;
      out.shapes[g] = {static_cast<int>(len), n, k};
      out.ptr_a[g] = a + start * k;
      out.ptr_b[g] = b + g * int64_t(n) * k;
      out.ptr_d[g] = d + start * n;
      out.ptr_sfa[g] = sfa + start * kb;
      out.ptr_sfb[g] = sfb + g * b_scale_rows * kb;
      out.stride_a[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_a[g])>>(k);
      out.stride_b[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_b[g])>>(k);
      out.stride_d[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_d[g])>>(n);
    }
  }
}

// Wgrad: the groups split the reduction over padded token columns (see grouped_gemm_fp8_abi.h).
// Clamping is the forward's; then a second scan packs the 128-padded lengths.
template <class Arrays, class ElementA, class ElementB, class ElementD>
__global__ void __launch_bounds__(kSetupThreads)
    setup_fp8_wgrad_groups(Arrays out, const int64_t* __restrict__ group_lens,
                           const int64_t* __restrict__ group_offs, int64_t num_groups,
                           int64_t rows, int m, int n, int64_t ld, const ElementA* a,
                           const float* sfa, const ElementB* b, const float* sfb, ElementD* d) {
  __shared__ GroupScan::TempStorage scan_storage;
  int64_t carry = 0, padded_carry = 0;
  for (int64_t base = 0; base < num_groups; base += kSetupThreads) {
    const int64_t g = base + threadIdx.x;
    const int64_t len =
        group_span(scan_storage, group_lens, group_offs, num_groups, rows, g, carry).len;
    const int64_t plen = (len + kBlockK - 1) / kBlockK * kBlockK;
    int64_t pprefix, ptotal;
    GroupScan(scan_storage).ExclusiveSum(plen, pprefix, ptotal);
    __syncthreads();
    if (g < num_groups) {
      int64_t pstart = padded_carry + pprefix;
      // Never past the packed width the host allocated (only if sizes overran it).
      const int64_t fit = pstart + plen <= ld ? plen : (ld - pstart > 0 ? (ld - pstart) / kBlockK * kBlockK : 0);
      pstart = pstart < ld ? pstart : ld;
      out.shapes[g] = {fit > 0 ? m : 0, n, static_cast<int>(fit)};
      out.ptr_a[g] = a + pstart;
      out.ptr_b[g] = b + pstart;
      out.ptr_d[g] = d + g * int64_t(m) * n;
      out.ptr_sfa[g] = sfa + pstart / kBlockK * m;
      out.ptr_sfb[g] = sfb + pstart / kBlockK * n;
      out.stride_a[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_a[g])>>(ld);
      out.stride_b[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_b[g])>>(ld);
      out.stride_d[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_d[g])>>(n);
    }
    padded_carry += ptotal;
  }
}

// kWgrad: the reduction split above, both operands' scales 1x128 along the tokens (MN-major, so a
// group's slice of them is a valid layout whatever its length); kScaleRowsB must be 1.
template <class ElementA_, class ElementB_, class ElementD_, int kScaleRowsB, int kTileM,
          int kTileN, int kClusterM, int kClusterN, bool kWgrad = false>
struct CutlassGroupedGemmFp8Sm90
    : grouped::GroupedRunner<CutlassGroupedGemmFp8Sm90<ElementA_, ElementB_, ElementD_, kScaleRowsB,
                                                       kTileM, kTileN, kClusterM, kClusterN, kWgrad>,
                             PtGroupedGemmFp8Params> {
  static constexpr const char* kName = "FP8 grouped";
  static_assert(!kWgrad || kScaleRowsB == 1, "wgrad takes 1x128 scales on both operands");
  using ElementA = ElementA_;
  using ElementB = ElementB_;
  using ElementD = ElementD_;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;     // a [rows, k]
  using LayoutB = cutlass::layout::ColumnMajor;  // b[g] [n, k] seen as [k, n] with K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kTileK = 128;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  static constexpr int kScaleRowsBPerGroup = kScaleRowsB;

  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;

  // Forward/dgrad: K-major scales on both sides (see the file comment for why A's must be).
  // Wgrad: MN-major, [ld/128, rows]: the per-group stride along K blocks is then the fixed row
  // count, and a group's scales start at (pstart / 128) * rows.
  static constexpr auto kScaleMajor = kWgrad ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleRowsB, kBlockK,
                                                                 kScaleMajor, kScaleMajor>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA,
      cute::tuple<LayoutA*, LayoutSFA*>, kAlignAB, ElementB, cute::tuple<LayoutB*, LayoutSFB*>,
      kAlignAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Arrays = grouped::ScaledGroupArrays<typename ProblemShape::UnderlyingProblemShape, ElementA,
                                            ElementB, ElementD, StrideA, StrideB, StrideD>;
  // The setup kernels write every stride's one dynamic mode, the row stride of a K-major operand.
  static_assert(!cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(StrideA{}))>>::value &&
                !cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(StrideB{}))>>::value &&
                !cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(StrideD{}))>>::value);

  static typename Gemm::Arguments make_arguments(const PtGroupedGemmFp8Params& p,
                                                 const Arrays& arr) {
    // The collective derives each group's scale layouts from its problem shape; the layout
    // arguments are not read in grouped mode.
    return grouped::grouped_arguments<Gemm>(
        p, arr,
        {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b, arr.ptr_sfa, nullptr, arr.ptr_sfb,
         nullptr});
  }

  static int setup(const PtGroupedGemmFp8Params& p, const Arrays& arr, cudaStream_t stream,
                   char* err, size_t err_len) {
    if constexpr (kWgrad) {
      if (!p.wgrad) {
        std::snprintf(err, err_len, "this module is the wgrad (reduction split) kernel");
        return 1;
      }
      setup_fp8_wgrad_groups<<<1, kSetupThreads, 0, stream>>>(
          arr, p.group_lens, p.group_offs, p.num_groups, p.rows, int(p.m), int(p.n), p.ld,
          static_cast<const ElementA*>(p.a), p.sfa, static_cast<const ElementB*>(p.b), p.sfb,
          static_cast<ElementD*>(p.d));
      grouped::launch_zero_empty_groups<ElementD>(arr.shapes, p.d, p.num_groups, p.m, p.n,
                                                  stream);
    } else {
      if (p.wgrad) {
        std::snprintf(err, err_len, "this module is the forward (row split) kernel");
        return 1;
      }
      const int64_t b_scale_rows = (p.n + kScaleRowsB - 1) / kScaleRowsB;
      setup_fp8_groups<<<1, kSetupThreads, 0, stream>>>(
          arr, p.group_lens, p.group_offs, p.num_groups, p.rows, int(p.n), int(p.k),
          b_scale_rows, static_cast<const ElementA*>(p.a), p.sfa,
          static_cast<const ElementB*>(p.b), p.sfb, static_cast<ElementD*>(p.d));
    }
    return 0;
  }
};

}  // namespace primus_turbo::kernels::grouped_fp8
