// The quantization JIT module: Quantizer<T, F> picks the kernel for a request (16-bit input to FP8
// with 128-element blocks or a given amax: quantize_tile_regs.cuh; other row-only outputs:
// quantize_rows.cuh; other column, transposed or 2-D outputs: quantize_tile.cuh), and dequantizes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>

#include "primus_turbo/kernels/common/smem_opt_in.cuh"
#include "primus_turbo/kernels/common/warp.cuh"
#include "primus_turbo/kernels/jit_export.cuh"
#include "primus_turbo/kernels/quantization/quant_abi.h"
#include "primus_turbo/kernels/quantization/quant_formats.cuh"
#include "primus_turbo/kernels/quantization/quantize_batch.cuh"
#include "primus_turbo/kernels/quantization/quantize_rows.cuh"
#include "primus_turbo/kernels/quantization/quantize_tile.cuh"
#include "primus_turbo/kernels/quantization/quantize_tile_regs.cuh"

namespace primus_turbo::kernels::quant {

// Dequantization: a thread per 4 consecutive elements of a row; rows grid-strided.
template <class F, class O>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const PtDequantParams p) {
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * 4;
  if (c0 >= p.k) return;
  const uint8_t* q = static_cast<const uint8_t*>(p.q);
  O* out = static_cast<O*>(p.out);
  for (int64_t r = blockIdx.y; r < p.m; r += gridDim.y) {
    const int64_t srow = (r / p.block_m) * p.ld_s;
    for (int j = 0; j < 4 && c0 + j < p.k; ++j) {
      const int64_t c = c0 + j;
      uint8_t b;
      if constexpr (F::kFp4) {
        b = q[r * (p.k / 2) + c / 2];
        b = (c & 1) ? (b >> 4) : (b & 15);
      } else {
        b = q[r * p.k + c];
      }
      out[r * p.k + c] = from_float<O>(F::decode(b) * decode_scale(p.s, srow + c / p.block_k, p.e8m0));
    }
  }
}

inline dim3 tile_grid(int64_t m, int64_t k) {
  return dim3(static_cast<unsigned>((m + kTile - 1) / kTile), static_cast<unsigned>((k + kTile - 1) / kTile));
}

