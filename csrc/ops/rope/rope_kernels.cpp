#include "ops/rope/rope_kernels.h"

#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "core/tensor.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::rope {

namespace {

const char* cuda_type(int32_t dt) {
  switch (dt) {
    case PT_FLOAT32: return "float";
    case PT_FLOAT16: return "__half";
    case PT_BFLOAT16: return "__nv_bfloat16";
    default: PT_THROW(PT_ERROR_NOT_SUPPORTED, "RoPE: unsupported dtype code ", dt);
  }
}

jit::ModuleRequest module_request(const Problem& p, const std::string& arch) {
  auto flag = [](bool b) { return b ? "true" : "false"; };
  jit::ModuleRequest r;
  r.name = str_cat("rope_", dtype_short_name(p.dtype), p.vectorized ? "_vec" : "_scalar",
                   p.interleaved ? "_interleaved" : "_half", p.table ? "_table" : "_theta");
  r.needs_cutlass = false;
  r.arch = arch;
  r.source = str_cat("#include \"primus_turbo/kernels/rope/rope.cuh\"\n"
                     "using Kernel = primus_turbo::kernels::rope::Rope<",
                     cuda_type(p.dtype), ", ", flag(p.vectorized), ", ", flag(p.interleaved), ", ", flag(p.table),
                     ">;\nPT_JIT_EXPORT_ROPE(Kernel)\n");
  return r;
}

}  // namespace

PtRopeFn load_kernel(const Problem& p, const std::string& arch) {
  using Key = std::tuple<int32_t, bool, bool, bool, std::string>;
  static std::mutex mutex;
  static std::map<Key, PtRopeFn> loaded;
  const Key key{p.dtype, p.vectorized, p.interleaved, p.table, arch};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = loaded.find(key);
    if (it != loaded.end()) return it->second;
  }
  // May compile: not under the lock, so other modules can build in parallel.
  auto module = jit::get_module(module_request(p, arch));
  PtRopeFn fn = module->function<PtRopeFn>("pt_rope_run");
  std::lock_guard<std::mutex> lock(mutex);
  loaded.emplace(key, fn);
  return fn;
}

}  // namespace primus_turbo::rope
