#include "ops/gemm/gemm_fp8_problem.h"

#include "core/error.h"
#include "core/tensor.h"

namespace primus_turbo::gemm {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

bool is_fp8(int32_t dt) { return dt == PT_FLOAT8_E4M3 || dt == PT_FLOAT8_E5M2; }

// Expected scale shape of an operand with `rows` rows for a scaling (empty dims = 0-dim or [1]).
void check_scale(const pt_tensor* s, int32_t scaling, int64_t rows, int64_t k, const char* name) {
  PT_CHECK_ARG(s != nullptr, "argument '", name, "' must not be null");
  PT_CHECK_ARG(s->dtype == PT_FLOAT32, "argument '", name, "' has dtype ", dtype_name(s->dtype),
               "; expected float32");
  PT_CHECK_ARG(scaling >= 0 && scaling < PT_NUM_FP8_SCALINGS, "argument '", name,
               "': unknown scaling code ", scaling);
  int64_t d0 = 1, d1 = 1;
  int ndim = 2;
  switch (scaling) {
    case PT_FP8_SCALING_TENSOR:
      ndim = 0;
      break;
    case PT_FP8_SCALING_ROW:
      ndim = 1, d0 = rows;
      break;
    case PT_FP8_SCALING_BLOCK_1x128:
      d0 = ceil_div(k, 128), d1 = round_up(rows, 4);
      break;
    default:  // PT_FP8_SCALING_BLOCK_128x128
      d0 = ceil_div(rows, 128), d1 = round_up(ceil_div(k, 128), 4);
      break;
  }
  int64_t numel = 1;
  for (int i = 0; i < s->ndim; ++i) numel *= s->shape[i];
  if (ndim == 0) {
    PT_CHECK_ARG(numel == 1 && s->ndim <= 1, "argument '", name, "' has shape ", shape_string(*s),
                 "; a ", fp8_scaling_name(scaling), " scale is one value (0-dim or [1])");
    return;
  }
  const bool ok = ndim == 1 ? (s->ndim == 1 && s->shape[0] == d0 && (d0 <= 1 || s->strides[0] == 1))
                            : (s->ndim == 2 && s->shape[0] == d0 && s->shape[1] == d1 &&
                               (d1 <= 1 || s->strides[1] == 1) && (d0 <= 1 || s->strides[0] == d1));
  if (ndim == 1) {
    PT_CHECK_ARG(ok, "argument '", name, "' has shape ", shape_string(*s), "; a ",
                 fp8_scaling_name(scaling), " scale must be contiguous [", d0, "]");
  } else {
    PT_CHECK_ARG(ok, "argument '", name, "' has shape ", shape_string(*s), "; a ",
                 fp8_scaling_name(scaling), " scale must be contiguous [", d0, ", ", d1, "]");
  }
}

Fp8Operand operand(const pt_tensor* t, const char* name, int64_t* rows, int64_t* cols) {
  const Matrix2D m = as_matrix(t, name);
  PT_CHECK_ARG(is_fp8(t->dtype), "argument '", name, "' has dtype ", dtype_name(t->dtype),
               "; expected float8_e4m3 or float8_e5m2");
  PT_CHECK_ARG(m.row_major || m.rows <= 1, "argument '", name,
               "' must be row-major [rows, K] (K contiguous: FP8 tensor cores read K-major operands)");
  *rows = m.rows, *cols = m.cols;
  Fp8Operand op;
  op.ptr = t->data;
  op.ld = m.row_major ? m.ld : m.cols;
  op.dtype = t->dtype;
  return op;
}

}  // namespace

const char* fp8_scaling_name(int32_t scaling) {
  switch (scaling) {
    case PT_FP8_SCALING_TENSOR: return "tensorwise";
    case PT_FP8_SCALING_ROW: return "rowwise";
    case PT_FP8_SCALING_BLOCK_1x128: return "1x128-block";
    case PT_FP8_SCALING_BLOCK_128x128: return "128x128-block";
    default: return "unknown";
  }
}

std::string Fp8Problem::key() const {
  return str_cat(m, "x", n, "x", k, "|", dtype_name(a.dtype), "*", dtype_name(b.dtype), ">",
                 dtype_name(d_dtype), "|", fp8_scaling_name(a.scaling), "*",
                 fp8_scaling_name(b.scaling), "|ld", a.ld, ",", b.ld, ",", ldd,
                 accumulate() ? "|accumulate" : "", fast_accum ? "|fast_accum" : "");
}

Fp8Problem make_fp8_problem(const pt_tensor* a, const pt_tensor* a_scale, int32_t a_scaling,
                            const pt_tensor* b, const pt_tensor* b_scale, int32_t b_scaling,
                            const pt_tensor* d, float beta, int32_t flags) {
  PT_CHECK_ARG((flags & ~int32_t{PT_GEMM_FP8_FAST_ACCUM}) == 0, "argument 'flags' has unknown bits (", flags,
               "); expected a combination of pt_gemm_fp8_flag values");
  Fp8Problem p;
  int64_t ka = 0, kb = 0;
  p.a = operand(a, "a", &p.m, &ka);
  p.b = operand(b, "b", &p.n, &kb);
  PT_CHECK_ARG(ka == kb, "inner dimensions do not match: a is ", shape_string(*a), " and b is ",
               shape_string(*b), "; both must be [rows, K] with the same K");
  p.k = ka;
  const bool tensor_a = a_scaling == PT_FP8_SCALING_TENSOR, tensor_b = b_scaling == PT_FP8_SCALING_TENSOR;
  PT_CHECK_ARG(tensor_a == tensor_b, "a and b must both be tensorwise-scaled or neither (got ",
               fp8_scaling_name(a_scaling), " and ", fp8_scaling_name(b_scaling), ")");
  check_scale(a_scale, a_scaling, p.m, p.k, "a_scale");
  check_scale(b_scale, b_scaling, p.n, p.k, "b_scale");
  p.a.scale = static_cast<const float*>(a_scale->data);
  p.b.scale = static_cast<const float*>(b_scale->data);
  p.a.scaling = a_scaling, p.b.scaling = b_scaling;

  const Matrix2D md = as_matrix(d, "out");
  PT_CHECK_ARG(is_float_dtype(d->dtype),
               "output dtype ", dtype_name(d->dtype), " is not supported; expected float32, "
               "float16 or bfloat16");
  PT_CHECK_ARG(md.rows == p.m && md.cols == p.n, "argument 'out' has shape ", shape_string(*d),
               "; expected [", p.m, ", ", p.n, "]");
  PT_CHECK_ARG(md.row_major || p.m <= 1, "argument 'out' must be row-major");
  p.d_dtype = d->dtype;
  p.d = d->data;
  p.ldd = md.row_major ? md.ld : md.cols;
  p.beta = beta;
  p.fast_accum = flags & PT_GEMM_FP8_FAST_ACCUM;
  return p;
}

}  // namespace primus_turbo::gemm
