// primus_turbo::group_pad_rows / group_gather_rows: grouped tokens between their tight layout and
// the per-group padded one, one native call and one launch each (the Python composition of the
// same was some twenty small torch ops). The core checks shapes and dtypes; here: devices, the
// outputs, contiguity.
#include <optional>
#include <tuple>

#include "bindings/torch/torch_binding.h"
#include "primus_turbo/layout.h"

namespace primus_turbo::torch_binding {

namespace {

// (x padded [rows, C], padded lens [G] int64, padded offsets [G + 1] int64).
std::tuple<Tensor, Tensor, Tensor> group_pad_rows(Tensor x_in, Tensor group_lens, std::optional<Tensor> group_offs,
                                                  int64_t rows, int64_t align) {
  NamedTensors all{{"x", &x_in}, {"group_lens", &group_lens}};
  add_present(all, "group_offs", group_offs);
  const int32_t device = check_cuda("group_pad_rows", all);
  if (x_in.dim() != 2) fail_with(ErrorKind::Value, "group_pad_rows: argument 'x' must be 2-D, got shape ",
                                 shape_string(x_in));
  if (rows < 0) fail_with(ErrorKind::Value, "group_pad_rows: argument 'rows' is ", rows, "; expected >= 0");
  const Tensor x = as_contiguous(x_in), lens = as_contiguous(group_lens);
  std::optional<Tensor> offs;
  if (group_offs) offs = as_contiguous(*group_offs);
  const int64_t groups = lens.dim() == 1 ? lens.sizes()[0] : 0;
  Tensor y = empty({rows, x.sizes()[1]}, x.scalar_type(), device);
  Tensor lens_out = empty({groups}, ScalarType::Long, device), offs_out = empty({groups + 1}, ScalarType::Long, device);
  const pt_tensor px = to_pt(x), pl = to_pt(lens);
  pt_tensor po{}, py = to_pt(y), plo = to_pt(lens_out), poo = to_pt(offs_out);
  if (offs) po = to_pt(*offs);
  DeviceScope scope(device);
  check_status(pt_group_pad_rows(&px, &pl, offs ? &po : nullptr, align, &py, &plo, &poo, current_stream(device)),
               "grouped tokens");
  return {y, lens_out, offs_out};
}

// x padded -> [tokens, C], the rows of each group back at group_offs.
Tensor group_gather_rows(Tensor x_in, Tensor group_offs, Tensor group_offs_padded, int64_t tokens,
                         std::optional<Tensor> group_lens) {
  NamedTensors all{{"x", &x_in}, {"group_offs", &group_offs}, {"group_offs_padded", &group_offs_padded}};
  add_present(all, "group_lens", group_lens);
  const int32_t device = check_cuda("group_gather_rows", all);
  if (x_in.dim() != 2) fail_with(ErrorKind::Value, "group_gather_rows: argument 'x' must be 2-D, got shape ",
                                 shape_string(x_in));
  if (tokens < 0) fail_with(ErrorKind::Value, "group_gather_rows: argument 'tokens' is ", tokens, "; expected >= 0");
  const Tensor x = as_contiguous(x_in), offs = as_contiguous(group_offs), poffs = as_contiguous(group_offs_padded);
  std::optional<Tensor> lens;
  if (group_lens) lens = as_contiguous(*group_lens);
  Tensor y = empty({tokens, x.sizes()[1]}, x.scalar_type(), device);
  const pt_tensor px = to_pt(x), po = to_pt(offs), ppo = to_pt(poffs);
  pt_tensor pl{}, py = to_pt(y);
  if (lens) pl = to_pt(*lens);
  DeviceScope scope(device);
  check_status(pt_group_gather_rows(&px, &po, &ppo, lens ? &pl : nullptr, &py, current_stream(device)),
               "grouped tokens");
  return y;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("group_pad_rows(Tensor x, Tensor group_lens, Tensor? group_offs, int rows, int align) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("group_gather_rows(Tensor x, Tensor group_offs, Tensor group_offs_padded, int tokens, Tensor? group_lens) "
        "-> Tensor");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("group_pad_rows", TORCH_BOX(&group_pad_rows));
  m.impl("group_gather_rows", TORCH_BOX(&group_gather_rows));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
