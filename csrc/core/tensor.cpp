#include "core/tensor.h"

#include <algorithm>
#include <sstream>

namespace primus_turbo {

int dtype_bits(int32_t dtype) {
  switch (dtype) {
    case PT_FLOAT32: return 32;
    case PT_FLOAT16: return 16;
    case PT_BFLOAT16: return 16;
    case PT_FLOAT8_E4M3: return 8;
    case PT_FLOAT8_E5M2: return 8;
    case PT_FLOAT8_E8M0: return 8;
    case PT_FLOAT4_E2M1_X2: return 8;  // one storage element holds two FP4 values
    case PT_INT32: return 32;
    case PT_INT64: return 64;
    case PT_UINT8: return 8;
    default: PT_THROW(PT_ERROR_INVALID_ARGUMENT, "unknown dtype code ", dtype);
  }
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case PT_FLOAT32: return "float32";
    case PT_FLOAT16: return "float16";
    case PT_BFLOAT16: return "bfloat16";
    case PT_FLOAT8_E4M3: return "float8_e4m3fn";
    case PT_FLOAT8_E5M2: return "float8_e5m2";
    case PT_FLOAT8_E8M0: return "float8_e8m0fnu";
    case PT_FLOAT4_E2M1_X2: return "float4_e2m1fn_x2";
    case PT_INT32: return "int32";
    case PT_INT64: return "int64";
    case PT_UINT8: return "uint8";
    default: return "unknown";
  }
}

const char* dtype_short_name(int32_t dtype) {
  switch (dtype) {
    case PT_FLOAT32: return "f32";
    case PT_FLOAT16: return "f16";
    case PT_BFLOAT16: return "bf16";
    case PT_FLOAT8_E4M3: return "e4m3";
    case PT_FLOAT8_E5M2: return "e5m2";
    default: return "x";
  }
}

std::string shape_string(const pt_tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t.ndim; ++i) os << (i ? ", " : "") << t.shape[i];
  os << "]";
  return os.str();
}

Matrix2D as_matrix(const pt_tensor* t, const char* name) {
  PT_CHECK_ARG(t != nullptr, "argument '", name, "' is null");
  PT_CHECK_ARG(t->ndim == 2, "argument '", name, "' must be 2-D, got ", t->ndim,
               "-D with shape ", shape_string(*t));
  dtype_bits(t->dtype);  // validates the code
  Matrix2D m;
  m.t = t;
  m.rows = t->shape[0];
  m.cols = t->shape[1];
  PT_CHECK_ARG(m.rows >= 0 && m.cols >= 0, "argument '", name, "' has a negative dimension ",
               shape_string(*t));
  // An empty matrix has no element to address: any strides will do.
  if (m.rows == 0 || m.cols == 0) {
    m.row_major = true;
    m.ld = std::max<int64_t>(m.cols, 1);
    return m;
  }
  // Row-major when the column stride is 1, column-major when the row stride is 1. A dimension of
  // size 1 has no meaningful stride, so a single row or column can be read either way, and a
  // single element (e.g. an expanded scalar, strides [0, 0]) with any strides at all.
  const int64_t s0 = t->strides[0], s1 = t->strides[1];
  if (s1 == 1 || (m.cols <= 1 && (s0 >= 1 || m.rows <= 1))) {
    m.row_major = true;
    m.ld = m.rows <= 1 ? std::max<int64_t>({s0, m.cols, 1}) : s0;
  } else if (s0 == 1 || (m.rows <= 1 && s1 >= 1)) {
    m.row_major = false;
    m.ld = m.cols <= 1 ? std::max<int64_t>({s1, m.rows, 1}) : s1;
  } else {
    PT_THROW(PT_ERROR_INVALID_ARGUMENT, "argument '", name, "' with shape ", shape_string(*t),
             " and strides [", s0, ", ", s1,
             "] has no unit stride; expected a row-major or column-major matrix (make it "
             "contiguous first)");
  }
  const int64_t inner = m.row_major ? m.cols : m.rows;
  PT_CHECK_ARG(m.ld >= std::max<int64_t>(inner, 1), "argument '", name, "' with shape ",
               shape_string(*t), " has leading dimension ", m.ld, " smaller than its ",
               m.row_major ? "row" : "column", " length ", inner);
  PT_CHECK_ARG(t->data != nullptr || m.rows == 0 || m.cols == 0, "argument '", name,
               "' has a null data pointer");
  return m;
}

