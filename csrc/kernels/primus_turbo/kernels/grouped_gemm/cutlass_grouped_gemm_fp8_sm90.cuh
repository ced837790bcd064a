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

#include <algorithm>
#include <cstdio>

#include <cub/block/block_scan.cuh>

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

namespace primus_turbo::kernels::grouped_fp8 {

constexpr int kBlockK = 128;     // K depth of one scale
constexpr int kSetupThreads = 256;

// Per-group arguments written by the setup kernel (arrays of num_groups entries).
template <class Shape, class ElementA, class ElementB, class ElementD, class StrideA,
          class StrideB, class StrideD>
struct Fp8GroupArrays {
  Shape* shapes;
  const ElementA** ptr_a;
  const ElementB** ptr_b;
  ElementD** ptr_d;
  const float** ptr_sfa;
  const float** ptr_sfb;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;

  static size_t align(size_t x) { return (x + 255) & ~size_t(255); }
  static size_t bytes(int64_t g) {
    return align(g * sizeof(Shape)) + 5 * align(g * sizeof(void*)) + align(g * sizeof(StrideA)) +
           align(g * sizeof(StrideB)) + align(g * sizeof(StrideD));
  }
  static Fp8GroupArrays carve(void* base, int64_t g) {
    auto* p = static_cast<char*>(base);
    auto take = [&](size_t n) {
      char* r = p;
      p += align(n);
      return r;
    };
    Fp8GroupArrays r;
    r.shapes = reinterpret_cast<Shape*>(take(g * sizeof(Shape)));
    r.ptr_a = reinterpret_cast<const ElementA**>(take(g * sizeof(void*)));
    r.ptr_b = reinterpret_cast<const ElementB**>(take(g * sizeof(void*)));
    r.ptr_d = reinterpret_cast<ElementD**>(take(g * sizeof(void*)));
    r.ptr_sfa = reinterpret_cast<const float**>(take(g * sizeof(void*)));
    r.ptr_sfb = reinterpret_cast<const float**>(take(g * sizeof(void*)));
    r.stride_a = reinterpret_cast<StrideA*>(take(g * sizeof(StrideA)));
    r.stride_b = reinterpret_cast<StrideB*>(take(g * sizeof(StrideB)));
    r.stride_d = reinterpret_cast<StrideD*>(take(g * sizeof(StrideD)));
    return r;
  }
};

// A rank-3 CuTe stride (M|N, K, L) of a K-major operand: its one dynamic mode is the row stride.
template <class Stride>
__host__ __device__ Stride row_stride(int64_t ld) {
  Stride s{};
  cute::get<0>(s) = ld;
  return s;
}

// One block. Starts from group_offs, else an exclusive prefix sum of the (negative -> 0) lengths;
// every group clamped into [0, rows) so that sizes that do not add up never address memory
// outside the operands. b_scale_rows: scale rows per expert in sfb.
template <class Arrays, class ElementA, class ElementB, class ElementD>
__global__ void __launch_bounds__(kSetupThreads)
    setup_fp8_groups(Arrays out, const int64_t* __restrict__ group_lens,
                     const int64_t* __restrict__ group_offs, int64_t num_groups, int64_t rows,
                     int n, int k, int64_t b_scale_rows, const ElementA* a, const float* sfa,
                     const ElementB* b, const float* sfb, ElementD* d) {
  using Scan = cub::BlockScan<int64_t, kSetupThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int64_t kb = (k + kBlockK - 1) / kBlockK;
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
      out.shapes[g] = {static_cast<int>(len), n, k};
      out.ptr_a[g] = a + start * k;
      out.ptr_b[g] = b + g * int64_t(n) * k;
      out.ptr_d[g] = d + start * n;
      out.ptr_sfa[g] = sfa + start * kb;
      out.ptr_sfb[g] = sfb + g * b_scale_rows * kb;
      out.stride_a[g] = row_stride<cute::remove_cvref_t<decltype(out.stride_a[g])>>(k);
      out.stride_b[g] = row_stride<cute::remove_cvref_t<decltype(out.stride_b[g])>>(k);
      out.stride_d[g] = row_stride<cute::remove_cvref_t<decltype(out.stride_d[g])>>(n);
    }
    carry += total;
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
  using Scan = cub::BlockScan<int64_t, kSetupThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  int64_t carry = 0, padded_carry = 0;
  for (int64_t base = 0; base < num_groups; base += kSetupThreads) {
    const int64_t g = base + threadIdx.x;
    const int64_t raw = g < num_groups ? group_lens[g] : 0;
    const int64_t len_in = raw > 0 ? raw : 0;
    int64_t prefix, total;
    Scan(scan_storage).ExclusiveSum(len_in, prefix, total);
    __syncthreads();
    int64_t len = 0;
    if (g < num_groups) {
      int64_t start = group_offs ? group_offs[g] : carry + prefix;
      start = start < 0 ? 0 : (start > rows ? rows : start);
      len = len_in < rows - start ? len_in : rows - start;
    }
    const int64_t plen = (len + kBlockK - 1) / kBlockK * kBlockK;
    int64_t pprefix, ptotal;
    Scan(scan_storage).ExclusiveSum(plen, pprefix, ptotal);
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
      out.stride_a[g] = row_stride<cute::remove_cvref_t<decltype(out.stride_a[g])>>(ld);
      out.stride_b[g] = row_stride<cute::remove_cvref_t<decltype(out.stride_b[g])>>(ld);
      out.stride_d[g] = row_stride<cute::remove_cvref_t<decltype(out.stride_d[g])>>(n);
    }
    carry += total;
    padded_carry += ptotal;
  }
}

