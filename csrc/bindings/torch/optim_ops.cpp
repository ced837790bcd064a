// primus_turbo::fused_adamw_: one AdamW step over a list of parameters in one native call (the core
// launches one pass per 32 tensors). The core checks dtypes, shapes and the hyper-parameters; here:
// the lists, devices, and that the tensors written in place are contiguous.
#include <optional>
#include <string>
#include <vector>

#include "bindings/torch/torch_binding.h"
#include "primus_turbo/optim.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr const char* kOp = "fused_adamw";

void fused_adamw(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> exp_avgs,
                 std::vector<Tensor> exp_avg_sqs, std::optional<Tensor> amax, double lr, double beta1, double beta2,
                 double eps, double weight_decay, int64_t step) {
  const size_t n = params.size();
  for (const auto& [list, name] : {std::pair{&grads, "grads"}, std::pair{&exp_avgs, "exp_avgs"},
                                   std::pair{&exp_avg_sqs, "exp_avg_sqs"}}) {
    if (list->size() != n)
      fail_with(ErrorKind::Value, kOp, ": argument '", name, "' has ", list->size(), " tensors; expected ", n,
                " (one per param)");
  }
  if (n == 0) return;
  std::vector<std::string> names;  // stable storage for the NamedTensors below
  names.reserve(4 * n + 1);
  NamedTensors all;
  for (size_t i = 0; i < n; ++i) {
    for (const auto& [list, name] : {std::pair{&params, "params"}, std::pair{&grads, "grads"},
                                     std::pair{&exp_avgs, "exp_avgs"}, std::pair{&exp_avg_sqs, "exp_avg_sqs"}}) {
      names.push_back(std::string(name) + "[" + std::to_string(i) + "]");
      all.push_back({names.back().c_str(), &(*list)[i]});
    }
  }
  add_present(all, "amax", amax);
  const int32_t device = check_cuda(kOp, all);
  if (amax && (amax->scalar_type() != ScalarType::Float || amax->numel() != static_cast<int64_t>(n) ||
               !amax->is_contiguous()))
    fail_with(ErrorKind::Value, kOp, ": argument 'amax' must be a contiguous float32 tensor of ", n,
              " elements (one per param), got ", dtype_name(amax->scalar_type()), " ", shape_string(*amax));
  std::vector<Tensor> grads_c;
  grads_c.reserve(n);
  std::vector<pt_tensor> pp(n), pg(n), pm(n), pv(n);
  for (size_t i = 0; i < n; ++i) {
    for (const auto& [list, name] : {std::pair{&params, "params"}, std::pair{&exp_avgs, "exp_avgs"},
                                     std::pair{&exp_avg_sqs, "exp_avg_sqs"}}) {
      if (!(*list)[i].is_contiguous())  // updated in place: a copy would drop the update
        fail_with(ErrorKind::Value, kOp, ": argument '", name, "[", i, "]' must be contiguous (it is updated in place)");
    }
    grads_c.push_back(as_contiguous(grads[i]));
    pp[i] = to_pt(params[i]);
    pg[i] = to_pt(grads_c[i]);
    pm[i] = to_pt(exp_avgs[i]);
    pv[i] = to_pt(exp_avg_sqs[i]);
  }
  const pt_adamw_config config{lr, beta1, beta2, eps, weight_decay, step};
  DeviceScope scope(device);
  check_status(pt_adamw_step(pp.data(), pg.data(), pm.data(), pv.data(), static_cast<int32_t>(n), &config,
                             amax ? static_cast<float*>(amax->data_ptr()) : nullptr, current_stream(device)),
               kOp);
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("fused_adamw_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
        "Tensor(d!)? amax, float lr, float beta1, float beta2, float eps, float weight_decay, int step) -> ()");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("fused_adamw_", TORCH_BOX(&fused_adamw));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
