// Grouped rows between the tight token layout and the per-group padded one (pt_group_pad_rows,
// pt_group_gather_rows): argument checks, the JIT module, the launch. See
// kernels/layout/group_rows.cuh and primus_turbo/layout.h.
#include <string>
#include <tuple>

#include "core/error.h"
#include "core/tensor.h"
#include "primus_turbo/kernels/layout/group_rows_abi.h"
#include "primus_turbo/layout.h"
#include "runtime/device.h"
#include "runtime/jit_runtime.h"

using namespace primus_turbo;

namespace {

constexpr int64_t kMaxGroups = PT_GROUP_ROWS_MAX_GROUPS;

PtGroupRowsFn load_kernel() {
  static jit::LoadedCache<int, PtGroupRowsFn> loaded;
  return loaded.get(0, [&] {
    jit::ModuleRequest r;
    r.name = "group_rows";
    r.needs_cutlass = false;
    r.source =
        "#include \"primus_turbo/kernels/layout/group_rows.cuh\"\n"
        "PT_JIT_EXPORT_GROUP_ROWS(primus_turbo::kernels::layout::GroupRows)\n";
    auto module = jit::get_module(r);  // may compile: outside the cache's lock
    return module->function<PtGroupRowsFn>("pt_group_rows_run");
  });
}

// A 1-D int32 / int64 index tensor of n entries; returns its entry size in bytes.
int32_t check_index(const pt_tensor* t, const char* name, int64_t n, const char* op) {
  check_contiguous(t, name);
  PT_CHECK_ARG(t->dtype == PT_INT32 || t->dtype == PT_INT64, op, ": argument '", name,
               "' must be int32 or int64, got ", dtype_name(t->dtype));
  PT_CHECK_ARG(t->ndim == 1 && t->shape[0] == n, op, ": argument '", name, "' has shape ", shape_string(*t),
               "; expected [", n, "]");
  return t->dtype == PT_INT64 ? 8 : 4;
}

// x and y: 2-D, contiguous, the same dtype and width (any row counts); their pointers, row counts
// and row size in bytes go into p.
void bind_rows(PtGroupRowsParams& p, const pt_tensor* x, const pt_tensor* y, const char* op) {
  check_contiguous(x, "x");
  check_contiguous(y, "y");
  PT_CHECK_ARG(x->ndim == 2, op, ": argument 'x' must be 2-D, got shape ", shape_string(*x));
  PT_CHECK_ARG(y->ndim == 2 && y->shape[1] == x->shape[1], op, ": argument 'y' has shape ", shape_string(*y),
               "; expected [rows, ", x->shape[1], "]");
  PT_CHECK_ARG(y->dtype == x->dtype, op, ": argument 'y' has dtype ", dtype_name(y->dtype), "; expected x's ",
               dtype_name(x->dtype));
  const int64_t bits = static_cast<int64_t>(x->shape[1]) * dtype_bits(x->dtype);
  PT_CHECK_ARG(bits % 8 == 0, op, ": rows of x must be whole bytes");
  p.x = x->data;
  p.y = y->data;
  p.x_rows = x->shape[0];
  p.y_rows = y->shape[0];
  p.row_bytes = bits / 8;
}

void launch(PtGroupRowsParams& p, const char* op) {
  const int device = current_device();
  bind_device_context(device);
  const PtGroupRowsFn run = load_kernel();
  char err[512] = {0};
  if (run(&p, err, sizeof(err)) != 0) PT_THROW(PT_ERROR_CUDA, op, " failed: ", err);
}

}  // namespace

extern "C" {

pt_status pt_group_pad_rows(const pt_tensor* x, const pt_tensor* group_lens, const pt_tensor* group_offs,
                            int64_t align, pt_tensor* y, pt_tensor* lens_out, pt_tensor* offs_out, void* stream) {
  return api_guard([&] {
    constexpr const char* op = "group_pad_rows";
    PT_CHECK_ARG(x != nullptr && y != nullptr && group_lens != nullptr, op, ": x, y and group_lens are required");
    PT_CHECK_ARG(align >= 1 && align <= (1 << 20), op, ": argument 'align' is ", align, "; expected 1 to 2^20");
    check_descriptor(group_lens, "group_lens");
    PT_CHECK_ARG(group_lens->ndim == 1, op, ": argument 'group_lens' must be 1-D, got shape ",
                 shape_string(*group_lens));
    const int64_t groups = group_lens->shape[0];
    PT_CHECK_ARG(groups >= 1 && groups <= kMaxGroups, op, ": ", groups, " groups; 1 to ", kMaxGroups, " supported");
    PtGroupRowsParams p{};
    p.lens_bytes = check_index(group_lens, "group_lens", groups, op);
    if (group_offs) p.offs_bytes = check_index(group_offs, "group_offs", groups + 1, op);
    bind_rows(p, x, y, op);
    for (auto [t, name, n] : {std::tuple<pt_tensor*, const char*, int64_t>{lens_out, "lens_out", groups},
                              {offs_out, "offs_out", groups + 1}}) {
      if (!t) continue;
      check_contiguous(t, name);
      PT_CHECK_ARG(t->dtype == PT_INT64, op, ": argument '", name, "' must be int64, got ", dtype_name(t->dtype));
      check_shape(t, name, {n}, str_cat(op, ": ").c_str());
    }
    p.mode = PT_GROUP_ROWS_PAD;
    p.groups = static_cast<int32_t>(groups);
    p.align = static_cast<int32_t>(align);
    p.lens = group_lens->data;
    p.offs = group_offs ? group_offs->data : nullptr;
    p.lens_out = lens_out ? static_cast<int64_t*>(lens_out->data) : nullptr;
    p.offs_out = offs_out ? static_cast<int64_t*>(offs_out->data) : nullptr;
    p.stream = stream;
    launch(p, op);
  });
}

pt_status pt_group_gather_rows(const pt_tensor* x, const pt_tensor* group_offs, const pt_tensor* group_offs_padded,
                               const pt_tensor* group_lens, pt_tensor* y, void* stream) {
  return api_guard([&] {
    constexpr const char* op = "group_gather_rows";
    PT_CHECK_ARG(x != nullptr && y != nullptr && group_offs != nullptr && group_offs_padded != nullptr, op,
                 ": x, y, group_offs and group_offs_padded are required");
    check_descriptor(group_offs, "group_offs");
    PT_CHECK_ARG(group_offs->ndim == 1, op, ": argument 'group_offs' must be 1-D, got shape ",
                 shape_string(*group_offs));
    const int64_t groups = group_offs->shape[0] - 1;
    PT_CHECK_ARG(groups >= 1 && groups <= kMaxGroups, op, ": ", groups, " groups; 1 to ", kMaxGroups, " supported");
    PtGroupRowsParams p{};
    p.offs_bytes = check_index(group_offs, "group_offs", groups + 1, op);
    p.offs_padded_bytes = check_index(group_offs_padded, "group_offs_padded", groups + 1, op);
    if (group_lens) p.lens_bytes = check_index(group_lens, "group_lens", groups, op);
    bind_rows(p, x, y, op);
    p.mode = PT_GROUP_ROWS_GATHER;
    p.groups = static_cast<int32_t>(groups);
    p.align = 1;
    p.lens = group_lens ? group_lens->data : nullptr;
    p.offs = group_offs->data;
    p.offs_padded = group_offs_padded->data;
    p.stream = stream;
    launch(p, op);
  });
}

pt_status pt_group_rows_prepare(void) {
  return api_guard([&] { load_kernel(); });
}

}  // extern "C"