// d[g] = 0 for every group whose reduction is empty, in 16-byte stores. Grid (chunks, groups).
template <class Shape>
__global__ void zero_empty_fp8_groups(const Shape* __restrict__ shapes, uint4* d, int64_t group_vecs) {
  const int64_t g = blockIdx.y;
  if (cute::get<2>(shapes[g]) != 0) return;
  uint4* dst = d + g * group_vecs;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < group_vecs;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = make_uint4(0, 0, 0, 0);
  }
}

// kWgrad: the reduction split above, both operands' scales 1x128 along the tokens (MN-major, so a
// group's slice of them is a valid layout whatever its length); kScaleRowsB must be 1.
template <class ElementA_, class ElementB_, class ElementD_, int kScaleRowsB, int kTileM,
          int kTileN, int kClusterM, int kClusterN, bool kWgrad = false>
struct CutlassGroupedGemmFp8Sm90 {
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
  using Arrays = Fp8GroupArrays<typename ProblemShape::UnderlyingProblemShape, ElementA, ElementB,
                                ElementD, StrideA, StrideB, StrideD>;

  static typename Gemm::Arguments make_arguments(const PtGroupedGemmFp8Params& p,
                                                 const Arrays& arr) {
    cutlass::KernelHardwareInfo hw_info;
    hw_info.device_id = p.device;
    hw_info.sm_count = p.num_sms > 0
                           ? p.num_sms
                           : cutlass::KernelHardwareInfo::query_device_multiprocessor_count(p.device);
    // The collective derives each group's scale layouts from its problem shape; the layout
    // arguments are not read in grouped mode.
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {static_cast<int>(p.num_groups), arr.shapes, nullptr},  // sizes: device only
        {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b, arr.ptr_sfa, nullptr, arr.ptr_sfb,
         nullptr},
        {{}, nullptr, arr.stride_d, arr.ptr_d, arr.stride_d},
        hw_info};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    return args;
  }

  static size_t cutlass_workspace(const PtGroupedGemmFp8Params& p) {
    Arrays none{};
    return Gemm::get_workspace_size(make_arguments(p, none));
  }
  static int workspace(const PtGroupedGemmFp8Params* p, size_t* bytes, char*, size_t) {
    *bytes = Arrays::bytes(p->num_groups) + Arrays::align(cutlass_workspace(*p));
    return 0;
  }

  static int run(const PtGroupedGemmFp8Params* p, char* err, size_t err_len) {
    const size_t array_bytes = Arrays::bytes(p->num_groups);
    const size_t needed = array_bytes + Arrays::align(cutlass_workspace(*p));
    if (needed > p->workspace_bytes) {
      std::snprintf(err, err_len, "workspace too small: need %zu bytes, have %zu", needed,
                    p->workspace_bytes);
      return 1;
    }
    auto stream = static_cast<cudaStream_t>(p->stream);
    Arrays arr = Arrays::carve(p->workspace, p->num_groups);
    if constexpr (kWgrad) {
      if (!p->wgrad) {
        std::snprintf(err, err_len, "this module is the wgrad (reduction split) kernel");
        return 1;
      }
      setup_fp8_wgrad_groups<<<1, kSetupThreads, 0, stream>>>(
          arr, p->group_lens, p->group_offs, p->num_groups, p->rows, int(p->m), int(p->n), p->ld,
          static_cast<const ElementA*>(p->a), p->sfa, static_cast<const ElementB*>(p->b), p->sfb,
          static_cast<ElementD*>(p->d));
      const int64_t vecs = p->m * p->n * int64_t(sizeof(ElementD)) / 16;
      const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(128, (vecs + 255) / 256));
      zero_empty_fp8_groups<<<dim3(unsigned(chunks), unsigned(p->num_groups)), 256, 0, stream>>>(
          arr.shapes, static_cast<uint4*>(p->d), vecs);
    } else {
      if (p->wgrad) {
        std::snprintf(err, err_len, "this module is the forward (row split) kernel");
        return 1;
      }
      const int64_t b_scale_rows = (p->n + kScaleRowsB - 1) / kScaleRowsB;
      setup_fp8_groups<<<1, kSetupThreads, 0, stream>>>(
          arr, p->group_lens, p->group_offs, p->num_groups, p->rows, int(p->n), int(p->k),
          b_scale_rows, static_cast<const ElementA*>(p->a), p->sfa,
          static_cast<const ElementB*>(p->b), p->sfb, static_cast<ElementD*>(p->d));
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
      std::snprintf(err, err_len, "CUTLASS cannot implement this FP8 grouped problem: %s",
                    cutlassGetStatusString(status));
      return 1;
    }
    status = gemm.initialize(args, static_cast<char*>(p->workspace) + array_bytes, stream);
    if (status == cutlass::Status::kSuccess) status = gemm.run(stream);
    cudaError_t launch = cudaGetLastError();
    if (status != cutlass::Status::kSuccess || launch != cudaSuccess) {
      std::snprintf(err, err_len, "CUTLASS FP8 grouped launch failed: %s (%s)",
                    cutlassGetStatusString(status), cudaGetErrorString(launch));
      return 1;
    }
    return 0;
  }
};

}  // namespace primus_turbo::kernels::grouped_fp8
