// Dense GEMM for Hopper (sm_90a) composed from CUTLASS 3.x collectives:
// TMA loads, warp-specialized producer/consumer warpgroups, WGMMA, a persistent tile scheduler
// and a TMA-store epilogue computing D = alpha * acc + beta * D.
//
// One instantiation is one (dtype, layout, tile, cluster, schedule) point; the JIT runtime builds
// exactly the points the dispatcher asks for, so nothing here is compiled at install time.
#pragma once

#include "primus_turbo/kernels/gemm/cutlass_gemm_common.cuh"

namespace primus_turbo::kernels {

// Schedules: cooperative = both consumer warpgroups share one tile (large tiles, fewer tiles);
// ping-pong = each consumer warpgroup owns a tile and their epilogues overlap the other's MMA.
struct Cooperative {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct Pingpong {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

template <class ElementAB, class ElementD, class LayoutA, class LayoutB, int kTileM, int kTileN,
          int kTileK, int kClusterM, int kClusterN, class Schedule>
struct CutlassGemmSm90 {
  using ElementAccumulator = float;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;

  // C and D are the same tensor: beta != 0 accumulates in place (e.g. into an fp32 main_grad).
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      ElementD, LayoutD, kAlignD, ElementD, LayoutD, kAlignD,
      typename Schedule::Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA, kAlignAB,
      ElementAB, LayoutB, kAlignAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Schedule::Kernel>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                           CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static typename Gemm::Arguments make_arguments(const PtGemmParams& p) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    auto* d = static_cast<ElementD*>(p.d);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), 1},
        {static_cast<const ElementAB*>(p.a), leading_stride<StrideA>(p.lda),
         static_cast<const ElementAB*>(p.b), leading_stride<StrideB>(p.ldb)},
        {{p.alpha, p.beta}, d, leading_stride<StrideD>(p.ldd), d,
         leading_stride<StrideD>(p.ldd)},
        hardware_info(p.device, p.num_sms)};
    if (p.swizzle > 1) args.scheduler.max_swizzle_size = p.swizzle;
    return args;
  }

  static int workspace(const PtGemmParams* p, size_t* bytes, char* err, size_t err_len) {
    *bytes = Gemm::get_workspace_size(make_arguments(*p));
    (void)err;
    (void)err_len;
    return 0;
  }

  static int run(const PtGemmParams* p, char* err, size_t err_len) {
    Gemm gemm;
    auto args = make_arguments(*p);
    if (check_gemm(gemm, args, p->workspace_bytes, "problem", err, err_len)) return 1;
    auto stream = static_cast<cudaStream_t>(p->stream);
    const cutlass::Status status = initialize_and_run<Gemm>(args, p->workspace, stream);
    if (status != cutlass::Status::kSuccess) {
      cudaError_t last = cudaGetLastError();
      std::snprintf(err, err_len, "CUTLASS launch failed: %s (%s)", cutlassGetStatusString(status),
                    cudaGetErrorString(last));
      return 1;
    }
    cudaError_t launch = cudaGetLastError();
    if (launch != cudaSuccess) {
      std::snprintf(err, err_len, "kernel launch failed: %s", cudaGetErrorString(launch));
      return 1;
    }
    return 0;
  }
};

}  // namespace primus_turbo::kernels
