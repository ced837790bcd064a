// MX -> 1x128 block restatement (pt_mx_to_blocks): argument checks, the JIT module (one per input
// format), the launch. See kernels/gemm/mx_to_blocks.cuh and primus_turbo/gemm_mx.h.
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "primus_turbo/gemm_mx.h"
#include "primus_turbo/kernels/gemm/mx_blocks_abi.h"
#include "runtime/device.h"
#include "runtime/jit_runtime.h"

using namespace primus_turbo;

namespace {

// 0: E4M3, 1: E5M2, 2: packed FP4 (the kernel's Format).
int format_of(int32_t q_dtype) {
  switch (q_dtype) {
    case PT_FLOAT8_E4M3: return 0;
    case PT_FLOAT8_E5M2: return 1;
    case PT_FLOAT4_E2M1_X2:
    case PT_UINT8: return 2;
    default:
      PT_THROW(PT_ERROR_INVALID_ARGUMENT, "argument 'q' has dtype ", dtype_name(q_dtype),
               "; expected float8_e4m3, float8_e5m2 or packed float4_e2m1_x2 (uint8)");
  }
}

PtMxBlocksFn load_kernel(int format, const std::string& arch) {
  static std::mutex mutex;
  static std::map<std::pair<int, std::string>, PtMxBlocksFn> loaded;
  const auto key = std::make_pair(format, arch);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = loaded.find(key);
    if (it != loaded.end()) return it->second;
  }
  static const char* const kNames[] = {"e4m3", "e5m2", "fp4"};
  jit::ModuleRequest r;
  r.name = str_cat("mx_to_blocks_", kNames[format]);
  r.needs_cutlass = false;
  r.arch = arch;
  r.source = str_cat("#include \"primus_turbo/kernels/gemm/mx_to_blocks.cuh\"\n"
                     "using Kernel = primus_turbo::kernels::mx_blocks::MxToBlocks<", format, ">;\n"
                     "PT_JIT_EXPORT_MX_BLOCKS(Kernel)\n");
  auto module = jit::get_module(r);  // may compile: not under the lock
  PtMxBlocksFn fn = module->function<PtMxBlocksFn>("pt_mx_blocks_run");
  std::lock_guard<std::mutex> lock(mutex);
  loaded.emplace(key, fn);
  return fn;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

extern "C" {

namespace {

// pt_mx_to_blocks and its blocks-major variant: scale_out [rows, kb] or [kb, round_up(rows, 4)].
void mx_to_blocks(const pt_tensor* q, const pt_tensor* scale, pt_tensor* q_out, pt_tensor* scale_out, bool mn_major,
                  void* stream) {
  {
    check_contiguous(q, "q");
    check_contiguous(scale, "scale");
    check_contiguous(q_out, "q_out");
    check_contiguous(scale_out, "scale_out");
    PT_CHECK_ARG(q->ndim == 2, "argument 'q' must be 2-D, got ", shape_string(*q));
    const int format = format_of(q->dtype);
    const int64_t rows = q->shape[0];
    const int64_t k = format == 2 ? 2 * q->shape[1] : q->shape[1];
    PT_CHECK_ARG(k % 16 == 0, "argument 'q' holds k = ", k, " values a row; k must be a multiple of 16");
    const int64_t kb32 = cdiv(k, 32);
    PT_CHECK_ARG(scale->dtype == PT_FLOAT8_E8M0 || scale->dtype == PT_UINT8, "argument 'scale' has dtype ",
                 dtype_name(scale->dtype), "; expected float8_e8m0 (or uint8)");
    PT_CHECK_ARG(scale->ndim == 2 && scale->shape[1] == kb32 &&
                     (scale->shape[0] == rows || scale->shape[0] == cdiv(rows, 32)),
                 "argument 'scale' has shape ", shape_string(*scale), "; expected [", rows, ", ", kb32, "] or [",
                 cdiv(rows, 32), ", ", kb32, "]");
    const int32_t out_dtype = format == 2 ? PT_FLOAT8_E4M3 : q->dtype;
    PT_CHECK_ARG(q_out->ndim == 2 && q_out->shape[0] == rows && q_out->shape[1] == k && q_out->dtype == out_dtype,
                 "argument 'q_out' must be ", dtype_name(out_dtype), " [", rows, ", ", k, "], got ",
                 dtype_name(q_out->dtype), " ", shape_string(*q_out));
    const int64_t out_rows = mn_major ? cdiv(k, 128) : rows, out_cols = mn_major ? cdiv(rows, 4) * 4 : cdiv(k, 128);
    PT_CHECK_ARG(scale_out->ndim == 2 && scale_out->shape[0] == out_rows && scale_out->shape[1] == out_cols &&
                     scale_out->dtype == PT_FLOAT32,
                 "argument 'scale_out' must be float32 [", out_rows, ", ", out_cols, "], got ",
                 dtype_name(scale_out->dtype), " ", shape_string(*scale_out));
    if (rows == 0 || k == 0) return;
    PT_CHECK_ARG(aligned16(q->data) && aligned16(q_out->data), "arguments 'q' and 'q_out' must be 16-byte aligned");
    const int device = current_device();
    bind_device_context(device);
    const PtMxBlocksFn run = load_kernel(format, arch_for_device(device));
    PtMxBlocksParams params{};
    params.q = q->data;
    params.scale = static_cast<const uint8_t*>(scale->data);
    params.q_out = q_out->data;
    params.scale_out = static_cast<float*>(scale_out->data);
    params.rows = rows;
    params.k = k;
    params.kb32 = kb32;
    params.scale_row_div = scale->shape[0] == rows ? 1 : 32;
    params.stream = stream;
    if (mn_major) {
      params.scale_ld_mn = out_cols;
      if (out_cols != rows) {  // the padding rows of every block column read as zero scales
        PT_CHECK_CUDA(cudaMemset2DAsync(static_cast<float*>(scale_out->data) + rows, out_cols * sizeof(float), 0,
                                        (out_cols - rows) * sizeof(float), out_rows,
                                        static_cast<cudaStream_t>(stream)));
      }
    }
    char err[1024] = {0};
    if (run(&params, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "MX restatement (q ", shape_string(*q), ") failed: ", err);
    }
  }
}

}  // namespace

pt_status pt_mx_to_blocks(const pt_tensor* q, const pt_tensor* scale, pt_tensor* q_out, pt_tensor* scale_out,
                          void* stream) {
  return api_guard([&] { mx_to_blocks(q, scale, q_out, scale_out, false, stream); });
}

pt_status pt_mx_to_blocks_mn_major(const pt_tensor* q, const pt_tensor* scale, pt_tensor* q_out,
                                   pt_tensor* scale_out, void* stream) {
  return api_guard([&] { mx_to_blocks(q, scale, q_out, scale_out, true, stream); });
}

pt_status pt_mx_to_blocks_prepare(int32_t q_dtype) {
  return api_guard([&] { load_kernel(format_of(q_dtype), "90a"); });
}

}  // extern "C"