// Opts a tile kernel into its dynamic shared memory (above the 48 KiB default), once per device.
template <auto kKernel, size_t kBytes>
int reserve_smem(char* err, size_t err_len) {
  const cudaError_t e = opt_in_smem(kKernel, kBytes);
  if (e != cudaSuccess) {
    snprintf(err, err_len, "quantization: cannot reserve %zu bytes of shared memory: %s", kBytes, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

template <class T, class F, class S>
int launch_tile(const PtQuantParams* p, cudaStream_t stream, char* err, size_t err_len) {
  constexpr size_t bytes = tile_smem_bytes<S>();
  if (reserve_smem<quantize_tile_kernel<T, F, S>, bytes>(err, err_len)) return 1;
  quantize_tile_kernel<T, F, S><<<tile_grid(p->m, p->k), kThreads, bytes, stream>>>(*p);
  return report_launch("quantize", err, err_len);
}

// Launches a batch (quantize_batch.cuh): as many CTAs as can be resident at once (a grid barrier
// needs all of them), at most one per tile.
template <class T, class F>
int launch_batch(const PtQuantBatch* b, char* err, size_t err_len) {
  constexpr size_t bytes = tile_smem_bytes<T>();
  constexpr auto kernel = quantize_batch_kernel<T, F>;
  if (reserve_smem<kernel, bytes>(err, err_len)) return 1;
  static std::atomic<int> per_sm{0};  // resident CTAs an SM (one architecture in a process)
  if (per_sm.load(std::memory_order_acquire) == 0) {
    int n = 0;
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, bytes);
    if (e != cudaSuccess || n <= 0) {
      snprintf(err, err_len, "quantization: cannot size the cooperative launch: %s",
               e != cudaSuccess ? cudaGetErrorString(e) : "no CTA fits an SM");
      return 1;
    }
    per_sm.store(n, std::memory_order_release);
  }
  int64_t tiles = 0;
  for (int j = 0; j < b->count; ++j) tiles += tiles_of(b->jobs[j]);
  if (tiles == 0) return 0;
  const int64_t grid = std::min<int64_t>(tiles, int64_t{per_sm.load(std::memory_order_acquire)} * b->num_sms);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = bytes;
  config.stream = static_cast<cudaStream_t>(b->stream);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, *b);
  if (e != cudaSuccess) {
    snprintf(err, err_len, "quantization (batch of %d) launch failed: %s", b->count, cudaGetErrorString(e));
    return 1;
  }
  return report_launch("quantize (batch)", err, err_len);
}

// One module: input dtype T, quantized format F.
template <class T, class F>
struct Quantizer {
  static bool grid_too_large(int64_t m, int64_t k) {
    return (m + kTile - 1) / kTile > INT32_MAX || (k + kTile - 1) / kTile > 65535;
  }

  static int check_grid(int64_t m, int64_t k, char* err, size_t err_len) {
    if (grid_too_large(m, k)) {
      snprintf(err, err_len, "quantization: tensor [%lld, %lld] is too large for the tile grid",
               static_cast<long long>(m), static_cast<long long>(k));
      return 1;
    }
    return 0;
  }

  static int quantize(const PtQuantParams* p, char* err, size_t err_len) {
    if (p->m <= 0 || p->k <= 0) return 0;
    auto stream = static_cast<cudaStream_t>(p->stream);
    if (p->col_rows) {  // a stack's per-matrix column output: the register tile alone writes it
      if constexpr (sizeof(T) == 2 && !F::kFp4) {
        if (tile_regs_supported(*p, sizeof(T), F::kFp4) && launch_tile_regs<T, F>(*p, stream))
          return report_launch("quantize (register tile, stack)", err, err_len);
      }
      snprintf(err, err_len, "quantization: this stack of matrices (%lld rows each) has no kernel",
               static_cast<long long>(p->col_rows));
      return 1;
    }
    if constexpr (!F::kFp4) {
      if (p->row_amax_inline && p->q_col == nullptr && !p->block_2d && !p->rht) {
        if constexpr (sizeof(T) == 2) {
          if (launch_rowwise_regs<T, F>(*p, stream))
            return report_launch("quantize (rowwise, registers)", err, err_len);
        }
        const int64_t grid = std::min<int64_t>(p->m, int64_t{p->num_sms} * 16);
        quantize_rowwise_kernel<T, F><<<static_cast<unsigned>(grid), kRowThreads, 0, stream>>>(*p);
        return report_launch("quantize (rowwise)", err, err_len);
      }
    }
    if constexpr (sizeof(T) == 2 && !F::kFp4) {
      if (tile_regs_supported(*p, sizeof(T), F::kFp4) && launch_tile_regs<T, F>(*p, stream))
        return report_launch("quantize (register tile)", err, err_len);
    }
    if (p->q_col == nullptr && !p->block_2d) {
      // A few resident waves of blocks that walk the rows (grid-stride): a warp's setup (divisions,
      // scale strides) is paid once for many chunks instead of once per two.
      const int64_t chunks = p->m * ((p->k + kRowChunk - 1) / kRowChunk);
      const int64_t grid = std::min<int64_t>((chunks + 8 * kRowUnroll - 1) / (8 * kRowUnroll), int64_t{p->num_sms} * 8);
      quantize_rows_kernel<T, F><<<static_cast<unsigned>(grid), kRowThreads, 0, stream>>>(*p);
      return report_launch("quantize (rows)", err, err_len);
    }
    if (check_grid(p->m, p->k, err, err_len)) return 1;
    if (sizeof(T) == 4 || p->rht) return launch_tile<T, F, float>(p, stream, err, err_len);
    return launch_tile<T, F, T>(p, stream, err, err_len);
  }

  static int amax(const PtQuantAmaxParams* p, char* err, size_t err_len) {
    if (p->m <= 0 || p->k <= 0) return 0;
    auto stream = static_cast<cudaStream_t>(p->stream);
    if constexpr (sizeof(T) == 2) {
      if (amax_regs_supported(*p, sizeof(T)) && launch_amax_regs<T>(*p, stream))
        return report_launch("amax (register tile)", err, err_len);
    }
    if (p->col_rows && p->amax_cols) {  // per-matrix column maxima: the register tile alone
      snprintf(err, err_len, "quantization amax: this stack of matrices (%lld rows each) has no kernel",
               static_cast<long long>(p->col_rows));
      return 1;
    }
    if (p->amax_cols == nullptr) {
      const int64_t chunks = p->m * ((p->k + kRowChunk - 1) / kRowChunk);
      // Enough blocks to fill the GPU; each warp then walks many chunks (fewer atomics).
      const int64_t grid = std::min<int64_t>((chunks + 8 * kRowUnroll - 1) / (8 * kRowUnroll), int64_t{p->num_sms} * 8);
      amax_rows_kernel<T><<<static_cast<unsigned>(grid), kRowThreads, 0, stream>>>(*p);
      return report_launch("amax (rows)", err, err_len);
    }
    if (check_grid(p->m, p->k, err, err_len)) return 1;
    constexpr size_t bytes = tile_smem_bytes<T>();
    if (reserve_smem<amax_tile_kernel<T>, bytes>(err, err_len)) return 1;
    amax_tile_kernel<T><<<tile_grid(p->m, p->k), kThreads, bytes, stream>>>(*p);
    return report_launch("amax", err, err_len);
  }

  // FP8 jobs of this module's dtype and format in one cooperative launch (quantize_batch.cuh).
  static int batch(const PtQuantBatch* b, char* err, size_t err_len) {
    if constexpr (F::kFp4) {
      snprintf(err, err_len, "quantization: FP4 has no batched launch");
      return 1;
    } else {
      for (int j = 0; j < b->count; ++j) {
        if (check_grid(b->jobs[j].m, b->jobs[j].k, err, err_len)) return 1;
      }
      return launch_batch<T, F>(b, err, err_len);
    }
  }

  static int dequantize(const PtDequantParams* p, char* err, size_t err_len) {
    if (p->m <= 0 || p->k <= 0) return 0;
    const int64_t gx = (p->k + 4 * kThreads - 1) / (4 * kThreads);
    if (gx > INT32_MAX) {
      snprintf(err, err_len, "dequantize: last dimension %lld is too large", static_cast<long long>(p->k));
      return 1;
    }
    const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(p->m < 65535 ? p->m : 65535));
    dequantize_kernel<F, T><<<grid, kThreads, 0, static_cast<cudaStream_t>(p->stream)>>>(*p);
    return report_launch("dequantize", err, err_len);
  }
};

}  // namespace primus_turbo::kernels::quant

