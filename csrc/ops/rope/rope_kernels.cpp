#include "ops/rope/rope_kernels.h"

#include <tuple>

#include "core/error.h"
#include "core/tensor.h"
#include "runtime/jit_runtime.h"

namespace primus_turbo::rope {

namespace {

const char* cuda_type(int32_t dt) {
  if (const char* t = cuda_float_type(dt)) return t;
  PT_THROW(PT_ERROR_NOT_SUPPORTED, "RoPE: unsupported dtype code ", dt);
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
  static jit::LoadedCache<Key, PtRopeFn> loaded;
  return loaded.get(Key{p.dtype, p.vectorized, p.interleaved, p.table, arch}, [&] {
    return jit::get_module(module_request(p, arch))->function<PtRopeFn>("pt_rope_run");
  });
}

}  // namespace primus_turbo::rope
