// Views over the C API's pt_tensor: dtype facts and the layout questions kernels ask.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "primus_turbo/primus_turbo.h"

namespace primus_turbo {

// Size in bits (FP4 packs two values per byte, so bytes are not enough).
int dtype_bits(int32_t dtype);
const char* dtype_name(int32_t dtype);
// Compact name for kernel module names: f32, f16, bf16, ...
const char* dtype_short_name(int32_t dtype);
// The CUDA C++ type of a float32/float16/bfloat16 element in generated kernel sources ("float",
// "__half", "__nv_bfloat16"); nullptr for any other dtype.
const char* cuda_float_type(int32_t dtype);
// float32, float16 or bfloat16: the dtypes of every op's non-quantized tensors.
bool is_float_dtype(int32_t dtype);

// A 2-D matrix seen as stored: rows x cols with one unit stride.
struct Matrix2D {
  const pt_tensor* t = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  bool row_major = true;  // stride(1) == 1; otherwise column-major (stride(0) == 1)
  int64_t ld = 0;         // leading dimension in elements
};

// Checks t is a non-null 2-D tensor with one unit stride and returns how it is stored.
// `name` appears in every message ("argument 'a' ...").
Matrix2D as_matrix(const pt_tensor* t, const char* name);

// Whether a pointer and leading dimension allow 16-byte vector / TMA access.
bool is_aligned16(const Matrix2D& m);

std::string shape_string(const pt_tensor& t);

// ---- checks of the plain-CUDA ops (contiguous tensors); messages name the argument ----
int64_t numel(const pt_tensor& t);
// Row-major contiguous; a dimension of size 1 may have any stride, and an empty tensor any strides.
bool is_contiguous(const pt_tensor& t);
// Non-null, sane rank and sizes, a known dtype, row-major contiguous (a dimension of size 1 may
// have any stride, an empty tensor any strides), data present and aligned to its element.
void check_contiguous(const pt_tensor* t, const char* name);
void check_same_shape(const pt_tensor* t, const char* name, const pt_tensor& like, const char* like_name);
// check_contiguous, the shape and the dtype of `like`.
void check_like(const pt_tensor* t, const char* name, const pt_tensor& like, const char* like_name);
bool aligned16(const void* p);
// Row-major with no padding: every dimension larger than 1 has the packed stride.
bool is_packed(const pt_tensor& t);
// t's leading sizes are exactly dims; else INVALID_ARGUMENT
// "<prefix>argument '<name>' has shape [...]; expected [...]".
void check_shape(const pt_tensor* t, const char* name, std::initializer_list<int64_t> dims,
                 const char* prefix = "");
// Non-null, 0 to PT_MAX_DIMS dimensions, no negative size.
void check_descriptor(const pt_tensor* t, const char* name);
// t holds one float32 value on the device (0-dim or [1], data present): its pointer. Else
// INVALID_ARGUMENT "argument '<name>' is <dtype> <shape>; expected one float32 value (0-dim or [1])".
float* scalar_float32(const pt_tensor& t, const char* name);

}  // namespace primus_turbo
