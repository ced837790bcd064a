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

std::string arch_of_current_device(int* device) {
  *device = current_device();
  bind_device_context(*device);
  return arch_for_device(*device);
}

// The kernel parameters of problem p on its tensors; amax sources and block sizes as the separate
// path sets them (block scales from the tile; tensorwise / rowwise: the caller points amax_*).
PtQuantParams kernel_params(const QuantProblem& p, const pt_tensor* x, pt_tensor* q_row, pt_tensor* s_row,
                            pt_tensor* q_col, pt_tensor* s_col, uint64_t seed, void* stream, int num_sms) {
  PtQuantParams qp{};
  qp.m = p.m;
  qp.k = p.k;
  qp.x = x->data;
  qp.q_row = p.row ? q_row->data : nullptr;
  qp.s_row = p.row ? s_row->data : nullptr;
  qp.q_col = p.col ? q_col->data : nullptr;
  qp.s_col = p.col ? s_col->data : nullptr;
  qp.col_transposed = p.col_transposed;
  qp.col_rows = p.col ? p.col_rows : 0;
  qp.row_block = p.block;
  qp.col_block = p.block;
  qp.block_2d = p.block_2d;
  qp.e8m0 = p.granularity == PT_QUANT_MX_BLOCKWISE;
  qp.rht = p.rht;
  qp.sr = p.sr;
  qp.seed = seed;
  qp.stream = stream;
  qp.num_sms = num_sms;
  if (p.mn_major) {
    // GEMM layout: [blocks, round_up(rows, 4)]; the kernel writes the real rows.
    qp.s_row_ld_mn = p.row ? (p.m + 3) / 4 * 4 : 0;
    qp.s_col_ld_mn = p.col ? (p.k + 3) / 4 * 4 : 0;
  }
  if (p.pad4) {
    // GEMM layout of 2-D block scales: the block count along the last dim rounded up to 4; the
    // kernel zeroes the padding.
    const int64_t kb = (p.k + p.block - 1) / p.block, mb = (p.m + p.block - 1) / p.block;
    qp.s_row_ld_2d = p.row ? (kb + 3) / 4 * 4 : 0;
    qp.s_col_ld_2d = p.col ? (mb + 3) / 4 * 4 : 0;
  }
  return qp;
}

// Whether p's scales come from a device-wide amax reduced before the quantize pass.
bool needs_amax_pass(const QuantProblem& p) {
  const bool inline_row_amax = p.granularity == PT_QUANT_ROWWISE && p.row && !p.col && !p.rht && !p.fp4();
  return (p.granularity == PT_QUANT_TENSORWISE || p.granularity == PT_QUANT_ROWWISE) && !inline_row_amax;
}

// The separate path: memsets, the amax launch where needed, the quantize launch. given_amax
// (tensorwise): x's amax reduced beforehand, read instead of an amax pass. zeroed: the caller
// cleared the amax workspace already (one memset for several jobs).
void quantize_one(const QuantProblem& p, const Kernels& kern, PtQuantParams qp, void* workspace, size_t need,
                  cudaStream_t s, const float* given_amax = nullptr, bool zeroed = false) {
  char err[1024] = {0};
  if (p.mn_major) {
    // The padding rows of the blocks-major scales are zeroed here (a strided memset, only when a
    // row count is not a multiple of 4).
    const auto zero_pad = [&](void* scales, int64_t rows, int64_t ld, int64_t blocks) {
      if (rows == ld) return;
      PT_CHECK_CUDA(cudaMemset2DAsync(static_cast<float*>(scales) + rows, ld * sizeof(float), 0,
                                      (ld - rows) * sizeof(float), blocks, s));
    };
    if (p.row) zero_pad(qp.s_row, p.m, qp.s_row_ld_mn, (p.k + p.block - 1) / p.block);
    if (p.col) zero_pad(qp.s_col, p.k, qp.s_col_ld_mn, (p.m + p.block - 1) / p.block);
  }
  if (given_amax != nullptr) {
    qp.amax_row = qp.amax_col = given_amax;
    qp.row_block = qp.col_block = 0;
  } else if (p.granularity == PT_QUANT_ROWWISE && !needs_amax_pass(p)) {
    // Row output only: each row's amax inside the quantize kernel (one launch, one DRAM read).
    qp.row_amax_inline = 1;
    qp.row_block = qp.col_block = 0;
  } else if (needs_amax_pass(p)) {
    // Device-side amax first; the quantize kernel reads it (no host round trip).
    if (!zeroed) PT_CHECK_CUDA(cudaMemsetAsync(workspace, 0, need, s));
    float* ws = static_cast<float*>(workspace);
    PtQuantAmaxParams ap{};
    ap.m = p.m;
    ap.k = p.k;
    ap.x = qp.x;
    ap.stream = qp.stream;
    ap.num_sms = qp.num_sms;
    if (p.granularity == PT_QUANT_TENSORWISE) {
      ap.amax_tensor = ws;
      qp.amax_row = qp.amax_col = ws;
    } else {
      ap.amax_rows = p.row ? ws : nullptr;
      ap.amax_cols = p.col ? ws + p.m : nullptr;
      ap.col_rows = p.col ? p.col_rows : 0;  // a stack: each matrix's own column maxima
      qp.amax_row = ws;
      qp.amax_col = ws + p.m;
      qp.amax_row_per_row = 1;
      qp.amax_col_per_col = 1;
    }
    if (kern.amax(&ap, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "quantization amax (", p.m, " x ", p.k, ", ", dtype_name(p.x_dtype), ") failed: ", err);
    }
    qp.row_block = qp.col_block = 0;
    qp.after_amax_pass = 1;
  }
  if (kern.quantize(&qp, err, sizeof(err)) != 0) {
    PT_THROW(PT_ERROR_CUDA, "quantization (", p.m, " x ", p.k, ", ", dtype_name(p.x_dtype), " -> ",
             dtype_name(p.q_dtype), ") failed: ", err);
  }
}

