// FP8 grouped GEMM for Hopper (sm_90a) with group sizes that live only on the device.
//
// The same scheme as the bf16 grouped GEMM (cutlass_grouped_gemm_sm90.cuh): a setup kernel turns
// group_lens / group_offs into per-group problem shapes, operand pointers and scale pointers
// (clamped into the packed extent), then a CUTLASS 3 pointer-array kernel runs with the sizes left
// on the device. The forward's setup is one launch (setup_fp8_forward: arguments, the scale
// rewrite below and the zeroing of uncovered rows), since each launch costs the host ~5 us. The
// mainloop is CUTLASS's FP8 block-scaled ptr-array collective: TMA loads, FP8 WGMMA (QGMMA)
// accumulating one 128-deep K block, promoted into FP32 registers times that block's A and B
// scales; persistent cooperative schedule; D = acc in bf16/fp16/fp32.
//
// Both operands are K-major (what FP8 WGMMA reads): A = a [rows, k], B = b[g] [n, k]. The caller's
// scales are K-major too: A one per row and K block (1x128) [rows, kb]; B per expert, 1x128
// ([n, kb]) or 128x128 ([ceil(n/128), kb]) blocks. Tensorwise and rowwise scalings are restated in
// these layouts by the caller.
//
// The mainloop reads a tile's 1x128 scales for one K block per stage: 128 rows' worth. K-major,
// that is 128 loads 4*kb bytes apart; MN-major, 512 contiguous bytes. So the forward's setup
// rewrites the 1x128 scales MN-major into workspace scratch (scales_to_mn_major): group g's A scales as
// [kb, len_g] at scratch + start_g * kb (the collective derives a group's layout from its shape,
// and an MN-major stride is the group's own row count), 1x128 B scales as [kb, n] per expert. The
// 128x128 B scales are one load per tile and stay K-major.
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

// Group span's 1x128 scales, K-major [len, kb] at src + start * kb, rewritten MN-major [kb, len] at
// dst + start * kb by the CTAs of one grid column (blockIdx.x). Writes are coalesced; the strided
// reads are a few MB at most, from L2.
__device__ inline void scales_to_mn_major(GroupSpan span, const float* __restrict__ src, float* __restrict__ dst,
                                          int64_t kb) {
  const int64_t total = span.len * kb;
  const float* from = src + span.start * kb;
  float* to = dst + span.start * kb;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i / span.len, r = i - j * span.len;
    to[i] = from[r * kb + j];
  }
}

// The forward / dgrad (row split) setup in one launch, grid (chunks, groups): the CTAs of column g
// find group g's clamped span themselves (own_group_span); CTA (0, g) writes its arguments (scale
// pointers into the MN-major copies), the column rewrites its A scales MN-major (and, with 1x128 B
// scales, expert g's), and the whole grid zeroes the output rows no group covers.
template <bool kMnB, class Arrays, class ElementA, class ElementB, class ElementD>
__global__ void __launch_bounds__(kSetupThreads)
    setup_fp8_forward(Arrays out, const int64_t* __restrict__ group_lens, const int64_t* __restrict__ group_offs,
                      int64_t num_groups, int64_t rows, int n, int k, int64_t b_scale_rows, const ElementA* a,
                      const float* sfa, float* sfa_mn, const ElementB* b, const float* sfb, float* sfb_mn,
                      ElementD* d) {
  const int64_t kb = (k + kBlockK - 1) / kBlockK, g = blockIdx.y;
  if (g < num_groups) {  // a grid of one row serves zero groups
    const GroupSpan span = grouped::own_group_span(group_lens, group_offs, rows, g);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      out.shapes[g] = {static_cast<int>(span.len), n, k};
      out.ptr_a[g] = a + span.start * k;
      out.ptr_b[g] = b + g * int64_t(n) * k;
      out.ptr_d[g] = d + span.start * n;
      out.ptr_sfa[g] = sfa_mn + span.start * kb;
      out.ptr_sfb[g] = (kMnB ? sfb_mn : sfb) + g * b_scale_rows * kb;
      out.stride_a[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_a[g])>>(k);
      out.stride_b[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_b[g])>>(k);
      out.stride_d[g] = leading_stride<cute::remove_cvref_t<decltype(out.stride_d[g])>>(n);
    }
    scales_to_mn_major(span, sfa, sfa_mn, kb);
    if constexpr (kMnB) scales_to_mn_major(GroupSpan{g * n, n}, sfb, sfb_mn, kb);
  }
  grouped::zero_rows_from(grouped::covered_rows(group_lens, group_offs, num_groups, rows), rows, n, d);
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

  // 1x128 scales are MN-major: the forward's rewritten ones (see the file comment) and the wgrad's,
  // [ld/128, rows] (the per-group stride along K blocks is then the fixed row count, and a group's
  // scales start at (pstart / 128) * rows). 128x128 B scales stay K-major.
  static constexpr auto kMajorB = kScaleRowsB == 1 ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleRowsB, kBlockK,
                                                                 cute::GMMA::Major::MN, kMajorB>;
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

  static int64_t scale_blocks(const PtGroupedGemmFp8Params& p) { return (p.k + kBlockK - 1) / kBlockK; }
  // The forward's MN-major scale copies: A's, then (1x128 only) B's.
  static size_t scratch_bytes(const PtGroupedGemmFp8Params& p) {
    if (p.wgrad) return 0;
    const int64_t b_rows = kScaleRowsB == 1 ? p.num_groups * p.n : 0;
    return size_t(p.rows + b_rows) * size_t(scale_blocks(p)) * sizeof(float);
  }

  static int setup(const PtGroupedGemmFp8Params& p, const Arrays& arr, void* scratch,
                   cudaStream_t stream, char* err, size_t err_len) {
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
      const int64_t kb = scale_blocks(p);
      float* sfa_mn = static_cast<float*>(scratch);
      float* sfb_mn = sfa_mn + p.rows * kb;
      // Enough CTAs a group for its scale copies: about 1024 values each, at most 64.
      const int64_t per_group = std::max((p.rows + p.num_groups - 1) / std::max<int64_t>(p.num_groups, 1),
                                         kScaleRowsB == 1 ? p.n : int64_t{0}) * kb;
      const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(64, (per_group + 1023) / 1024));
      setup_fp8_forward<kScaleRowsB == 1>
          <<<dim3(unsigned(chunks), unsigned(std::max<int64_t>(p.num_groups, 1))), kSetupThreads, 0, stream>>>(
              arr, p.group_lens, p.group_offs, p.num_groups, p.rows, int(p.n), int(p.k), b_scale_rows,
              static_cast<const ElementA*>(p.a), p.sfa, sfa_mn, static_cast<const ElementB*>(p.b), p.sfb, sfb_mn,
              static_cast<ElementD*>(p.d));
    }
    return 0;
  }
};

}  // namespace primus_turbo::kernels::grouped_fp8
