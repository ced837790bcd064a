// Batched last-two-dimension transpose (pt_transpose_last2): argument checks, the JIT module (one
// per element size), the launch. See kernels/layout/transpose.cuh and primus_turbo/layout.h.
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "primus_turbo/kernels/layout/transpose_abi.h"
#include "primus_turbo/layout.h"
#include "runtime/device.h"
#include "runtime/jit_runtime.h"

using namespace primus_turbo;

namespace {

PtTransposeFn load_kernel(int element_bytes) {
  PT_CHECK_ARG(element_bytes == 1 || element_bytes == 2 || element_bytes == 4,
               "transpose: elements must be 1, 2 or 4 bytes, got ", element_bytes);
  static jit::LoadedCache<int, PtTransposeFn> loaded;
  return loaded.get(element_bytes, [&] {
    jit::ModuleRequest r;
    r.name = str_cat("transpose_", element_bytes, "byte");
    r.needs_cutlass = false;
    r.source = str_cat("#include \"primus_turbo/kernels/layout/transpose.cuh\"\n"
                       "using Kernel = primus_turbo::kernels::layout::Transpose<", element_bytes, ">;\n"
                       "PT_JIT_EXPORT_TRANSPOSE(Kernel)\n");
    auto module = jit::get_module(r);  // may compile: outside the cache's lock
    return module->function<PtTransposeFn>("pt_transpose_run");
  });
}

}  // namespace

extern "C" {

pt_status pt_transpose_last2(const pt_tensor* x, pt_tensor* y, void* stream) {
  return api_guard([&] {
    check_contiguous(x, "x");
    check_contiguous(y, "y");
    PT_CHECK_ARG(x->ndim == 2 || x->ndim == 3, "transpose: argument 'x' must be 2-D or 3-D, got shape ",
                 shape_string(*x));
    const bool batched = x->ndim == 3;
    const int64_t batch = batched ? x->shape[0] : 1;
    const int64_t rows = x->shape[x->ndim - 2], cols = x->shape[x->ndim - 1];
    PT_CHECK_ARG(y->dtype == x->dtype, "transpose: argument 'y' has dtype ", dtype_name(y->dtype),
                 "; expected x's ", dtype_name(x->dtype));
    PT_CHECK_ARG(y->ndim == x->ndim, "transpose: argument 'y' must be ", x->ndim, "-D like 'x', got shape ",
                 shape_string(*y));
    if (batched) {
      check_shape(y, "y", {batch, cols, rows}, "transpose: ");
    } else {
      check_shape(y, "y", {cols, rows}, "transpose: ");
    }
    const int bits = dtype_bits(x->dtype);
    PT_CHECK_ARG(bits == 8 || bits == 16 || bits == 32, "transpose: dtype ", dtype_name(x->dtype),
                 " is not 1, 2 or 4 bytes an element");
    if (batch == 0 || rows == 0 || cols == 0) return;
    const int device = current_device();
    bind_device_context(device);
    const PtTransposeFn run = load_kernel(bits / 8);
    PtTransposeParams params{x->data, y->data, batch, rows, cols, stream};
    char err[512] = {0};
    if (run(&params, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "transpose of ", shape_string(*x), " failed: ", err);
    }
  });
}

pt_status pt_transpose_prepare(int32_t element_bytes) {
  return api_guard([&] { load_kernel(element_bytes); });
}

}  // extern "C"