// Problems of up to this many 128 x 128 tiles in all (2M elements) take the batched launch: where
// the host cost of the separate launches (and the GPU's gaps between them) is comparable to the
// work itself. Each CTA of the cooperative grid then holds one tile a phase, and the grid, at most
// one CTA an SM, stays co-resident beside other kernels (NCCL's, say) on any Hopper part. Larger
// problems keep the separate kernels, which hold more tiles per SM.
constexpr int64_t kBatchMaxTiles = 128;

// Whether these problems go through one batched launch: FP8 without RHT / SR / E8M0, one input
// dtype and format, not too large, and a saving (two jobs, or one with an amax pass).
bool batchable(const QuantProblem* ps, int32_t count) {
  int64_t tiles = 0;
  bool saves = count > 1;
  for (int32_t j = 0; j < count; ++j) {
    const QuantProblem& p = ps[j];
    if (p.fp4() || p.rht || p.sr || p.granularity == PT_QUANT_MX_BLOCKWISE || p.col_rows) return false;
    if (p.x_dtype != ps[0].x_dtype || p.q_dtype != ps[0].q_dtype) return false;
    tiles += ((p.m + 127) / 128) * ((p.k + 127) / 128);
    saves = saves || needs_amax_pass(p);
  }
  return saves && tiles <= kBatchMaxTiles;
}

// A job's share of the scratch, rounded so the shares stay 256-byte aligned in one buffer: its amax
// (batched, every tensorwise / rowwise job; separately, those with an amax pass).
size_t job_workspace_bytes(const QuantProblem& p, bool batched) {
  if (!batched && !needs_amax_pass(p)) return 0;
  return (workspace_bytes(p) + 255) / 256 * 256;
}

// The jobs' problems (checked), their given amaxes, whether they take one batched launch, and the
// scratch they need.
struct JobsPlan {
  QuantProblem ps[2];
  const float* given_amax[2] = {nullptr, nullptr};
  bool batched = false;
  size_t need = 0;

  size_t job_bytes(int32_t j) const { return given_amax[j] ? 0 : job_workspace_bytes(ps[j], batched); }
};

// A job's given amax (checked), or null.
const float* checked_amax(const pt_quantize_job& q, const QuantProblem& p) {
  if (q.amax == nullptr) return nullptr;
  PT_CHECK_ARG(p.granularity == PT_QUANT_TENSORWISE && !p.fp4(), "argument 'amax' is given for a ",
               p.fp4() ? "FP4" : "non-tensorwise", " quantization; only TENSORWISE FP8 takes one");
  return scalar_float32(*q.amax, "amax");
}

JobsPlan plan_jobs(const pt_quantize_job* jobs, int32_t count) {
  JobsPlan plan;
  bool given = false;
  for (int32_t j = 0; j < count; ++j) {
    const pt_quantize_job& q = jobs[j];
    plan.ps[j] = make_quant_problem(q.x, q.q_row, q.s_row, q.q_col, q.s_col, q.granularity, q.block_size,
                                    q.col_transposed, q.flags);
    plan.given_amax[j] = checked_amax(q, plan.ps[j]);
    given = given || plan.given_amax[j] != nullptr;
  }
  // The batched kernel reduces every amax itself: jobs with a given one take the separate path.
  plan.batched = !given && batchable(plan.ps, count);
  for (int32_t j = 0; j < count; ++j) plan.need += plan.job_bytes(j);
  return plan;
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
    const size_t need = needs_amax_pass(p) ? workspace_bytes(p) : 0;
    PT_CHECK_ARG(ws_bytes >= need, "argument 'workspace' has ", ws_bytes, " bytes; this problem needs ", need,
                 " (pt_quantize_workspace_bytes)");
    PT_CHECK_ARG(need == 0 || (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0),
                 "argument 'workspace' must be a non-null, 16-byte aligned pointer");
    if (p.m == 0 || p.k == 0) return;
    int device = 0;
    const std::string arch = arch_of_current_device(&device);
    const Kernels kern = load_kernels(p.x_dtype, p.q_dtype, arch);
    const int sms = device_info(device).sm_count;
    const PtQuantParams qp = kernel_params(p, x, q_row, s_row, q_col, s_col, seed, stream, sms);
    quantize_one(p, kern, qp, workspace, need, static_cast<cudaStream_t>(stream));
  });
}

