// Block-scaled FP8 GEMM for Hopper (sm_90a) from CUTLASS's FP8 blockwise-scaling collective:
// TMA loads, warp-specialized producer/consumer warpgroups, FP8 WGMMA accumulating one 128-deep K
// block at a time, then promoted into FP32 registers multiplied by that block's A and B scales (so
// block scaling costs no precision), persistent scheduler, TMA-store epilogue D = acc + beta * D.
//
// One instantiation is one (A/B/D dtypes, scale granularity of A and B, tile, cluster, schedule)
// point. Scale granularity 1 row = 1x128 blocks (activations, gradients); 128 rows = 128x128
// blocks (weights).
#pragma once

#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "primus_turbo/kernels/gemm/cutlass_gemm_common.cuh"
#include "primus_turbo/kernels/gemm/gemm_fp8_abi.h"

namespace primus_turbo::kernels {

struct Fp8Cooperative {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct Fp8Pingpong {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

template <class ElementA, class ElementB, class ElementD, int kScaleRowsA, int kScaleRowsB,
          int kTileM, int kTileN, int kClusterM, int kClusterN, class Schedule>
struct CutlassGemmFp8Sm90 {
  static constexpr int kTileK = 128;
  static constexpr int kBlockK = 128;  // K depth of one scale
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;     // A [m, k], K-major
  using LayoutB = cutlass::layout::ColumnMajor;  // B^T seen as [k, n] with K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;

  // Per-row scales are read rows-contiguous (MN-major); per-128-row scales K-block-contiguous.
  static constexpr auto kMajorA = kScaleRowsA == 1 ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  static constexpr auto kMajorB = kScaleRowsB == 1 ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<kScaleRowsA, kScaleRowsB, kBlockK,
                                                                 kMajorA, kMajorB>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      ElementD, LayoutD, kAlignD, ElementD, LayoutD, kAlignD,
      typename Schedule::Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA,
      cute::tuple<LayoutA, LayoutSFA>, kAlignAB, ElementB, cute::tuple<LayoutB, LayoutSFB>,
      kAlignAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Schedule::Kernel>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                           CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // The scale layout of `rows` x k with the caller's leading dimension (padded for 16-byte TMA rows).
  // The contiguous extent is padded too, to whole 16-byte units within ld: CUTLASS refuses a scale
  // tensor whose contiguous extent is not a multiple of 4 floats (e.g. 15 rows of 1x128 scales).
  // The padded entries are never applied: rows past m and K blocks past k are not computed.
  template <class Layout, int kRows, bool kRowsMajor>
  static Layout scale_layout(int rows, int k, int64_t ld) {
    using namespace cute;
    const int32_t l = static_cast<int32_t>(ld);
    const auto pad4 = [l](int32_t n) { return (n + 3) / 4 * 4 <= l ? (n + 3) / 4 * 4 : n; };
    int32_t row_blocks = (rows + kRows - 1) / kRows, k_blocks = (k + kBlockK - 1) / kBlockK;
    if constexpr (kRowsMajor) {
      row_blocks = pad4(row_blocks);
    } else {
      k_blocks = pad4(k_blocks);
    }
    auto shape = make_shape(make_shape(Int<kRows>{}, row_blocks), make_shape(Int<kBlockK>{}, k_blocks), 1);
    if constexpr (kRowsMajor) {
      return make_layout(shape, make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, l), l * k_blocks));
    } else {
      return make_layout(shape, make_stride(make_stride(_0{}, l), make_stride(_0{}, _1{}), l * row_blocks));
    }
  }

  static typename Gemm::Arguments make_arguments(const PtGemmFp8Params& p) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    // A, B K-major and D row-major: the dynamic mode of each stride is its row stride.
    static_assert(!cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(StrideA{}))>>::value &&
                  !cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(StrideB{}))>>::value &&
                  !cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(StrideD{}))>>::value);
    const StrideA sa = leading_stride<StrideA>(p.lda);
    const StrideB sb = leading_stride<StrideB>(p.ldb);
    const StrideD sd = leading_stride<StrideD>(p.ldd);
    auto* d = static_cast<ElementD*>(p.d);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const ElementA*>(p.a), sa, static_cast<const ElementB*>(p.b), sb, p.sfa,
         scale_layout<LayoutSFA, kScaleRowsA, kScaleRowsA == 1>(m, k, p.sfa_ld), p.sfb,
         scale_layout<LayoutSFB, kScaleRowsB, kScaleRowsB == 1>(n, k, p.sfb_ld)},
        {{1.0f, p.beta}, d, sd, d, sd},
        hardware_info(p.device, p.num_sms)};
    return args;
  }

  static int run(const PtGemmFp8Params* p, char* err, size_t err_len) {
    Gemm gemm;
    auto args = make_arguments(*p);
    if (check_gemm(gemm, args, p->workspace_bytes, "FP8 GEMM", err, err_len)) return 1;
    auto stream = static_cast<cudaStream_t>(p->stream);
    const cutlass::Status status = initialize_and_run<Gemm>(args, p->workspace, stream);
    const cudaError_t launch = cudaGetLastError();
    if (status != cutlass::Status::kSuccess || launch != cudaSuccess) {
      std::snprintf(err, err_len, "CUTLASS FP8 launch failed: %s (%s)",
                    cutlassGetStatusString(status), cudaGetErrorString(launch));
      return 1;
    }
    return 0;
  }
};

}  // namespace primus_turbo::kernels

// Exports Kernel::run as pt_gemm_fp8_run.
#define PT_JIT_EXPORT_GEMM_FP8(Kernel)                                                      \
  PT_JIT_EXPORT_ABI_VERSION                                                                 \
  extern "C" __attribute__((visibility("default"))) int pt_gemm_fp8_run(                    \
      const PtGemmFp8Params* params, char* err, size_t err_len) {                           \
    return Kernel::run(params, err, err_len);                                               \
  }
