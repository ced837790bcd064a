// C API entry points of quantization: checks, then (tensorwise / rowwise) the device amax, then
// the tile kernel; dequantization.
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/quantization/quant_kernels.h"
#include "ops/quantization/quant_problem.h"
#include "runtime/device.h"  // arch_for_device, device_info

using namespace primus_turbo;
using namespace primus_turbo::quant;

namespace {

bool is_float_dtype(int32_t dt) { return dt == PT_FLOAT32 || dt == PT_FLOAT16 || dt == PT_BFLOAT16; }

std::string arch_of_current_device(int* device) {
  *device = current_device();
  bind_device_context(*device);
  return arch_for_device(*device);
}

}  // namespace

extern "C" {

pt_status pt_quantize(const pt_tensor* x, pt_tensor* q_row, pt_tensor* s_row, pt_tensor* q_col, pt_tensor* s_col,
                      int32_t granularity, int32_t block_size, int32_t col_transposed, int32_t flags, uint64_t seed,
                      void* workspace, size_t ws_bytes, void* stream) {
  return api_guard([&] {
    const QuantProblem p =
        make_quant_problem(x, q_row, s_row, q_col, s_col, granularity, block_size, col_transposed, flags);
    // A row-only rowwise quantization reduces each row's amax inside its kernel: no workspace.
    const bool inline_row_amax = p.granularity == PT_QUANT_ROWWISE && p.row && !p.col && !p.rht && !p.fp4();
    const size_t need = inline_row_amax ? 0 : workspace_bytes(p.m, p.k, p.granularity);
    PT_CHECK_ARG(ws_bytes >= need, "argument 'workspace' has ", ws_bytes, " bytes; this problem needs ", need,
                 " (pt_quantize_workspace_bytes)");
    PT_CHECK_ARG(need == 0 || (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0),
                 "argument 'workspace' must be a non-null, 16-byte aligned pointer");
    if (p.m == 0 || p.k == 0) return;
    int device = 0;
    const std::string arch = arch_of_current_device(&device);
    const Kernels kern = load_kernels(p.x_dtype, p.q_dtype, arch);
    auto s = static_cast<cudaStream_t>(stream);
    char err[1024] = {0};

    PtQuantParams qp{};
    qp.m = p.m;
    qp.k = p.k;
    qp.x = x->data;
    qp.q_row = p.row ? q_row->data : nullptr;
    qp.s_row = p.row ? s_row->data : nullptr;
    qp.q_col = p.col ? q_col->data : nullptr;
    qp.s_col = p.col ? s_col->data : nullptr;
    qp.col_transposed = p.col_transposed;
    qp.row_block = p.block;
    qp.col_block = p.block;
    qp.block_2d = p.block_2d;
    qp.e8m0 = p.granularity == PT_QUANT_MX_BLOCKWISE;
    qp.rht = p.rht;
    qp.sr = p.sr;
    qp.seed = seed;
    qp.stream = stream;
    qp.num_sms = device_info(device).sm_count;
    if (p.mn_major) {
      // GEMM layout: [blocks, round_up(rows, 4)]; the kernel writes the real rows, the padding is
      // zeroed here (a strided memset, only when a row count is not a multiple of 4).
      const int64_t ld_row = (p.m + 3) / 4 * 4, ld_col = (p.k + 3) / 4 * 4;
      qp.s_row_ld_mn = p.row ? ld_row : 0;
      qp.s_col_ld_mn = p.col ? ld_col : 0;
      const auto zero_pad = [&](void* scales, int64_t rows, int64_t ld, int64_t blocks) {
        if (rows == ld) return;
        PT_CHECK_CUDA(cudaMemset2DAsync(static_cast<float*>(scales) + rows, ld * sizeof(float), 0,
                                        (ld - rows) * sizeof(float), blocks, s));
      };
      if (p.row) zero_pad(s_row->data, p.m, ld_row, (p.k + p.block - 1) / p.block);
      if (p.col) zero_pad(s_col->data, p.k, ld_col, (p.m + p.block - 1) / p.block);
    }

    if (inline_row_amax) {
      // Row output only: each row's amax inside the quantize kernel (one launch, one DRAM read).
      qp.row_amax_inline = 1;
      qp.row_block = qp.col_block = 0;
    } else if (p.granularity == PT_QUANT_TENSORWISE || p.granularity == PT_QUANT_ROWWISE) {
      // Device-side amax first; the quantize kernel reads it (no host round trip).
      PT_CHECK_CUDA(cudaMemsetAsync(workspace, 0, need, s));
      float* ws = static_cast<float*>(workspace);
      PtQuantAmaxParams ap{};
      ap.m = p.m;
      ap.k = p.k;
      ap.x = x->data;
      ap.stream = stream;
      ap.num_sms = qp.num_sms;
      if (p.granularity == PT_QUANT_TENSORWISE) {
        ap.amax_tensor = ws;
        qp.amax_row = qp.amax_col = ws;
      } else {
        ap.amax_rows = p.row ? ws : nullptr;
        ap.amax_cols = p.col ? ws + p.m : nullptr;
        qp.amax_row = ws;
        qp.amax_col = ws + p.m;
        qp.amax_row_per_row = 1;
        qp.amax_col_per_col = 1;
      }
      if (kern.amax(&ap, err, sizeof(err)) != 0) {
        PT_THROW(PT_ERROR_CUDA, "quantization amax (", p.m, " x ", p.k, ", ", dtype_name(p.x_dtype),
                 ") failed: ", err);
      }
      qp.row_block = qp.col_block = 0;
    }
    if (kern.quantize(&qp, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "quantization (", p.m, " x ", p.k, ", ", dtype_name(p.x_dtype), " -> ",
               dtype_name(p.q_dtype), ") failed: ", err);
    }
  });
}

size_t pt_quantize_workspace_bytes(int64_t m, int64_t k, int32_t granularity) {
  return workspace_bytes(m, k, granularity);
}

pt_status pt_dequantize(const pt_tensor* q, const pt_tensor* scale_inv, pt_tensor* out, int32_t granularity,
                        int32_t block_size, int32_t axis, int32_t flags, void* stream) {
  return api_guard([&] {
    const DequantProblem p = make_dequant_problem(q, scale_inv, out, granularity, block_size, axis, flags);
    if (p.m == 0 || p.k == 0) return;
    int device = 0;
    const std::string arch = arch_of_current_device(&device);
    const Kernels kern = load_kernels(p.out_dtype, p.q_dtype, arch);
    PtDequantParams dp{};
    dp.m = p.m;
    dp.k = p.k;
    dp.q = q->data;
    dp.s = scale_inv->data;
    dp.out = out->data;
    dp.block_m = p.block_m;
    dp.block_k = p.block_k;
    dp.ld_s = p.ld_s;
    dp.e8m0 = p.e8m0;
    dp.stream = stream;
    char err[1024] = {0};
    if (kern.dequantize(&dp, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "dequantization (", p.m, " x ", p.k, ", ", dtype_name(p.q_dtype), " -> ",
               dtype_name(p.out_dtype), ") failed: ", err);
    }
  });
}

pt_status pt_quantize_prepare(int32_t x_dtype, int32_t q_dtype) {
  return api_guard([&] {
    PT_CHECK_ARG(is_float_dtype(x_dtype), "argument 'x_dtype' is ", dtype_name(x_dtype),
                 "; expected float32, float16 or bfloat16");
    const int32_t q = q_dtype == PT_UINT8 ? PT_FLOAT4_E2M1_X2 : q_dtype;
    PT_CHECK_ARG(q == PT_FLOAT8_E4M3 || q == PT_FLOAT8_E5M2 || q == PT_FLOAT4_E2M1_X2, "argument 'q_dtype' is ",
                 dtype_name(q_dtype), "; expected float8_e4m3fn, float8_e5m2 or float4_e2m1fn_x2");
    load_kernels(x_dtype, q, "90a");
  });
}

}  // extern "C"