size_t pt_quantize_jobs_workspace_bytes(const pt_quantize_job* jobs, int32_t count) {
  if (jobs == nullptr || count <= 0 || count > 2) return 0;
  try {  // invalid jobs need nothing here: pt_quantize_jobs reports them
    return plan_jobs(jobs, count).need;
  } catch (...) {
    return 0;
  }
}

pt_status pt_quantize_jobs(const pt_quantize_job* jobs, int32_t count, void* workspace, size_t ws_bytes, void* stream) {
  return api_guard([&] {
    PT_CHECK_ARG(jobs != nullptr, "argument 'jobs' is null");
    PT_CHECK_ARG(count >= 1 && count <= 2, "argument 'count' is ", count, "; expected 1 or 2");
    const JobsPlan plan = plan_jobs(jobs, count);
    const QuantProblem* ps = plan.ps;
    const bool batched = plan.batched;
    const size_t need = plan.need;
    PT_CHECK_ARG(ws_bytes >= need, "argument 'workspace' has ", ws_bytes, " bytes; these jobs need ", need,
                 " (pt_quantize_jobs_workspace_bytes)");
    PT_CHECK_ARG(need == 0 || (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 256 == 0),
                 "argument 'workspace' must be a non-null, 256-byte aligned pointer");
    int device = 0;
    const std::string arch = arch_of_current_device(&device);
    const int sms = device_info(device).sm_count;
    auto* ws = static_cast<char*>(workspace);
    if (!batched) {
      // The jobs' amax shares lie back to back: one memset clears them all (a driver call less per
      // job after the first).
      if (need > 0) PT_CHECK_CUDA(cudaMemsetAsync(workspace, 0, need, static_cast<cudaStream_t>(stream)));
      for (int32_t j = 0; j < count; ++j) {
        const QuantProblem& p = ps[j];
        const pt_quantize_job& job = jobs[j];
        if (p.m > 0 && p.k > 0) {
          const PtQuantParams qp = kernel_params(p, job.x, job.q_row, job.s_row, job.q_col, job.s_col, 0, stream, sms);
          quantize_one(p, load_kernels(p.x_dtype, p.q_dtype, arch), qp, ws, plan.job_bytes(j),
                       static_cast<cudaStream_t>(stream), plan.given_amax[j], true);
        }
        ws += plan.job_bytes(j);
      }
      return;
    }
    PtQuantBatch b{};
    b.count = count;
    b.stream = stream;
    b.num_sms = sms;
    for (int32_t j = 0; j < count; ++j) {
      const QuantProblem& p = ps[j];
      const pt_quantize_job& job = jobs[j];
      PtQuantParams& qp = b.jobs[j];
      qp = kernel_params(p, job.x, job.q_row, job.s_row, job.q_col, job.s_col, 0, stream, sms);
      if (p.granularity == PT_QUANT_TENSORWISE || p.granularity == PT_QUANT_ROWWISE) {
        // The amax scratch, zeroed by the kernel: tensorwise one value read by both outputs;
        // rowwise per row [m] and per column [k] for the outputs asked for.
        float* amax = reinterpret_cast<float*>(ws);
        const bool tensor = p.granularity == PT_QUANT_TENSORWISE;
        qp.amax_row = tensor || p.row ? amax : nullptr;
        qp.amax_col = tensor ? amax : p.col ? amax + p.m : nullptr;
        qp.amax_row_per_row = !tensor && p.row;
        qp.amax_col_per_col = !tensor && p.col;
        qp.row_block = qp.col_block = 0;
      }
      ws += job_workspace_bytes(p, true);
    }
    char err[1024] = {0};
    if (load_kernels(ps[0].x_dtype, ps[0].q_dtype, arch).batch(&b, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "quantization (", count, " jobs, ", dtype_name(ps[0].x_dtype), " -> ",
               dtype_name(ps[0].q_dtype), ") failed: ", err);
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
