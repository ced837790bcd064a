// primus_turbo::fused_adamw_ / fused_adamw_fp8_blocks_: one AdamW step over a list of parameters in
// one native call (the core launches one pass per 32 tensors), the second also writing each updated
// param's FP8 copy in 128 x 128 blocks. The core checks dtypes, shapes and the hyper-parameters; here:
// the lists, devices, and that the tensors written in place are contiguous.
#include <optional>
#include <string>
#include <vector>

#include "bindings/torch/torch_binding.h"
#include "primus_turbo/optim.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr const char* kOp = "fused_adamw";

// The descriptors of the four lists (checked: lengths, one CUDA device, the tensors written in
// place contiguous; the grads made contiguous into grads_c). Returns the device.
struct Lists {
  std::vector<Tensor> grads_c;
  std::vector<pt_tensor> p, g, m, v;
};

int32_t bind_lists(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                   const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                   const std::vector<std::pair<const std::vector<Tensor>*, const char*>>& outputs,
                   const std::optional<Tensor>& amax, Lists& out) {
  const size_t n = params.size();
  for (const auto& [list, name] : {std::pair{&grads, "grads"}, std::pair{&exp_avgs, "exp_avgs"},
                                   std::pair{&exp_avg_sqs, "exp_avg_sqs"}}) {
    if (list->size() != n)
      fail_with(ErrorKind::Value, kOp, ": argument '", name, "' has ", list->size(), " tensors; expected ", n,
                " (one per param)");
  }
  for (const auto& [list, name] : outputs) {
    if (list->size() != n)
      fail_with(ErrorKind::Value, kOp, ": argument '", name, "' has ", list->size(), " tensors; expected ", n,
                " (one per param)");
  }
  std::vector<std::pair<const std::vector<Tensor>*, const char*>> all_lists{
      {&params, "params"}, {&grads, "grads"}, {&exp_avgs, "exp_avgs"}, {&exp_avg_sqs, "exp_avg_sqs"}};
  all_lists.insert(all_lists.end(), outputs.begin(), outputs.end());
  std::vector<std::string> names;  // stable storage for the NamedTensors below
  names.reserve(all_lists.size() * n);
  NamedTensors all;
  for (size_t i = 0; i < n; ++i) {
    for (const auto& [list, name] : all_lists) {
      names.push_back(std::string(name) + "[" + std::to_string(i) + "]");
      all.push_back({names.back().c_str(), &(*list)[i]});
    }
  }
  add_present(all, "amax", amax);
  const int32_t device = n ? check_cuda(kOp, all) : -1;
  for (size_t i = 0; i < n; ++i) {
    for (const auto& [list, name] : all_lists) {
      if (list != &grads && !(*list)[i].is_contiguous())  // written in place: a copy would drop the update
        fail_with(ErrorKind::Value, kOp, ": argument '", name, "[", i, "]' must be contiguous (it is written in place)");
    }
  }
  out.grads_c.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.grads_c.push_back(as_contiguous(grads[i]));
    out.p.push_back(to_pt(params[i]));
    out.g.push_back(to_pt(out.grads_c[i]));
    out.m.push_back(to_pt(exp_avgs[i]));
    out.v.push_back(to_pt(exp_avg_sqs[i]));
  }
  return device;
}

void fused_adamw(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> exp_avgs,
                 std::vector<Tensor> exp_avg_sqs, std::optional<Tensor> amax, double lr, double beta1, double beta2,
                 double eps, double weight_decay, int64_t step) {
  const size_t n = params.size();
  Lists l;
  const int32_t device = bind_lists(params, grads, exp_avgs, exp_avg_sqs, {}, amax, l);
  if (n == 0) return;
  if (amax && (amax->scalar_type() != ScalarType::Float || amax->numel() != static_cast<int64_t>(n) ||
               !amax->is_contiguous()))
    fail_with(ErrorKind::Value, kOp, ": argument 'amax' must be a contiguous float32 tensor of ", n,
              " elements (one per param), got ", dtype_name(amax->scalar_type()), " ", shape_string(*amax));
  const pt_adamw_config config{lr, beta1, beta2, eps, weight_decay, step};
  DeviceScope scope(device);
  check_status(pt_adamw_step(l.p.data(), l.g.data(), l.m.data(), l.v.data(), static_cast<int32_t>(n), &config,
                             amax ? static_cast<float*>(amax->data_ptr()) : nullptr, current_stream(device)),
               kOp);
}

// fused_adamw with each param's FP8 copy in 128 x 128 blocks written from the update (qdata: the
// params' shapes, FP8; scale_inv: float32, ceil(rows/128) x ceil(cols/128) each; qdata_t: each
// matrix's transposed copy, or an empty tensor for none).
void fused_adamw_fp8_blocks(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> exp_avgs,
                            std::vector<Tensor> exp_avg_sqs, std::vector<Tensor> qdata, std::vector<Tensor> scale_inv,
                            std::vector<Tensor> qdata_t, double lr, double beta1, double beta2, double eps,
                            double weight_decay, int64_t step) {
  const size_t n = params.size();
  Lists l;
  const int32_t device = bind_lists(params, grads, exp_avgs, exp_avg_sqs,
                                    {{&qdata, "qdata"}, {&scale_inv, "scale_inv"}, {&qdata_t, "qdata_t"}},
                                    std::nullopt, l);
  if (n == 0) return;
  std::vector<pt_tensor> pq, ps, pqt;
  for (size_t i = 0; i < n; ++i) {
    pq.push_back(to_pt(qdata[i]));
    ps.push_back(to_pt(scale_inv[i]));
    pqt.push_back(qdata_t[i].numel() ? to_pt(qdata_t[i]) : pt_tensor{});  // empty: no transposed copy
  }
  const pt_adamw_config config{lr, beta1, beta2, eps, weight_decay, step};
  DeviceScope scope(device);
  check_status(pt_adamw_step_fp8_blocks(l.p.data(), l.g.data(), l.m.data(), l.v.data(), static_cast<int32_t>(n),
                                        &config, pq.data(), ps.data(), pqt.data(), current_stream(device)),
               kOp);
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("fused_adamw_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
        "Tensor(d!)? amax, float lr, float beta1, float beta2, float eps, float weight_decay, int step) -> ()");
  m.def("fused_adamw_fp8_blocks_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] qdata, Tensor(e!)[] scale_inv, Tensor(f!)[] qdata_t, float lr, "
        "float beta1, float beta2, "
        "float eps, float weight_decay, int step) -> ()");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("fused_adamw_", TORCH_BOX(&fused_adamw));
  m.impl("fused_adamw_fp8_blocks_", TORCH_BOX(&fused_adamw_fp8_blocks));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
