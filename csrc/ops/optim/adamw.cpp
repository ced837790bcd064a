// Fused AdamW (pt_adamw_step): argument checks, the tensor tables, the JIT module, the launches.
// See kernels/optim/adamw.cuh and primus_turbo/optim.h.
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "core/error.h"
#include "core/tensor.h"
#include "primus_turbo/kernels/optim/adamw_abi.h"
#include "primus_turbo/optim.h"
#include "runtime/device.h"
#include "runtime/jit_runtime.h"

using namespace primus_turbo;

namespace {

constexpr const char* kOp = "adamw";

PtAdamWFn load_kernel() {
  static jit::LoadedCache<int, PtAdamWFn> loaded;
  return loaded.get(0, [&] {
    jit::ModuleRequest r;
    r.name = "adamw";
    r.needs_cutlass = false;
    r.source =
        "#include \"primus_turbo/kernels/optim/adamw.cuh\"\n"
        "PT_JIT_EXPORT_ADAMW(primus_turbo::kernels::optim::AdamW)\n";
    auto module = jit::get_module(r);  // may compile: outside the cache's lock
    return module->function<PtAdamWFn>("pt_adamw_run");
  });
}

void check_hyper(const pt_adamw_config& c) {
  const auto finite_in = [](double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v < hi; };
  PT_CHECK_ARG(std::isfinite(c.lr) && c.lr >= 0, kOp, ": 'lr' must be a finite number >= 0, got ", c.lr);
  PT_CHECK_ARG(finite_in(c.beta1, 0, 1), kOp, ": 'beta1' must be in [0, 1), got ", c.beta1);
  PT_CHECK_ARG(finite_in(c.beta2, 0, 1), kOp, ": 'beta2' must be in [0, 1), got ", c.beta2);
  PT_CHECK_ARG(std::isfinite(c.eps) && c.eps >= 0, kOp, ": 'eps' must be a finite number >= 0, got ", c.eps);
  PT_CHECK_ARG(std::isfinite(c.weight_decay) && c.weight_decay >= 0, kOp,
               ": 'weight_decay' must be a finite number >= 0, got ", c.weight_decay);
  PT_CHECK_ARG(c.step >= 1, kOp, ": 'step' must be >= 1 (the step count after this update), got ", c.step);
}

// Checks parameter i's four tensors against the call's dtypes.
void check_param(const pt_tensor* params, const pt_tensor* grads, const pt_tensor* exp_avgs,
                    const pt_tensor* exp_avg_sqs, int32_t i, int32_t state_dtype) {
  const pt_tensor& p = params[i];
  check_contiguous(&p, "params");
  PT_CHECK_ARG(is_float_dtype(p.dtype), kOp, ": params[", i, "] has dtype ", dtype_name(p.dtype),
               "; expected float32, float16 or bfloat16");
  PT_CHECK_ARG(p.dtype == params[0].dtype, kOp, ": params[", i, "] has dtype ", dtype_name(p.dtype),
               "; every param of a call must have params[0]'s (", dtype_name(params[0].dtype), ")");
  check_like(&grads[i], "grads", p, "params");
  for (const auto& [t, name] : {std::pair{&exp_avgs[i], "exp_avgs"}, std::pair{&exp_avg_sqs[i], "exp_avg_sqs"}}) {
    check_contiguous(t, name);
    check_same_shape(t, name, p, "params");
    PT_CHECK_ARG(t->dtype == state_dtype, kOp, ": ", name, "[", i, "] has dtype ", dtype_name(t->dtype),
                 "; expected ", dtype_name(state_dtype), " (the params' dtype or float32, one for every moment)");
  }
}

// The launch's scalars from the hyper-parameters: host-side in double, as torch computes them,
// then float32 for the kernel.
PtAdamWParams make_params(const pt_adamw_config& c, int32_t param_dtype, int32_t state_dtype, int32_t fp8_dtype,
                          void* stream) {
  PtAdamWParams p{};
  p.param_dtype = param_dtype;
  p.state_dtype = state_dtype;
  p.fp8_dtype = fp8_dtype;
  p.decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
  p.step_size = static_cast<float>(c.lr / (1.0 - std::pow(c.beta1, static_cast<double>(c.step))));
  p.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(c.beta2, static_cast<double>(c.step))));
  p.beta1 = static_cast<float>(c.beta1);
  p.beta2 = static_cast<float>(c.beta2);
  p.eps = static_cast<float>(c.eps);
  p.stream = stream;
  return p;
}

