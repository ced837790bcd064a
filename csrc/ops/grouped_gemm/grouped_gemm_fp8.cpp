// FP8 grouped GEMM: argument checks, the candidate configurations, the JIT modules that
// instantiate kernels/grouped_gemm/cutlass_grouped_gemm_fp8_sm90.cuh, and the C API entry points.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "primus_turbo/grouped_gemm_fp8.h"
#include "ops/grouped_gemm/grouped_gemm_problem.h"
#include "primus_turbo/kernels/grouped_gemm/grouped_gemm_fp8_abi.h"
#include "runtime/device.h"
#include "runtime/jit_runtime.h"

using namespace primus_turbo;

namespace {

struct Config {
  int tile_m, tile_n, cluster_m, cluster_n;
  std::string name() const {
    return str_cat(tile_m, "x", tile_n, "x128_c", cluster_m, "x", cluster_n, "_coop");
  }
};

// How the kernel applies the scales: per 128-deep K block in the mainloop (b_scale_rows 1 or 128),
// or one per row of each operand in the epilogue (b_scale_rows 0: cutlass_grouped_gemm_fp8_rowwise_sm90.cuh),
// whose mainloop may then accumulate in the fast mode.
enum class Scaling : int32_t { kBlocks = 0, kRows = 1, kRowsFastAccum = 2 };

// Bounded on purpose: every point is one module per (dtypes, scale granularity), minutes of nvcc.
// The tile's N side is 128 because a 128x128-scaled B needs exactly one scale per tile side. The
// tile is 128x128: the block-scaled mainloop keeps two accumulators (one K block's and the
// promoted sum), so a 256-row tile (128x128 per consumer warpgroup) spills registers and runs at
// half the speed of the bf16 kernel.
// The row-scaled kernel with fast accumulation keeps one accumulator, so it also takes 128x256
// tiles (64x256 per consumer warpgroup): half the A reloads and epilogues per product of the
// 128-wide tile (with promotion, two accumulators of that size spill). Every list starts with the
// block-scaled kernel's two configs, so a default index means the same tile for each.
const std::vector<Config>& candidates(Scaling scaling = Scaling::kBlocks) {
  static const std::vector<Config> blocks = {
      {128, 128, 1, 2},
      {128, 128, 1, 1},
  };
  static const std::vector<Config> fast = {
      {128, 128, 1, 2},
      {128, 128, 1, 1},
      {128, 256, 1, 1},
      {128, 256, 2, 1},
  };
  return scaling == Scaling::kRowsFastAccum ? fast : blocks;
}

struct Problem {
  bool wgrad = false;
  int64_t groups = 0, rows = 0, n = 0, k = 0;
  int64_t m = 0, ld = 0;  // wgrad: d [G, m, n], operands [m | n, ld]
  int32_t a_dtype = 0, b_dtype = 0, d_dtype = 0;
  int32_t b_scale_rows = 1;  // 0: row scales
  Scaling scaling = Scaling::kBlocks;
  int32_t num_sms = 0;  // 0: all
  const int64_t* group_lens = nullptr;
  const int64_t* group_offs = nullptr;
  const void* a = nullptr;
  const float* sfa = nullptr;
  const void* b = nullptr;
  const float* sfb = nullptr;
  void* d = nullptr;
  bool aligned16 = false;
};

constexpr const char* kWho = "grouped_gemm_fp8: ";  // starts the messages of shape checks

bool is_fp8(int32_t dt) { return dt == PT_FLOAT8_E4M3 || dt == PT_FLOAT8_E5M2; }
bool is_out(int32_t dt) { return dt == PT_BFLOAT16 || dt == PT_FLOAT16 || dt == PT_FLOAT32; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_tensor(const pt_tensor* t, const char* name, int ndim) {
  PT_CHECK_ARG(t != nullptr, "grouped_gemm_fp8: argument '", name, "' is null");
  PT_CHECK_ARG(t->ndim == ndim, "grouped_gemm_fp8: argument '", name, "' must be ", ndim,
               "-D, got shape ", shape_string(*t));
  dtype_bits(t->dtype);  // validates the code
  for (int i = 0; i < t->ndim; ++i) {
    PT_CHECK_ARG(t->shape[i] >= 0, "grouped_gemm_fp8: argument '", name,
                 "' has a negative dimension ", shape_string(*t));
  }
  PT_CHECK_ARG(is_packed(*t), "grouped_gemm_fp8: argument '", name,
               "' must be contiguous (row-major, no padding); got shape ", shape_string(*t));
}

void take_num_sms(Problem& p, const pt_grouped_gemm_fp8_args* args) {
  p.num_sms = args->num_sms;
  PT_CHECK_ARG(p.num_sms >= 0, "grouped_gemm_fp8: num_sms must be >= 0 (0: all SMs), got ", p.num_sms);
}

// Both scale tensors: contiguous float32 of the given shapes (each of its dims' rank).
void check_scales(const pt_grouped_gemm_fp8_args* args, std::initializer_list<int64_t> a_dims,
                  std::initializer_list<int64_t> b_dims) {
  check_tensor(args->a_scale, "a_scale", static_cast<int>(a_dims.size()));
  check_tensor(args->b_scale, "b_scale", static_cast<int>(b_dims.size()));
  PT_CHECK_ARG(args->a_scale->dtype == PT_FLOAT32 && args->b_scale->dtype == PT_FLOAT32,
               "grouped_gemm_fp8: scales must be float32");
  check_shape(args->a_scale, "a_scale", a_dims, kWho);
  check_shape(args->b_scale, "b_scale", b_dims, kWho);
}

// The device pointers of a checked problem.
void take_pointers(Problem& p, const pt_grouped_gemm_fp8_args* args) {
  p.group_lens = static_cast<const int64_t*>(args->group_lens->data);
  p.group_offs = args->group_offs ? static_cast<const int64_t*>(args->group_offs->data) : nullptr;
  p.a = args->a->data;
  p.sfa = static_cast<const float*>(args->a_scale->data);
  p.b = args->b->data;
  p.sfb = static_cast<const float*>(args->b_scale->data);
  p.d = args->d->data;
  p.aligned16 = aligned16(p.a) && aligned16(p.b) && aligned16(p.d);
}

Problem make_problem(const pt_grouped_gemm_fp8_args* args) {
  PT_CHECK_ARG(args != nullptr, "grouped_gemm_fp8: arguments are null");
  Problem p;
  check_tensor(args->group_lens, "group_lens", 1);
  PT_CHECK_ARG(args->group_lens->dtype == PT_INT64, "grouped_gemm_fp8: argument 'group_lens' has dtype ",
               dtype_name(args->group_lens->dtype), "; expected int64");
  p.groups = args->group_lens->shape[0];
  PT_CHECK_ARG(p.groups >= 1, "grouped_gemm_fp8: argument 'group_lens' must hold at least one group");
  if (args->group_offs) {
    check_tensor(args->group_offs, "group_offs", 1);
    PT_CHECK_ARG(args->group_offs->dtype == PT_INT64, "grouped_gemm_fp8: argument 'group_offs' has dtype ",
                 dtype_name(args->group_offs->dtype), "; expected int64");
    check_shape(args->group_offs, "group_offs", {p.groups + 1}, kWho);
  }
  p.wgrad = args->wgrad != 0;
  PT_CHECK_ARG((args->flags & ~int32_t{PT_GEMM_FP8_FAST_ACCUM}) == 0, "grouped_gemm_fp8: argument 'flags' has "
               "unknown bits (", args->flags, "); expected a combination of pt_gemm_fp8_flag values");
  check_tensor(args->a, "a", 2);
  check_tensor(args->b, "b", p.wgrad ? 2 : 3);
  check_tensor(args->d, "out", p.wgrad ? 3 : 2);
  p.a_dtype = args->a->dtype;
  p.b_dtype = args->b->dtype;
  p.d_dtype = args->d->dtype;
  PT_CHECK_ARG(is_fp8(p.a_dtype), "grouped_gemm_fp8: argument 'a' has dtype ", dtype_name(p.a_dtype),
               "; expected float8_e4m3 or float8_e5m2");
  PT_CHECK_ARG(is_fp8(p.b_dtype), "grouped_gemm_fp8: argument 'b' has dtype ", dtype_name(p.b_dtype),
               "; expected float8_e4m3 or float8_e5m2");
  PT_CHECK_ARG(is_out(p.d_dtype), "grouped_gemm_fp8: argument 'out' has dtype ", dtype_name(p.d_dtype),
               "; expected bfloat16, float16 or float32");
  if (p.wgrad) {
    p.m = args->a->shape[0];
    p.ld = args->a->shape[1];
    p.n = args->b->shape[0];
    p.rows = args->tokens;
    PT_CHECK_ARG(p.rows >= 0, "grouped_gemm_fp8: tokens must be >= 0, got ", p.rows);
    PT_CHECK_ARG(p.ld % 128 == 0, "grouped_gemm_fp8 wgrad: the padded token dimension of 'a' (", p.ld,
                 ") must be a multiple of 128");
    check_shape(args->b, "b", {p.n, p.ld}, kWho);
    check_shape(args->d, "out", {p.groups, p.m, p.n}, kWho);
    PT_CHECK_ARG(args->b_scale_rows == 1, "grouped_gemm_fp8 wgrad: b_scale_rows must be 1, got ",
                 args->b_scale_rows);
    p.b_scale_rows = 1;
    take_num_sms(p, args);
    check_scales(args, {p.ld / 128, p.m}, {p.ld / 128, p.n});
    take_pointers(p, args);
    return p;
  }
  p.rows = args->a->shape[0];
  p.k = args->a->shape[1];
  PT_CHECK_ARG(args->b->shape[0] == p.groups, "grouped_gemm_fp8: argument 'b' has ", args->b->shape[0],
               " groups (shape ", shape_string(*args->b), ") but group_lens has ", p.groups);
  p.n = args->b->shape[1];
  PT_CHECK_ARG(args->b->shape[2] == p.k, "grouped_gemm_fp8: inner dimensions do not match: 'a' is [",
               p.rows, ", ", p.k, "] but 'b' ", shape_string(*args->b), " has K = ", args->b->shape[2]);
  check_shape(args->d, "out", {p.rows, p.n}, kWho);
  p.b_scale_rows = args->b_scale_rows;
  take_num_sms(p, args);
  PT_CHECK_ARG(p.b_scale_rows == 0 || p.b_scale_rows == 1 || p.b_scale_rows == 128,
               "grouped_gemm_fp8: b_scale_rows must be 1 or 128 (block scales) or 0 (row scales), got ",
               p.b_scale_rows);
  if (p.b_scale_rows == 0) {
    p.scaling = args->flags & PT_GEMM_FP8_FAST_ACCUM ? Scaling::kRowsFastAccum : Scaling::kRows;
    check_scales(args, {p.rows}, {p.groups, p.n});
  } else {
    const int64_t kb = ceil_div(p.k, 128);
    check_scales(args, {p.rows, kb}, {p.groups, ceil_div(p.n, p.b_scale_rows), kb});
  }
  take_pointers(p, args);
  return p;
}

bool is_trivial(const Problem& p) {
  return p.wgrad ? (p.rows == 0 || p.m == 0 || p.n == 0) : (p.rows == 0 || p.n == 0 || p.k == 0);
}

std::string rejection(const Problem& p) {
  const DeviceInfo& dev = device_info(current_device());
  if (dev.major != 9 || dev.minor != 0) {
    return str_cat("the CUTLASS FP8 grouped GEMM is built for Hopper (sm_90a); this GPU is sm_",
                   dev.major, dev.minor);
  }
  if (!p.aligned16) return "the CUTLASS FP8 grouped GEMM needs 16-byte aligned data pointers (TMA)";
  const int64_t d_vec = 16 / (dtype_bits(p.d_dtype) / 8);
  if (p.wgrad) {
    if (p.n % d_vec) {
      return str_cat("the CUTLASS FP8 grouped wgrad needs N a multiple of ", d_vec, ", got N=", p.n);
    }
    if (p.m > INT32_MAX || p.n > INT32_MAX || p.ld > INT32_MAX) {
      return "the CUTLASS FP8 grouped GEMM takes sizes below 2^31";
    }
    return "";
  }
  // Every group's operands start a whole row into their tensors: rows must be 16-byte multiples.
  if (p.k % 16 || p.n % d_vec) {
    return str_cat("the CUTLASS FP8 grouped GEMM needs K a multiple of 16 and N a multiple of ",
                   d_vec, " (16-byte rows), got K=", p.k, ", N=", p.n);
  }
  if (p.rows > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) {
    return "the CUTLASS FP8 grouped GEMM takes sizes below 2^31";
  }
  return "";
}

const char* cutlass_type(int32_t dt) {
  switch (dt) {
    case PT_FLOAT8_E4M3: return "cutlass::float_e4m3_t";
    case PT_FLOAT8_E5M2: return "cutlass::float_e5m2_t";
    case PT_FLOAT32: return "float";
    case PT_FLOAT16: return "cutlass::half_t";
    case PT_BFLOAT16: return "cutlass::bfloat16_t";
    default: PT_THROW(PT_ERROR_NOT_SUPPORTED, "CUTLASS FP8 grouped GEMM: unsupported dtype code ", dt);
  }
}

struct KernelKey {
  int32_t a_dtype, b_dtype, d_dtype, b_scale_rows;  // b_scale_rows 0: row scales
  int config;
  bool wgrad = false;
  bool fast_accum = false;  // row scales only
  auto tie() const { return std::tie(a_dtype, b_dtype, d_dtype, b_scale_rows, config, wgrad, fast_accum); }
  bool operator<(const KernelKey& o) const { return tie() < o.tie(); }
  Scaling scaling() const {
    return b_scale_rows != 0 ? Scaling::kBlocks : fast_accum ? Scaling::kRowsFastAccum : Scaling::kRows;
  }
};

void check_config(int config, Scaling scaling) {
  const int n = static_cast<int>(candidates(scaling).size());
  PT_CHECK_ARG(config >= 0 && config < n, "grouped_gemm_fp8: config ", config,
               " is out of range [0, ", n, ")");
}

jit::ModuleRequest module_request(const KernelKey& k) {
  const Config& c = candidates(k.scaling()).at(k.config);
  jit::ModuleRequest r;
  if (k.b_scale_rows == 0) {
    r.name = str_cat("grouped_gemm_fp8_rowwise_cutlass_", dtype_short_name(k.a_dtype), "x",
                     dtype_short_name(k.b_dtype), "_", dtype_short_name(k.d_dtype), k.fast_accum ? "_fast_" : "_",
                     c.name());
    r.needs_cutlass = true;
    r.source = str_cat(
        "#include \"primus_turbo/kernels/grouped_gemm/cutlass_grouped_gemm_fp8_rowwise_sm90.cuh\"\n"
        "using Kernel = primus_turbo::kernels::grouped_fp8::CutlassGroupedGemmFp8RowwiseSm90<\n    ",
        cutlass_type(k.a_dtype), ", ", cutlass_type(k.b_dtype), ", ", cutlass_type(k.d_dtype), ",\n    ", c.tile_m,
        ", ", c.tile_n, ", ", c.cluster_m, ", ", c.cluster_n, ", ", k.fast_accum ? "true" : "false",
        ">;\nPT_JIT_EXPORT_GROUPED_GEMM_FP8(Kernel)\n");
    return r;
  }
  r.name = str_cat("grouped_gemm_fp8_cutlass_", dtype_short_name(k.a_dtype), "x",
                   dtype_short_name(k.b_dtype), "_", dtype_short_name(k.d_dtype), "_sfb",
                   k.b_scale_rows, k.wgrad ? "_wgrad_" : "_", c.name());
  r.needs_cutlass = true;
  r.source = str_cat(
      "#include \"primus_turbo/kernels/grouped_gemm/cutlass_grouped_gemm_fp8_sm90.cuh\"\n"
      "using Kernel = primus_turbo::kernels::grouped_fp8::CutlassGroupedGemmFp8Sm90<\n    ",
      cutlass_type(k.a_dtype), ", ", cutlass_type(k.b_dtype), ", ", cutlass_type(k.d_dtype),
      ",\n    ", k.b_scale_rows, ", ", c.tile_m, ", ", c.tile_n, ", ", c.cluster_m, ", ",
      c.cluster_n, k.wgrad ? ", true" : "", ">;\nPT_JIT_EXPORT_GROUPED_GEMM_FP8(Kernel)\n");
  return r;
}

struct Loaded {
  PtGroupedGemmFp8RunFn run = nullptr;
  PtGroupedGemmFp8WorkspaceFn workspace = nullptr;
};

Loaded load(const KernelKey& key) {
  check_config(key.config, key.scaling());
  PT_CHECK_ARG(is_fp8(key.a_dtype) && is_fp8(key.b_dtype) && is_out(key.d_dtype),
               "grouped_gemm_fp8: dtypes must be FP8 x FP8 -> bfloat16/float16/float32");
  PT_CHECK_ARG(key.b_scale_rows == 0 || key.b_scale_rows == 1 || key.b_scale_rows == 128,
               "grouped_gemm_fp8: b_scale_rows must be 0, 1 or 128, got ", key.b_scale_rows);
  PT_CHECK_ARG(!key.wgrad || key.b_scale_rows == 1, "grouped_gemm_fp8 wgrad: b_scale_rows must be 1");
  PT_CHECK_ARG(!key.fast_accum || key.b_scale_rows == 0, "grouped_gemm_fp8: fast accumulation needs row scales");
  static jit::LoadedCache<KernelKey, Loaded> loaded;
  return loaded.get(key, [&] {
    auto module = jit::get_module(module_request(key));  // may compile: outside the lock
    return Loaded{module->function<PtGroupedGemmFp8RunFn>("pt_grouped_gemm_fp8_run"),
                  module->function<PtGroupedGemmFp8WorkspaceFn>("pt_grouped_gemm_fp8_workspace")};
  });
}

KernelKey kernel_key(const Problem& p, int config) {
  return {p.a_dtype, p.b_dtype, p.d_dtype, p.b_scale_rows, config, p.wgrad, p.scaling == Scaling::kRowsFastAccum};
}

// The 1x2 cluster (two N tiles of one M tile share A's loads) unless there are too few tiles to
// pair. Group sizes are unknown on the host: estimate the tiles from the packed extent.
// With fast accumulation the row-scaled kernel takes the 128x256 tile wherever it still fills the GPU
// (on the MoE layers' shapes 10-18% faster than 128x128).
int default_config(const Problem& p, int sm_count) {
  if (p.scaling == Scaling::kRowsFastAccum) {
    const int64_t wide = (ceil_div(p.rows, 128) + p.groups / 2) * ceil_div(p.n, 256);
    if (wide >= sm_count && p.n > 128) return 2;
  }
  const int64_t tiles = p.wgrad ? p.groups * ceil_div(p.m, 128) * ceil_div(p.n, 128)
                                : (ceil_div(p.rows, 128) + p.groups / 2) * ceil_div(p.n, 128);
  return tiles >= sm_count && p.n > 128 ? 0 : 1;
}

int resolve_config(const Problem& p, int32_t config) {
  const int all = device_info(current_device()).sm_count;
  return config < 0 ? default_config(p, grouped_gemm::persistent_sms(p.num_sms, all)) : config;
}

PtGroupedGemmFp8Params make_params(const Problem& p, int device) {
  PtGroupedGemmFp8Params params{};
  params.wgrad = p.wgrad ? 1 : 0;
  params.m = p.m;
  params.ld = p.ld;
  params.num_groups = p.groups;
  params.rows = p.rows;
  params.n = p.n;
  params.k = p.k;
  params.group_lens = p.group_lens;
  params.group_offs = p.group_offs;
  params.a = p.a;
  params.sfa = p.sfa;
  params.b = p.b;
  params.sfb = p.sfb;
  params.d = p.d;
  params.device = device;
  const int all = device_info(device).sm_count;
  params.num_sms = grouped_gemm::persistent_sms(p.num_sms, all);
  return params;
}

void check_backend(int32_t backend) {
  PT_CHECK_ARG(backend == PT_BACKEND_CUTLASS, "grouped_gemm_fp8 has no backend code ", backend,
               "; expected CUTLASS");
}

}  // namespace

extern "C" {

pt_status pt_grouped_gemm_fp8(const pt_grouped_gemm_fp8_args* args, int32_t backend,
                              int32_t config, void* workspace, size_t workspace_bytes,
                              void* stream) {
  return api_guard([&] {
    const Problem p = make_problem(args);
    check_backend(backend);
    auto s = static_cast<cudaStream_t>(stream);
    if (is_trivial(p)) {
      // K == 0 (forward) or no tokens (wgrad): the product is zero; no rows or columns: nothing.
      const int64_t elems = p.wgrad ? p.groups * p.m * p.n : p.rows * p.n;
      const int64_t bytes = elems * (dtype_bits(p.d_dtype) / 8);
      if (bytes > 0) PT_CHECK_CUDA(cudaMemsetAsync(p.d, 0, bytes, s));
      return;
    }
    const std::string why = rejection(p);
    PT_CHECK_SUPPORTED(why.empty(), why);
    const int c = resolve_config(p, config);
    Loaded k = load(kernel_key(p, c));
    const int device = current_device();
    bind_device_context(device);
    PtGroupedGemmFp8Params params = make_params(p, device);
    params.workspace = workspace;
    params.workspace_bytes = workspace_bytes;
    params.stream = stream;
    char err[1024] = {0};
    if (k.run(&params, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "CUTLASS FP8 grouped GEMM ", candidates(p.scaling)[c].name(),
               p.wgrad ? " wgrad" : "",
               p.b_scale_rows == 0 ? " (row scales)" : "",
               " (G=", p.groups, ", M=", p.wgrad ? p.m : p.rows, ", N=", p.n, ", K=", p.wgrad ? p.ld : p.k,
               ") failed: ", err);
    }
  });
}

pt_status pt_grouped_gemm_fp8_query(const pt_grouped_gemm_fp8_args* args, int32_t backend,
                                    int32_t* accepted, int32_t* num_configs, char* reason,
                                    size_t reason_len) {
  return api_guard([&] {
    PT_CHECK_ARG(accepted && num_configs, "pt_grouped_gemm_fp8_query: output pointers are null");
    const Problem p = make_problem(args);
    std::string why;
    if (backend != PT_BACKEND_CUTLASS) {
      why = str_cat("backend ", backend, " has no FP8 grouped GEMM; CUTLASS does");
    } else if (!is_trivial(p)) {
      why = rejection(p);
    }
    *accepted = why.empty();
    *num_configs = why.empty() && !is_trivial(p) ? static_cast<int32_t>(candidates(p.scaling).size()) : 0;
    if (reason && reason_len) copy_out(why.substr(0, reason_len - 1), reason, reason_len, "reason");
  });
}

pt_status pt_grouped_gemm_fp8_workspace_size(const pt_grouped_gemm_fp8_args* args,
                                             int32_t backend, int32_t config, size_t* bytes) {
  return api_guard([&] {
    PT_CHECK_ARG(bytes != nullptr, "pt_grouped_gemm_fp8_workspace_size: 'bytes' is null");
    const Problem p = make_problem(args);
    check_backend(backend);
    *bytes = 0;
    if (is_trivial(p)) return;
    Loaded k = load(kernel_key(p, resolve_config(p, config)));
    PtGroupedGemmFp8Params params = make_params(p, current_device());
    char err[512] = {0};
    PT_CHECK_INTERNAL(k.workspace(&params, bytes, err, sizeof(err)) == 0, err);
  });
}

pt_status pt_grouped_gemm_fp8_config_name(const pt_grouped_gemm_fp8_args* args, int32_t backend,
                                          int32_t config, char* name, size_t name_len) {
  return api_guard([&] {
    const Problem p = make_problem(args);
    check_backend(backend);
    const int c = resolve_config(p, config);
    check_config(c, p.scaling);
    const char* scaling = p.scaling == Scaling::kRowsFastAccum ? "_rows_fast" : p.scaling == Scaling::kRows ? "_rows" : "";
    copy_out(str_cat("cutlass_", candidates(p.scaling)[c].name(), scaling), name, name_len, "name");
  });
}

pt_status pt_grouped_gemm_fp8_problem_key(const pt_grouped_gemm_fp8_args* args, char* key,
                                          size_t key_len) {
  return api_guard([&] {
    const Problem p = make_problem(args);
    copy_out(str_cat(p.wgrad ? str_cat("fp8-wgrad|M", p.m, "xN", p.n, "xT", p.rows, "xLD", p.ld)
                             : str_cat("fp8|M", p.rows, "xN", p.n, "xK", p.k),
                     "xG", p.groups, "|",
                     dtype_name(p.a_dtype), "x", dtype_name(p.b_dtype), "->", dtype_name(p.d_dtype),
                     "|sfb", p.b_scale_rows, p.scaling == Scaling::kRowsFastAccum ? "|fast_accum" : "",
                     "|align", p.aligned16 ? 16 : 0,
                     p.group_offs ? "|offs" : "", p.num_sms > 0 ? str_cat("|sms", p.num_sms) : ""),
             key, key_len, "key");
  });
}

pt_status pt_grouped_gemm_fp8_prepare(int32_t a_dtype, int32_t b_dtype, int32_t d_dtype,
                                      int32_t b_scale_rows, int32_t config) {
  return api_guard([&] { load({a_dtype, b_dtype, d_dtype, b_scale_rows, config < 0 ? 0 : config}); });
}

pt_status pt_grouped_gemm_fp8_fast_prepare(int32_t a_dtype, int32_t b_dtype, int32_t d_dtype, int32_t config) {
  return api_guard([&] { load({a_dtype, b_dtype, d_dtype, 0, config < 0 ? 0 : config, false, true}); });
}

pt_status pt_grouped_gemm_fp8_wgrad_prepare(int32_t a_dtype, int32_t b_dtype, int32_t d_dtype,
                                            int32_t config) {
  return api_guard([&] { load({a_dtype, b_dtype, d_dtype, 1, config < 0 ? 0 : config, true}); });
}

int32_t pt_grouped_gemm_fp8_num_configs(int32_t backend) {
  return backend == PT_BACKEND_CUTLASS ? static_cast<int32_t>(candidates().size()) : -1;
}

}  // extern "C"
