#include "bindings/torch/scratch.h"

namespace primus_turbo::torch_binding {

namespace {

size_t element_bytes(ScalarType t) {
  switch (t) {
    case ScalarType::Float:
    case ScalarType::Int: return 4;
    case ScalarType::BFloat16:
    case ScalarType::Half: return 2;
    case ScalarType::Long:
    case ScalarType::Double: return 8;
    default: return 1;  // FP8, uint8 (packed FP4, E8M0 scales)
  }
}

}  // namespace

size_t Scratch::share(const std::vector<int64_t>& shape, ScalarType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return share(static_cast<size_t>(n) * element_bytes(dtype));
}

Scratch::Scratch(int32_t device, size_t capacity) : device_(device), capacity_(capacity) {
  if (capacity_) block_ = empty({static_cast<int64_t>(capacity_)}, ScalarType::Byte, device_);
}

Tensor Scratch::take(const std::vector<int64_t>& shape, ScalarType dtype) {
  const size_t bytes = share(shape, dtype);
  if (!block_ || used_ + bytes > capacity_)
    return empty(shape.data(), static_cast<int64_t>(shape.size()), dtype, device_);
  Tensor t = storage_view(*block_, static_cast<int64_t>(used_), dtype, shape);
  used_ += bytes;
  return t;
}

}  // namespace primus_turbo::torch_binding