// Checks the count and the hyper-parameters; false when there is nothing to update.
bool check_config(int32_t count, const pt_adamw_config* config) {
  PT_CHECK_ARG(count >= 0, kOp, ": 'count' must be >= 0, got ", count);
  PT_CHECK_ARG(config != nullptr, kOp, ": 'config' is required");
  check_hyper(*config);
  return count > 0;
}

// Checks the call's common arguments (count > 0) and every param's four tensors; returns the
// moments' dtype.
int32_t check_call(const pt_tensor* params, const pt_tensor* grads, const pt_tensor* exp_avgs,
                   const pt_tensor* exp_avg_sqs, int32_t count) {
  PT_CHECK_ARG(params && grads && exp_avgs && exp_avg_sqs, kOp,
               ": params, grads, exp_avgs and exp_avg_sqs are required");
  const int32_t state_dtype = exp_avgs[0].dtype;
  PT_CHECK_ARG(state_dtype == PT_FLOAT32 || state_dtype == params[0].dtype, kOp, ": exp_avgs[0] has dtype ",
               dtype_name(state_dtype), "; expected float32 or the params' dtype ", dtype_name(params[0].dtype));
  for (int32_t i = 0; i < count; ++i) check_param(params, grads, exp_avgs, exp_avg_sqs, i, state_dtype);
  return state_dtype;
}

// Launches p's tensors as they are added: add(i, blocks) fills the next table entry for param i and
// its CTA count; a full table (or CTA count) launches first.
class Launcher {
 public:
  explicit Launcher(const PtAdamWParams& p) : p_(p), run_(load_kernel()) {}
  PtAdamWTensor& add(int64_t blocks) {
    if (p_.count == PT_ADAMW_MAX_TENSORS || p_.blocks + blocks > 0x7fffffff) flush();
    PtAdamWTensor& t = p_.tensors[p_.count++];
    t = PtAdamWTensor{};
    t.first_block = p_.blocks;
    p_.blocks += blocks;
    return t;
  }
  void flush() {
    if (p_.count == 0) return;
    char err[512] = {0};
    if (run_(&p_, err, sizeof(err)) != 0) PT_THROW(PT_ERROR_CUDA, kOp, " failed: ", err);
    p_.count = 0;
    p_.blocks = 0;
  }

 private:
  PtAdamWParams p_;
  PtAdamWFn run_;
};

void bind_moments(PtAdamWTensor& t, const pt_tensor& p, const pt_tensor& g, const pt_tensor& m, const pt_tensor& v) {
  t.param = p.data;
  t.grad = g.data;
  t.exp_avg = m.data;
  t.exp_avg_sq = v.data;
  t.numel = numel(p);
  t.vec = aligned16(t.param) && aligned16(t.grad) && aligned16(t.exp_avg) && aligned16(t.exp_avg_sq);
}

}  // namespace

extern "C" {

pt_status pt_adamw_step(const pt_tensor* params, const pt_tensor* grads, const pt_tensor* exp_avgs,
                        const pt_tensor* exp_avg_sqs, int32_t count, const pt_adamw_config* config, float* amax,
                        void* stream) {
  return api_guard([&] {
    if (!check_config(count, config)) return;  // nothing to update
    const int32_t state_dtype = check_call(params, grads, exp_avgs, exp_avg_sqs, count);
    bind_device_context(current_device());
    auto s = static_cast<cudaStream_t>(stream);
    if (amax) {
      const cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float) * count, s);
      if (e != cudaSuccess) PT_THROW(PT_ERROR_CUDA, kOp, ": zeroing amax failed: ", cudaGetErrorString(e));
    }
    Launcher launcher(make_params(*config, params[0].dtype, state_dtype, 0, stream));
    for (int32_t i = 0; i < count; ++i) {
      const int64_t n = numel(params[i]);
      if (n == 0) continue;
      PtAdamWTensor& t = launcher.add((n + PT_ADAMW_BLOCK_ELEMS - 1) / PT_ADAMW_BLOCK_ELEMS);
      bind_moments(t, params[i], grads[i], exp_avgs[i], exp_avg_sqs[i]);
      t.amax = amax ? amax + i : nullptr;
    }
    launcher.flush();
  });
}

