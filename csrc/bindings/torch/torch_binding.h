// The PyTorch binding's native layer: operators registered with torch's dispatcher through the
// stable C ABI (torch/csrc/stable), one call per op from Python. Each op checks its arguments,
// allocates outputs from torch's caching allocator, finds its plan and calls the core's C API on
// torch's current stream. Nothing here includes ATen or pybind: only the stable headers, so the
// built library serves every torch release from TORCH_TARGET_VERSION on.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include "primus_turbo/primus_turbo.h"

namespace primus_turbo::torch_binding {

using torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;

// Python exception class an error maps to. The Python layer (primus_turbo/pytorch/core/native.py)
// turns the tag that opens the message back into the class, so a C++ check raises exactly what
// the fake (meta) implementation raises for the same input.
enum class ErrorKind { Value, Type, NotImplemented, Runtime };

[[noreturn]] void fail(ErrorKind kind, const std::string& message);

// Message pieces are appended with std::to_string rather than iostreams: no locale facets on the
// error path of a kernel registered with another library's dispatcher.
inline void append_piece(std::string& s, const char* v) { s += v; }
inline void append_piece(std::string& s, const std::string& v) { s += v; }
inline void append_piece(std::string& s, char v) { s += v; }
template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
inline void append_piece(std::string& s, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    s += v ? "True" : "False";
  } else {
    s += std::to_string(v);
  }
}

template <typename... Args>
[[noreturn]] void fail_with(ErrorKind kind, const Args&... parts) {
  std::string message;
  (append_piece(message, parts), ...);
  fail(kind, message);
}

// A non-zero status of the core becomes the matching error, carrying pt_last_error().
void check_status(pt_status status, const char* context);

// "torch.bfloat16", as Python prints dtypes (messages match the fake implementations').
const char* dtype_name(ScalarType t);
// The core's pt_dtype of a torch dtype, or -1.
int32_t pt_dtype_of(ScalarType t);
// float32, float16 or bfloat16: the high-precision dtypes the ops take and return.
inline bool is_float_dtype(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Half || t == ScalarType::BFloat16;
}
pt_tensor to_pt(const Tensor& t);
// The descriptor of t read as core dtype `dtype` (same element size), e.g. bool as uint8.
pt_tensor to_pt(const Tensor& t, int32_t dtype);
// A routing mask: bool read as uint8 (same bytes), other dtypes as they are.
pt_tensor mask_to_pt(const Tensor& t);
// A contiguous t of any rank seen as [rows, hidden] (hidden: its last dimension).
pt_tensor rows_descriptor(const Tensor& t);

// "cuda:0", "cpu", "meta": how Python prints a tensor's device.
std::string device_string(const Tensor& t);
// Every tensor is on one CUDA device; returns its index. Messages as _checks.check_cuda_tensors.
using NamedTensors = std::vector<std::pair<const char*, const Tensor*>>;
int32_t check_cuda(const char* op, const NamedTensors& tensors);
// Appends (name, t) to `all` when the optional tensor is present.
void add_present(NamedTensors& all, const char* name, const std::optional<Tensor>& t);

// An optional tensor's descriptor and the pointer the C API takes for it (null when absent).
struct OptionalPt {
  explicit OptionalPt(const std::optional<Tensor>& t) : present_(t.has_value()) {
    if (present_) desc_ = to_pt(*t);
  }
  pt_tensor* get() { return present_ ? &desc_ : nullptr; }

 private:
  pt_tensor desc_{};
  bool present_;
};

std::string shape_string(const Tensor& t);

// Row-major strides of [sizes] (a size-1 dimension counts as 1).
std::vector<int64_t> contiguous_strides(const int64_t* sizes, int64_t ndim);
// Row-major [sizes] of dtype on a CUDA device, from torch's caching allocator (graph-safe).
Tensor empty(std::initializer_list<int64_t> sizes, ScalarType dtype, int32_t device);
Tensor empty(const int64_t* sizes, int64_t ndim, ScalarType dtype, int32_t device);
Tensor empty_like(const Tensor& t);
// Row-major, t's sizes and device, another dtype.
Tensor empty_like(const Tensor& t, ScalarType dtype);
// t itself when contiguous, else a contiguous copy.
Tensor as_contiguous(const Tensor& t);
// A contiguous copy in a fresh allocation (16-byte aligned), even when t is contiguous.
Tensor fresh_copy(const Tensor& t);
// t itself when it has dtype and is contiguous, else a contiguous copy converted to dtype.
Tensor contiguous_as(const Tensor& t, ScalarType dtype);
// The empty uint8 tensor an op returns for an output not asked for (a gradient, a saved copy).
Tensor placeholder(int32_t device);
// A tensor of `dtype` and contiguous `sizes` on base's memory from byte `offset` on (base a byte
// buffer, say): it shares base's storage, so it keeps that memory alive.
Tensor storage_view(const Tensor& base, int64_t offset, ScalarType dtype, const std::vector<int64_t>& sizes);

// torch's current stream on device.
void* current_stream(int32_t device);

// Makes device current for the scope when it is not already (no guard object otherwise).
class DeviceScope {
 public:
  explicit DeviceScope(int32_t device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int32_t previous_ = -1;
};

// Whether stream is being captured into a CUDA graph.
bool is_capturing(void* stream);

}  // namespace primus_turbo::torch_binding

// Registers an op file's kernels, `register_kernels(m)` (a function of the file that calls m.impl for
// each of its ops), for CUDA and for CPU: a CPU tensor then gets the op's own "expected a CUDA
// device" error, as the fake implementation gives it, instead of the dispatcher's.
#define PT_REGISTER_CUDA_AND_CPU(register_kernels)                              \
  STABLE_TORCH_LIBRARY_IMPL(primus_turbo, CUDA, m) { register_kernels(m); } \
  STABLE_TORCH_LIBRARY_IMPL(primus_turbo, CPU, m) { register_kernels(m); }

