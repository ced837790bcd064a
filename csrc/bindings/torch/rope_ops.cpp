// primus_turbo::rope: RoPE of q and k in one launch, forward or backward (the inverse rotation),
// in one native call. The core checks shapes, dtypes, layouts and tables; here: devices, the
// conversions the kernel needs (unit last stride, float32 tables, int32 cu_seqlens), the outputs.
#include <optional>
#include <tuple>

#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

namespace {

// The kernel reads any strides but the last: only a strided last dimension is copied.
Tensor unit_last_stride(const Tensor& t) {
  if (t.dim() == 0 || t.stride(t.dim() - 1) == 1 || t.sizes()[t.dim() - 1] <= 1) return t;
  return as_contiguous(t);
}

std::tuple<Tensor, Tensor> rope(Tensor q_in, Tensor k_in, std::optional<Tensor> cos_in, std::optional<Tensor> sin_in,
                                std::optional<Tensor> positions_in, std::optional<Tensor> cu_seqlens_in,
                                int64_t rotary_dim, double theta, bool interleaved, int64_t layout, bool backward) {
  NamedTensors all{{"q", &q_in}, {"k", &k_in}};
  for (const auto& [name, t] : {std::pair<const char*, std::optional<Tensor>*>{"cos", &cos_in},
                                {"sin", &sin_in},
                                {"positions", &positions_in},
                                {"cu_seqlens", &cu_seqlens_in}})
    if (*t) all.push_back({name, &**t});
  const int32_t device = check_cuda("rope", all);
  const Tensor q = unit_last_stride(q_in), k = unit_last_stride(k_in);
  std::optional<Tensor> cos, sin, positions, cu_seqlens;
  if (cos_in) cos = contiguous_as(*cos_in, ScalarType::Float);
  if (sin_in) sin = contiguous_as(*sin_in, ScalarType::Float);
  if (positions_in) positions = as_contiguous(*positions_in);
  if (cu_seqlens_in) cu_seqlens = contiguous_as(*cu_seqlens_in, ScalarType::Int);
  Tensor q_out = empty_like(q), k_out = empty_like(k);
  if (q.numel() == 0 && k.numel() == 0) return {q_out, k_out};
  pt_tensor pq = to_pt(q), pk = to_pt(k), pqo = to_pt(q_out), pko = to_pt(k_out);
  pt_tensor pc{}, ps{}, pp{}, pu{};
  if (cos) pc = to_pt(*cos);
  if (sin) ps = to_pt(*sin);
  if (positions) pp = to_pt(*positions);
  if (cu_seqlens) pu = to_pt(*cu_seqlens);
  DeviceScope scope(device);
  check_status(pt_rope(&pq, &pk, cos ? &pc : nullptr, sin ? &ps : nullptr, positions ? &pp : nullptr,
                       cu_seqlens ? &pu : nullptr, &pqo, &pko, static_cast<int32_t>(rotary_dim), theta,
                       interleaved ? 1 : 0, static_cast<int32_t>(layout), backward ? 1 : 0, current_stream(device)),
               backward ? "rope backward" : "rope forward");
  return {q_out, k_out};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("rope(Tensor q, Tensor k, Tensor? cos, Tensor? sin, Tensor? positions, Tensor? cu_seqlens, int rotary_dim, "
        "float theta, bool interleaved, int layout, bool backward) -> (Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("rope", TORCH_BOX(&rope));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