// Exports Quantizer<T, F>'s entry points as pt_quantize_run / pt_quant_amax_run / pt_dequantize_run /
// pt_quantize_batch_run.
#define PT_JIT_EXPORT_QUANTIZER(Kernel)                                                       \
  PT_JIT_EXPORT_ABI_VERSION                                                                   \
  extern "C" __attribute__((visibility("default"))) int pt_quantize_run(                      \
      const PtQuantParams* params, char* err, size_t err_len) {                               \
    return Kernel::quantize(params, err, err_len);                                            \
  }                                                                                           \
  extern "C" __attribute__((visibility("default"))) int pt_quant_amax_run(                    \
      const PtQuantAmaxParams* params, char* err, size_t err_len) {                           \
    return Kernel::amax(params, err, err_len);                                                \
  }                                                                                           \
  extern "C" __attribute__((visibility("default"))) int pt_dequantize_run(                    \
      const PtDequantParams* params, char* err, size_t err_len) {                             \
    return Kernel::dequantize(params, err, err_len);                                          \
  }                                                                                           \
  extern "C" __attribute__((visibility("default"))) int pt_quantize_batch_run(                \
      const PtQuantBatch* batch, char* err, size_t err_len) {                                 \
    return Kernel::batch(batch, err, err_len);                                                \
  }
