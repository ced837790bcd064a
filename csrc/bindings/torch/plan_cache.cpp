#include "bindings/torch/plan_cache.h"

#include <cstdlib>

#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

namespace {
PlannerFn g_planner = nullptr;
}  // namespace

Choice plan_with_python(PlannerOp op, const void* request, int32_t device, const char* context) {
  if (!g_planner) fail_with(ErrorKind::Runtime, context, ": no planner is registered (import primus_turbo.pytorch)");
  Choice c;
  char message[2048] = {0};
  const int32_t rc = g_planner(op, request, device, &c.backend, &c.config, message, sizeof(message));
  if (rc == 0) return c;
  const ErrorKind kind = rc == PT_ERROR_INVALID_ARGUMENT ? ErrorKind::Value
                         : rc == PT_ERROR_NOT_SUPPORTED  ? ErrorKind::NotImplemented
                         : rc == 100                     ? ErrorKind::Type
                                                         : ErrorKind::Runtime;
  fail(kind, message);
}

int64_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  if (!v) return 256;
  const uintptr_t low = v & (~v + 1);
  return low > 256 ? 256 : static_cast<int64_t>(low);
}

PlanKey plan_key(std::vector<int64_t> values, std::initializer_list<const char*> env_vars) {
  PlanKey k{std::move(values), {}};
  k.v.push_back(static_cast<int64_t>(pt_settings_epoch()));
  for (const char* var : env_vars) {
    const char* v = std::getenv(var);
    k.env += v ? v : "\x01";
    k.env += '\x02';
  }
  return k;
}

size_t PlanKeyHash::operator()(const PlanKey& k) const {
  uint64_t h = 1469598103934665603ull;
  for (int64_t x : k.v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
  return static_cast<size_t>(h ^ std::hash<std::string>()(k.env));
}

}  // namespace primus_turbo::torch_binding

extern "C" __attribute__((visibility("default"))) void pt_torch_set_planner(primus_turbo::torch_binding::PlannerFn fn) {
  primus_turbo::torch_binding::g_planner = fn;
}
