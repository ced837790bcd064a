// FP8 grouped GEMM for Hopper (sm_90a) with one scale per row of each operand (ROWWISE and, its
// scale repeated, TENSORWISE), group sizes living only on the device.
//
// d[rows of g] = diag(sfa[rows of g]) * (a[rows of g] @ b[g]^T) * diag(sfb[g]): the scales do not
// change along K, so they leave the mainloop entirely. The product runs on plain FP8 WGMMA
// (QGMMA) tiles and the epilogue multiplies each accumulator by its row's and its column's scale
// before rounding to the output type (a CUTLASS epilogue visitor tree: row and column broadcasts
// read through per-group pointers). Against the block-scaled kernel
// (cutlass_grouped_gemm_fp8_sm90.cuh), which the same scales restated per 128-deep K block would
// take, the mainloop loses its per-block scale loads and the FP32 promotion of every block.
//
// kFastAccum: the mainloop accumulates in the tensor cores' fast mode (no periodic promotion of
// the partial sums into FP32 registers): the forward GEMMs of the common FP8 recipes. Without it
// the partial sums are promoted every few K blocks, as in CUTLASS's default FP8 mainloop.
//
// Operands as the block-scaled kernel's: A = a [rows, k], B = b[g] [n, k], both K-major; sfa
// [rows] fp32, sfb [G, n] fp32; d [rows, n]. The setup kernel (one launch) writes the per-group
// shapes, operand and scale pointers from group_lens / group_offs, clamped into the packed extent,
// and zeroes the output rows no group covers.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "primus_turbo/kernels/grouped_gemm/grouped_gemm_fp8_abi.h"
#include "primus_turbo/kernels/grouped_gemm/grouped_setup.cuh"

namespace primus_turbo::kernels::grouped_fp8 {

// Grid (chunks, groups): CTA (0, g) writes group g's arguments (its rows found by the column's
// CTAs themselves, own_group_span), and the whole grid zeroes the output rows no group covers.
template <class Arrays, class ElementA, class ElementB, class ElementD>
__global__ void __launch_bounds__(grouped::kSetupThreads)
    setup_fp8_rowwise(Arrays out, const int64_t* __restrict__ group_lens, const int64_t* __restrict__ group_offs,
                      int64_t num_groups, int64_t rows, int n, int k, const ElementA* a, const float* sfa,
                      const ElementB* b, const float* sfb, ElementD* d) {
  const int64_t g = blockIdx.y;
  if (g < num_groups && blockIdx.x == 0) {  // a grid of one row serves zero groups
    const grouped::GroupSpan span = grouped::own_group_span(group_lens, group_offs, rows, g);
    if (threadIdx.x == 0) {
      out.shapes[g] = {static_cast<int>(span.len), n, k};
      out.ptr_a[g] = a + span.start * k;
      out.ptr_b[g] = b + g * int64_t(n) * k;
      out.ptr_d[g] = d + span.start * n;
      out.ptr_sfa[g] = sfa + span.start;
      out.ptr_sfb[g] = sfb + g * int64_t(n);
      out.stride_a[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_a[g])>>(k);
      out.stride_b[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_b[g])>>(k);
      out.stride_d[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_d[g])>>(n);
    }
  }
  grouped::zero_rows_from(grouped::covered_rows(group_lens, group_offs, num_groups, rows), rows, n, d);
}

template <class ElementA_, class ElementB_, class ElementD_, int kTileM, int kTileN, int kClusterM, int kClusterN,
          bool kFastAccum>
struct CutlassGroupedGemmFp8RowwiseSm90
    : grouped::GroupedRunner<CutlassGroupedGemmFp8RowwiseSm90<ElementA_, ElementB_, ElementD_, kTileM, kTileN,
                                                              kClusterM, kClusterN, kFastAccum>,
                             PtGroupedGemmFp8Params> {
  static constexpr const char* kName = "FP8 grouped (row scales)";
  using ElementA = ElementA_;
  using ElementB = ElementB_;
  using ElementD = ElementD_;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;     // a [rows, k]
  using LayoutB = cutlass::layout::ColumnMajor;  // b[g] [n, k] seen as [k, n] with K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<128>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;

  // The epilogue: d = round((acc * sfa[row]) * sfb[col]), each scale read through its group's
  // pointer (a column vector along M for a's rows, a row vector along N for b's).
  using Multiply = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float,
                                                          cutlass::FloatRoundStyle::round_to_nearest>;
  using ToOutput = cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::Identity, ElementD, float,
                                                          cutlass::FloatRoundStyle::round_to_nearest>;
  using RowScales = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float*, float,
                                                                cute::Stride<cute::_1, cute::_0, cute::_0>>;
  using ColScales = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float*, float,
                                                                cute::Stride<cute::_0, cute::_1, cute::_0>>;
  using ScaledRows = cutlass::epilogue::fusion::Sm90EVT<Multiply, RowScales, cutlass::epilogue::fusion::Sm90AccFetch>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<Multiply, ColScales, ScaledRows>;
  using Epilogue = cutlass::epilogue::fusion::Sm90EVT<ToOutput, Scaled>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, void, LayoutD*,
      kAlignD, ElementD, LayoutD*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      Epilogue>::CollectiveOp;

  using MainloopSchedule =
      cute::conditional_t<kFastAccum, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum,
                          cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlignAB, ElementB, LayoutB*,
      kAlignAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Arrays = grouped::ScaledGroupArrays<typename ProblemShape::UnderlyingProblemShape, ElementA, ElementB,
                                            ElementD, StrideA, StrideB, StrideD>;

  static typename Gemm::Arguments make_arguments(const PtGroupedGemmFp8Params& p, const Arrays& arr) {
    cutlass::KernelHardwareInfo hw_info;
    hw_info.device_id = p.device;
    hw_info.sm_count =
        p.num_sms > 0 ? p.num_sms : cutlass::KernelHardwareInfo::query_device_multiprocessor_count(p.device);
    // The visitor tree's arguments, outermost node first: ToOutput(Scaled(ColScales, ScaledRows(RowScales,
    // acc))). The broadcasts take per-group pointer arrays (their element type is a pointer).
    typename Epilogue::Arguments fusion{
        {{arr.ptr_sfb}, {{arr.ptr_sfa}, {}, {}}, {}},
        {}};
    return typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                    {static_cast<int>(p.num_groups), arr.shapes, nullptr},  // sizes: device only
                                    {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b},
                                    {fusion, nullptr, arr.stride_d, arr.ptr_d, arr.stride_d},
                                    hw_info};
  }

  static int setup(const PtGroupedGemmFp8Params& p, const Arrays& arr, void*, cudaStream_t stream, char* err,
                   size_t err_len) {
    if (p.wgrad) {
      std::snprintf(err, err_len, "the row-scaled FP8 grouped GEMM has no wgrad (reduction split) form");
      return 1;
    }
    // Enough CTAs for the uncovered-rows zeroing (a no-op when the groups cover every row).
    const int64_t vecs = p.rows * p.n * int64_t(sizeof(ElementD)) / 16;
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(8, (vecs + 65535) / 65536));
    setup_fp8_rowwise<<<dim3(unsigned(chunks), unsigned(std::max<int64_t>(p.num_groups, 1))),
                        grouped::kSetupThreads, 0, stream>>>(
        arr, p.group_lens, p.group_offs, p.num_groups, p.rows, int(p.n), int(p.k),
        static_cast<const ElementA*>(p.a), p.sfa, static_cast<const ElementB*>(p.b), p.sfb,
        static_cast<ElementD*>(p.d));
    return 0;
  }
};

}  // namespace primus_turbo::kernels::grouped_fp8