bool is_aligned16(const Matrix2D& m) {
  const int64_t bits = dtype_bits(m.t->dtype);
  const auto addr = reinterpret_cast<uintptr_t>(m.t->data);
  return addr % 16 == 0 && (m.ld * bits) % 128 == 0;
}

bool is_contiguous(const pt_tensor& t) {
  if (numel(t) == 0) return true;
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

namespace {

std::string strides_string(const pt_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += str_cat(i ? ", " : "", t.strides[i]);
  return s + "]";
}

}  // namespace

int64_t numel(const pt_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

float* scalar_float32(const pt_tensor& t, const char* name) {
  PT_CHECK_ARG(t.dtype == PT_FLOAT32 && numel(t) == 1 && t.ndim <= 1 && t.data != nullptr, "argument '", name,
               "' is ", dtype_name(t.dtype), " ", shape_string(t), "; expected one float32 value (0-dim or [1])");
  return static_cast<float*>(t.data);
}

// Non-null descriptor, sane rank and sizes, a known dtype, contiguous, data present and aligned
// to its element (the scalar kernels' minimum).
void check_contiguous(const pt_tensor* t, const char* name) {
  PT_CHECK_ARG(t != nullptr, "argument '", name, "' is null");
  PT_CHECK_ARG(t->ndim >= 0 && t->ndim <= PT_MAX_DIMS, "argument '", name, "' has ", t->ndim,
               " dimensions; expected 0 to ", PT_MAX_DIMS);
  for (int i = 0; i < t->ndim; ++i) {
    PT_CHECK_ARG(t->shape[i] >= 0, "argument '", name, "' has a negative dimension ",
                 shape_string(*t));
  }
  const int bits = dtype_bits(t->dtype);  // validates the code
  PT_CHECK_ARG(is_contiguous(*t), "argument '", name, "' with shape ", shape_string(*t),
               " and strides ", strides_string(*t), " must be contiguous (make it contiguous first)");
  if (numel(*t) == 0) return;
  PT_CHECK_ARG(t->data != nullptr, "argument '", name, "' has a null data pointer");
  PT_CHECK_ARG(reinterpret_cast<uintptr_t>(t->data) % (bits / 8) == 0, "argument '", name,
               "' is not aligned to its element size (", bits / 8, " bytes)");
}

void check_same_shape(const pt_tensor* t, const char* name, const pt_tensor& like, const char* like_name) {
  bool same = t->ndim == like.ndim;
  for (int i = 0; same && i < t->ndim; ++i) same = t->shape[i] == like.shape[i];
  PT_CHECK_ARG(same, "argument '", name, "' has shape ", shape_string(*t), "; expected the shape of '",
               like_name, "' ", shape_string(like));
}

void check_like(const pt_tensor* t, const char* name, const pt_tensor& like, const char* like_name) {
  check_contiguous(t, name);
  check_same_shape(t, name, like, like_name);
  PT_CHECK_ARG(t->dtype == like.dtype, "argument '", name, "' has dtype ", dtype_name(t->dtype),
               "; expected the dtype of '", like_name, "' (", dtype_name(like.dtype), ")");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool is_packed(const pt_tensor& t) {
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] > 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

void check_shape(const pt_tensor* t, const char* name, std::initializer_list<int64_t> dims,
                 const char* prefix) {
  int i = 0;
  bool same = true;
  for (int64_t d : dims) same = same && t->shape[i++] == d;
  if (same) return;
  std::string want = "[";
  i = 0;
  for (int64_t d : dims) want += str_cat(i++ ? ", " : "", d);
  PT_THROW(PT_ERROR_INVALID_ARGUMENT, prefix, "argument '", name, "' has shape ", shape_string(*t),
           "; expected ", want, "]");
}

void check_descriptor(const pt_tensor* t, const char* name) {
  PT_CHECK_ARG(t != nullptr, "argument '", name, "' is null");
  PT_CHECK_ARG(t->ndim >= 0 && t->ndim <= PT_MAX_DIMS, "argument '", name, "' has ", t->ndim, " dimensions");
  for (int i = 0; i < t->ndim; ++i) {
    PT_CHECK_ARG(t->shape[i] >= 0, "argument '", name, "' has a negative dimension ", shape_string(*t));
  }
}

bool is_float_dtype(int32_t dtype) { return cuda_float_type(dtype) != nullptr; }

const char* cuda_float_type(int32_t dtype) {
  switch (dtype) {
    case PT_FLOAT32: return "float";
    case PT_FLOAT16: return "__half";
    case PT_BFLOAT16: return "__nv_bfloat16";
    default: return nullptr;
  }
}

}  // namespace primus_turbo
