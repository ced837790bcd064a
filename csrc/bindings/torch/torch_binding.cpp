#include "bindings/torch/torch_binding.h"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <vector>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/ops.h>

namespace primus_turbo::torch_binding {

namespace {

// aoti_torch_* codes (c10::DeviceType / c10::ScalarType numbering, stable across releases).
constexpr int32_t kDeviceCpu = 0;
constexpr int32_t kDeviceCuda = 1;
constexpr int32_t kDeviceMeta = 9;

void check_shim(AOTITorchError err, const char* what) {
  if (err != AOTI_TORCH_SUCCESS) fail_with(ErrorKind::Runtime, "torch runtime call failed: ", what);
}

int32_t device_type(const Tensor& t) {
  int32_t type = -1;
  check_shim(aoti_torch_get_device_type(t.get(), &type), "device type");
  return type;
}

}  // namespace

void fail(ErrorKind kind, const std::string& message) {
  const char* tag = "RuntimeError";
  switch (kind) {
    case ErrorKind::Value: tag = "ValueError"; break;
    case ErrorKind::Type: tag = "TypeError"; break;
    case ErrorKind::NotImplemented: tag = "NotImplementedError"; break;
    case ErrorKind::Runtime: break;
  }
  throw std::runtime_error(std::string("[primus_turbo:") + tag + "] " + message);
}

void check_status(pt_status status, const char* context) {
  if (status == PT_SUCCESS) return;
  const std::string message = std::string(context) + ": " + pt_last_error();
  switch (status) {
    case PT_ERROR_INVALID_ARGUMENT: fail(ErrorKind::Value, message);
    case PT_ERROR_NOT_SUPPORTED: fail(ErrorKind::NotImplemented, message);
    default: fail(ErrorKind::Runtime, message);
  }
}

const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::Float8_e4m3fn: return "torch.float8_e4m3fn";
    case ScalarType::Float8_e5m2: return "torch.float8_e5m2";
    case ScalarType::Float8_e8m0fnu: return "torch.float8_e8m0fnu";
    case ScalarType::Float4_e2m1fn_x2: return "torch.float4_e2m1fn_x2";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Byte: return "torch.uint8";
    case ScalarType::Char: return "torch.int8";
    case ScalarType::Short: return "torch.int16";
    case ScalarType::Bool: return "torch.bool";
    default: return "an unsupported dtype";
  }
}

int32_t pt_dtype_of(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return PT_FLOAT32;
    case ScalarType::Half: return PT_FLOAT16;
    case ScalarType::BFloat16: return PT_BFLOAT16;
    case ScalarType::Float8_e4m3fn: return PT_FLOAT8_E4M3;
    case ScalarType::Float8_e5m2: return PT_FLOAT8_E5M2;
    case ScalarType::Float8_e8m0fnu: return PT_FLOAT8_E8M0;
    case ScalarType::Float4_e2m1fn_x2: return PT_FLOAT4_E2M1_X2;
    case ScalarType::Int: return PT_INT32;
    case ScalarType::Long: return PT_INT64;
    case ScalarType::Byte: return PT_UINT8;
    default: return -1;
  }
}

pt_tensor rows_descriptor(const Tensor& t) {
  pt_tensor p{};
  const int32_t dtype = pt_dtype_of(t.scalar_type());
  if (dtype < 0) fail_with(ErrorKind::Type, "dtype ", dtype_name(t.scalar_type()), " is not supported");
  const int64_t numel = t.numel();
  const int64_t hidden = t.dim() ? t.sizes()[t.dim() - 1] : 1;
  p.dtype = dtype;
  p.ndim = 2;
  p.shape[0] = hidden ? numel / hidden : 0;
  p.shape[1] = hidden;
  p.strides[0] = hidden;
  p.strides[1] = 1;
  p.data = numel > 0 ? t.data_ptr() : nullptr;
  return p;
}

pt_tensor to_pt(const Tensor& t) {
  const int32_t dtype = pt_dtype_of(t.scalar_type());
  if (dtype < 0) fail_with(ErrorKind::Type, "dtype ", dtype_name(t.scalar_type()), " is not supported");
  return to_pt(t, dtype);
}

pt_tensor mask_to_pt(const Tensor& t) {
  return t.scalar_type() == ScalarType::Bool ? to_pt(t, PT_UINT8) : to_pt(t);
}

pt_tensor to_pt(const Tensor& t, int32_t dtype) {
  pt_tensor p{};
  const int64_t ndim = t.dim();
  if (ndim > PT_MAX_DIMS) fail_with(ErrorKind::Value, "tensors of more than ", PT_MAX_DIMS, " dimensions are not supported");
  p.dtype = dtype;
  p.ndim = static_cast<int32_t>(ndim);
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  check_shim(aoti_torch_get_sizes(t.get(), &sizes), "sizes");
  check_shim(aoti_torch_get_strides(t.get(), &strides), "strides");
  int64_t numel = 1;
  for (int64_t i = 0; i < ndim; ++i) {
    p.shape[i] = sizes[i];
    p.strides[i] = strides[i];
    numel *= sizes[i];
  }
  p.data = numel > 0 ? t.data_ptr() : nullptr;
  return p;
}