pt_status pt_adamw_step_fp8_blocks(const pt_tensor* params, const pt_tensor* grads, const pt_tensor* exp_avgs,
                                   const pt_tensor* exp_avg_sqs, int32_t count, const pt_adamw_config* config,
                                   pt_tensor* qdata, pt_tensor* scale_inv, pt_tensor* qdata_t, void* stream) {
  return api_guard([&] {
    if (!check_config(count, config)) return;  // nothing to update
    const int32_t state_dtype = check_call(params, grads, exp_avgs, exp_avg_sqs, count);
    PT_CHECK_ARG(qdata && scale_inv, kOp, ": qdata and scale_inv are required");
    const int32_t fp8 = qdata[0].dtype;
    PT_CHECK_ARG(fp8 == PT_FLOAT8_E4M3 || fp8 == PT_FLOAT8_E5M2, kOp, ": qdata[0] has dtype ", dtype_name(fp8),
                 "; expected float8_e4m3fn or float8_e5m2");
    constexpr int64_t kTile = PT_ADAMW_FP8_TILE;
    for (int32_t i = 0; i < count; ++i) {
      const pt_tensor& p = params[i];
      PT_CHECK_ARG(p.ndim >= 1, kOp, ": params[", i, "] must have at least 1 dimension");
      check_contiguous(&qdata[i], "qdata");
      check_same_shape(&qdata[i], "qdata", p, "params");
      PT_CHECK_ARG(qdata[i].dtype == fp8, kOp, ": qdata[", i, "] has dtype ", dtype_name(qdata[i].dtype),
                   "; expected ", dtype_name(fp8), " (every qdata the same)");
      const int64_t cols = p.shape[p.ndim - 1], rows = cols ? numel(p) / cols : 0;
      check_contiguous(&scale_inv[i], "scale_inv");
      PT_CHECK_ARG(scale_inv[i].dtype == PT_FLOAT32, kOp, ": scale_inv[", i, "] must be float32, got ",
                   dtype_name(scale_inv[i].dtype));
      PT_CHECK_ARG(numel(scale_inv[i]) == ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile), kOp,
                   ": scale_inv[", i, "] has shape ", shape_string(scale_inv[i]), "; expected [", (rows + kTile - 1) / kTile,
                   ", ", (cols + kTile - 1) / kTile, "] (128 x 128 blocks of params[", i, "] as [", rows, ", ", cols, "])");
      if (qdata_t && qdata_t[i].data) {  // each matrix's transposed copy: the last two dims swapped
        const pt_tensor& qt = qdata_t[i];
        check_contiguous(&qt, "qdata_t");
        bool swapped = p.ndim >= 2 && qt.ndim == p.ndim && qt.dtype == fp8;
        for (int d = 0; swapped && d < p.ndim - 2; ++d) swapped = qt.shape[d] == p.shape[d];
        swapped = swapped && qt.shape[p.ndim - 1] == p.shape[p.ndim - 2] && qt.shape[p.ndim - 2] == p.shape[p.ndim - 1];
        PT_CHECK_ARG(swapped, kOp, ": qdata_t[", i, "] is ", dtype_name(qt.dtype), " ", shape_string(qt),
                     "; expected ", dtype_name(fp8), " with the last two dims of params[", i, "] ", shape_string(p),
                     " swapped");
        const int64_t mrows = p.shape[p.ndim - 2];
        PT_CHECK_ARG(mrows == rows || mrows % kTile == 0, kOp, ": params[", i, "] ", shape_string(p),
                     ": a transposed copy per matrix needs 128-row matrices (or one matrix)");
      }
    }
    bind_device_context(current_device());
    Launcher launcher(make_params(*config, params[0].dtype, state_dtype, fp8, stream));
    for (int32_t i = 0; i < count; ++i) {
      const pt_tensor& p = params[i];
      const int64_t cols = p.ndim ? p.shape[p.ndim - 1] : 1, rows = cols ? numel(p) / cols : 0;
      if (rows == 0 || cols == 0) continue;
      PtAdamWTensor& t = launcher.add(((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile));
      bind_moments(t, params[i], grads[i], exp_avgs[i], exp_avg_sqs[i]);
      t.q = qdata[i].data;
      t.scale_inv = static_cast<float*>(scale_inv[i].data);
      t.rows = rows;
      t.cols = cols;
      if (qdata_t && qdata_t[i].data) {
        t.qt = qdata_t[i].data;
        t.matrix_rows = p.shape[p.ndim - 2];
      }
      t.vec = t.vec && aligned16(t.q) && cols % 8 == 0;  // every row's 8-element chunks aligned
    }
    launcher.flush();
  });
}

pt_status pt_adamw_prepare(void) {
  return api_guard([&] { load_kernel(); });
}

}  // extern "C"
