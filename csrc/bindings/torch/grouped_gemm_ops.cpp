// primus_turbo::grouped_gemm (forward and dgrad) and primus_turbo::grouped_gemm_wgrad, bf16/fp16:
// argument checks, the plan cache (backend, config, workspace size) and the launch in one native
// call. Group sizes stay on the device: nothing here reads them, so no call synchronizes.
#include <vector>

#include <torch/csrc/stable/ops.h>

#include "bindings/torch/debug_readback.h"
#include "bindings/torch/grouped_gemm_run.h"
#include "bindings/torch/plan_cache.h"
#include "bindings/torch/torch_binding.h"
#include "primus_turbo/grouped_gemm.h"

namespace primus_turbo::torch_binding {

namespace {

PlanCache<WorkspacePlan> g_plans;

constexpr const char* kOp = "grouped_gemm";

void check_matrix(const char* name, const Tensor& t, int64_t ndim, const Tensor* like) {
  if (t.dim() != ndim)
    fail_with(ErrorKind::Value, kOp, ": argument '", name, "' must be ", ndim, "-D, got shape ", shape_string(t));
  const ScalarType dt = t.scalar_type();
  if (!like && dt != ScalarType::BFloat16 && dt != ScalarType::Half)
    fail_with(ErrorKind::Type, kOp, ": argument '", name, "' has dtype ", dtype_name(dt),
              "; expected bfloat16 or float16");
  if (like && dt != like->scalar_type())
    fail_with(ErrorKind::Type, kOp, ": argument '", name, "' has dtype ", dtype_name(dt), "; expected the dtype of 'a' (",
              dtype_name(like->scalar_type()), ")");
}

int32_t check_devices(const Tensor& a, const Tensor& b, const char* b_name, const Tensor& lens,
                      const std::optional<Tensor>& offs) {
  NamedTensors all{{"a", &a}, {b_name, &b}, {"group_lens", &lens}};
  if (offs) all.push_back({"group_offs", &*offs});
  return check_cuda(kOp, all);
}

Tensor grouped_gemm(Tensor a, Tensor b, Tensor group_lens, std::optional<Tensor> group_offs, bool trans_b,
                    int64_t num_sms) {
  check_matrix("a", a, 2, nullptr);
  check_matrix("b", b, 3, &a);
  check_group_tensors(group_lens, group_offs, b.sizes()[0]);
  const auto bs = b.sizes();
  const int64_t kb = trans_b ? bs[2] : bs[1], n = trans_b ? bs[1] : bs[2];
  if (kb != a.sizes()[1])
    fail_with(ErrorKind::Value, kOp, ": inner dimensions do not match: 'a' is ", shape_string(a), " but 'b' ",
              shape_string(b), " has K = ", kb, " (trans_b=", trans_b ? "True" : "False", ")");
  const int32_t device = check_devices(a, b, "b", group_lens, group_offs);
  Tensor out = empty({a.sizes()[0], n}, a.scalar_type(), device);
  // Given offsets may leave rows between or before the groups (blocks padded past their lengths):
  // those come back as zeros, not as what the allocator held.
  if (group_offs) torch::stable::zero_(out);
  grouped_gemm_run(a, b, group_lens, group_offs, out, false, trans_b, num_sms, device);
  return out;
}

Tensor grouped_gemm_wgrad(Tensor a, Tensor grad_out, Tensor group_lens, std::optional<Tensor> group_offs,
                          bool trans_b, int64_t num_sms) {
  check_matrix("a", a, 2, nullptr);
  check_matrix("grad_out", grad_out, 2, &a);
  const int64_t g = check_group_tensors(group_lens, group_offs, -1);
  if (grad_out.sizes()[0] != a.sizes()[0])
    fail_with(ErrorKind::Value, kOp, ": argument 'grad_out' has shape ", shape_string(grad_out), "; expected ",
              a.sizes()[0], " rows like 'a'");
  const int64_t k = a.sizes()[1], n = grad_out.sizes()[1];
  const int32_t device = check_devices(a, grad_out, "grad_out", group_lens, group_offs);
  Tensor out = trans_b ? empty({g, n, k}, a.scalar_type(), device) : empty({g, k, n}, a.scalar_type(), device);
  grouped_gemm_run(a, grad_out, group_lens, group_offs, out, true, trans_b, num_sms, device);
  return out;
}

}  // namespace

int64_t check_group_tensors(const Tensor& lens, const std::optional<Tensor>& offs, int64_t num_groups) {
  if (lens.scalar_type() != ScalarType::Long)
    fail_with(ErrorKind::Type, kOp, ": argument 'group_lens' has dtype ", dtype_name(lens.scalar_type()),
              "; expected torch.int64");
  if (lens.dim() != 1 || lens.sizes()[0] < 1)
    fail_with(ErrorKind::Value, kOp, ": argument 'group_lens' must be 1-D with at least one group, got shape ",
              shape_string(lens));
  const int64_t g = lens.sizes()[0];
  if (num_groups >= 0 && g != num_groups)
    fail_with(ErrorKind::Value, kOp, ": argument 'group_lens' has ", g, " groups but 'b' has ", num_groups);
  if (offs) {
    if (offs->scalar_type() != ScalarType::Long)
      fail_with(ErrorKind::Type, kOp, ": argument 'group_offs' has dtype ", dtype_name(offs->scalar_type()),
                "; expected torch.int64");
    if (offs->dim() != 1 || offs->sizes()[0] != g + 1)
      fail_with(ErrorKind::Value, kOp, ": argument 'group_offs' has shape ", shape_string(*offs), "; expected [", g + 1,
                "] (G + 1 offsets)");
  }
  return g;
}

void check_group_lens_on_host(const char* op, const Tensor& lens, int64_t rows, void* stream) {
  constexpr const char* kVar = "PRIMUS_TURBO_CHECK_GROUP_LENS";
  if (!debug_readback_on(kVar, stream)) return;
  const std::vector<int64_t> host = read_back<int64_t>(op, lens, "group_lens", kVar, stream);
  int64_t total = 0;
  for (size_t g = 0; g < host.size(); ++g) {
    if (host[g] < 0)
      fail_with(ErrorKind::Value, op, ": group_lens[", g, "] = ", host[g], " is negative");
    total += host[g];
  }
  if (total > rows)
    fail_with(ErrorKind::Value, op, ": group_lens adds up to ", total, ", more than the ", rows, " rows of 'a'");
}

void grouped_gemm_run(const Tensor& a_in, const Tensor& b_in, const Tensor& lens_in, const std::optional<Tensor>& offs_in,
                      const Tensor& out, bool wgrad, bool trans_b, int64_t num_sms, int32_t device) {
  if (out.numel() == 0) return;
  const Tensor a = as_contiguous(a_in), b = as_contiguous(b_in), lens = as_contiguous(lens_in);
  std::optional<Tensor> offs;
  if (offs_in) offs = as_contiguous(*offs_in);
  const pt_tensor pa = to_pt(a), pb = to_pt(b), pl = to_pt(lens), pd = to_pt(out);
  pt_tensor po{};
  if (offs) po = to_pt(*offs);
  if (num_sms < 0 || num_sms > INT32_MAX)
    fail_with(ErrorKind::Value, kOp, ": num_cu must be a positive int or None, got ", num_sms);
  const pt_grouped_gemm_args args{&pa,          &pb,           &pl, offs ? &po : nullptr, &pd, wgrad ? 1 : 0,
                                  trans_b ? 1 : 0, static_cast<int32_t>(num_sms)};
  DeviceScope scope(device);
  void* stream = current_stream(device);
  check_group_lens_on_host(kOp, lens, pa.shape[0], stream);

  std::vector<int64_t> values{pa.shape[0], pa.shape[1], pb.shape[0], pb.shape[1], pb.ndim > 2 ? pb.shape[2] : -1,
                              pl.shape[0], offs ? 1 : 0, pa.dtype, (wgrad ? 1 : 0) | (trans_b ? 2 : 0), device,
                              alignment(pa.data) >= 16, alignment(pb.data) >= 16, alignment(pd.data) >= 16, num_sms};
  const PlanKey key = plan_key(std::move(values), {"PRIMUS_TURBO_GROUPED_GEMM_BACKEND", "PRIMUS_TURBO_AUTO_TUNE"});
  const WorkspacePlan plan = workspace_plan(
      g_plans, key, kPlanGroupedGemm, &args, device, stream, kOp,
      [&](int32_t backend, int32_t config, size_t* bytes) {
        return pt_grouped_gemm_workspace_size(&args, backend, config, bytes);
      });
  const Tensor ws = plan_workspace(plan, device);
  check_status(pt_grouped_gemm(&args, plan.choice.backend, plan.choice.config, ws.data_ptr(), plan.workspace_bytes,
                               stream),
               kOp);
}

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("grouped_gemm(Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs, bool trans_b, int num_sms) -> Tensor");
  m.def("grouped_gemm_wgrad(Tensor a, Tensor grad_out, Tensor group_lens, Tensor? group_offs, bool trans_b, "
        "int num_sms) -> Tensor");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("grouped_gemm", TORCH_BOX(&grouped_gemm));
  m.impl("grouped_gemm_wgrad", TORCH_BOX(&grouped_gemm_wgrad));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