std::string device_string(const Tensor& t) {
  const int32_t type = device_type(t);
  if (type == kDeviceCpu) return "cpu";
  if (type == kDeviceMeta) return "meta";
  if (type == kDeviceCuda) return "cuda:" + std::to_string(t.get_device());
  return "device type " + std::to_string(type);
}

int32_t check_cuda(const char* op, const NamedTensors& tensors) {
  int32_t device = -1;
  for (const auto& [name, t] : tensors) {
    if (device_type(*t) != kDeviceCuda)
      fail_with(ErrorKind::Value, op, ": argument '", name, "' is on ", device_string(*t), "; expected a CUDA device");
    const int32_t index = t->get_device();
    if (device < 0) {
      device = index;
    } else if (index != device) {
      fail_with(ErrorKind::Value, op, ": argument '", name, "' is on cuda:", index, " but the other inputs are on cuda:",
                device);
    }
  }
  return device;
}

void add_present(NamedTensors& all, const char* name, const std::optional<Tensor>& t) {
  if (t) all.push_back({name, &*t});
}

std::string shape_string(const Tensor& t) {
  std::string s = "(";
  const auto sizes = t.sizes();
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(sizes[i]);
  }
  if (sizes.size() == 1) s += ",";
  return s + ")";
}

std::vector<int64_t> contiguous_strides(const int64_t* sizes, int64_t ndim) {
  std::vector<int64_t> strides(static_cast<size_t>(ndim));  // any rank: norms take [..., hidden]
  int64_t s = 1;
  for (int64_t i = ndim - 1; i >= 0; --i) {
    strides[i] = s;
    s *= sizes[i] > 1 ? sizes[i] : 1;
  }
  return strides;
}

Tensor empty(const int64_t* sizes, int64_t ndim, ScalarType dtype, int32_t device) {
  const std::vector<int64_t> strides = contiguous_strides(sizes, ndim);
  AtenTensorHandle h = nullptr;
  check_shim(aoti_torch_empty_strided(ndim, sizes, strides.data(), static_cast<int32_t>(dtype), kDeviceCuda, device, &h),
             "empty_strided");
  return Tensor(h);
}

Tensor empty(std::initializer_list<int64_t> sizes, ScalarType dtype, int32_t device) {
  return empty(sizes.begin(), static_cast<int64_t>(sizes.size()), dtype, device);
}

Tensor empty_like(const Tensor& t) { return empty_like(t, t.scalar_type()); }

Tensor empty_like(const Tensor& t, ScalarType dtype) {
  const auto sizes = t.sizes();
  return empty(sizes.data(), static_cast<int64_t>(sizes.size()), dtype, t.get_device());
}

Tensor as_contiguous(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

Tensor fresh_copy(const Tensor& t) {
  if (!t.is_contiguous()) return torch::stable::contiguous(t);
  Tensor copy = empty(t.sizes().data(), t.dim(), t.scalar_type(), t.get_device());
  torch::stable::copy_(copy, t);
  return copy;
}

Tensor placeholder(int32_t device) { return empty({0}, ScalarType::Byte, device); }

Tensor storage_view(const Tensor& base, int64_t offset, ScalarType dtype, const std::vector<int64_t>& sizes) {
  const std::vector<int64_t> strides = contiguous_strides(sizes.data(), static_cast<int64_t>(sizes.size()));
  AtenTensorHandle h = nullptr;
  check_shim(aoti_torch__alloc_from_pool(base.get(), offset, static_cast<int32_t>(dtype),
                                         static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(), &h),
             "storage view");
  return Tensor(h);
}

Tensor contiguous_as(const Tensor& t, ScalarType dtype) {
  if (t.scalar_type() == dtype) return torch_binding::as_contiguous(t);
  return torch_binding::as_contiguous(torch::stable::to(t, dtype));
}

void* current_stream(int32_t device) {
  void* stream = nullptr;
  check_shim(aoti_torch_get_current_cuda_stream(device, &stream), "current CUDA stream");
  return stream;
}

DeviceScope::DeviceScope(int32_t device) {
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) fail(ErrorKind::Runtime, "cudaGetDevice failed");
  if (current != device) {
    if (cudaSetDevice(device) != cudaSuccess) fail_with(ErrorKind::Runtime, "cudaSetDevice(", device, ") failed");
    previous_ = current;
  }
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

bool is_capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) return false;
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace primus_turbo::torch_binding
