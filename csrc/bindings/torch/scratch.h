// Call-scoped device buffers carved out of one allocation: an op whose launches need several
// intermediates (quantized copies only its own kernels read) makes one trip through torch's caching
// allocator instead of one per buffer. Each take() is a view of that allocation's storage, so it
// keeps the memory alive wherever it goes; a request past the capacity gets its own allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

class Scratch {
 public:
  // Every buffer starts 256-byte aligned, as its own allocation would.
  static constexpr size_t kAlign = 256;
  // A buffer's share of the capacity: its bytes rounded up to the alignment.
  static size_t share(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  static size_t share(const std::vector<int64_t>& shape, ScalarType dtype);

  Scratch(int32_t device, size_t capacity);

  // A contiguous [shape] tensor of dtype.
  Tensor take(const std::vector<int64_t>& shape, ScalarType dtype);

 private:
  int32_t device_;
  size_t capacity_, used_ = 0;
  std::optional<Tensor> block_;
};

}  // namespace primus_turbo::torch_binding
