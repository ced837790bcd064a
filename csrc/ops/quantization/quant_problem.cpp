#include "ops/quantization/quant_problem.h"

#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace primus_turbo::quant {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up4(int64_t a) { return ceil_div(a, 4) * 4; }


const char* granularity_name(int32_t g) {
  switch (g) {
    case PT_QUANT_TENSORWISE: return "TENSORWISE";
    case PT_QUANT_ROWWISE: return "ROWWISE";
    case PT_QUANT_BLOCKWISE: return "BLOCKWISE";
    case PT_QUANT_MX_BLOCKWISE: return "MX_BLOCKWISE";
    default: return "unknown";
  }
}

// Non-null, sane rank, known dtype, contiguous, data present when non-empty.
void check_tensor(const pt_tensor* t, const char* name) {
  PT_CHECK_ARG(t != nullptr, "argument '", name, "' is null");
  PT_CHECK_ARG(t->ndim >= 0 && t->ndim <= PT_MAX_DIMS, "argument '", name, "' has ", t->ndim,
               " dimensions; expected 0 to ", PT_MAX_DIMS);
  for (int i = 0; i < t->ndim; ++i) {
    PT_CHECK_ARG(t->shape[i] >= 0, "argument '", name, "' has a negative dimension ", shape_string(*t));
  }
  const int bits = dtype_bits(t->dtype);
  PT_CHECK_ARG(is_contiguous(*t), "argument '", name, "' with shape ", shape_string(*t),
               " must be contiguous (make it contiguous first)");
  if (numel(*t) == 0) return;
  PT_CHECK_ARG(t->data != nullptr, "argument '", name, "' has a null data pointer");
  PT_CHECK_ARG(reinterpret_cast<uintptr_t>(t->data) % (bits / 8) == 0, "argument '", name,
               "' is not aligned to its element size");
}

void check_shape2(const pt_tensor* t, const char* name, int64_t rows, int64_t cols) {
  PT_CHECK_ARG(t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols, "argument '", name, "' has shape ",
               shape_string(*t), "; expected [", rows, ", ", cols, "]");
}

// [rows, cols], or [batch, rows, cols] for a stack of matrices (batch > 0).
void check_shape(const pt_tensor* t, const char* name, int64_t batch, int64_t rows, int64_t cols) {
  if (batch == 0) return check_shape2(t, name, rows, cols);
  PT_CHECK_ARG(t->ndim == 3 && t->shape[0] == batch && t->shape[1] == rows && t->shape[2] == cols, "argument '",
               name, "' has shape ", shape_string(*t), "; expected [", batch, ", ", rows, ", ", cols, "]");
}

void check_numel(const pt_tensor* t, const char* name, int64_t n, const char* what) {
  PT_CHECK_ARG(numel(*t) == n, "argument '", name, "' has shape ", shape_string(*t), " (", numel(*t),
               " elements); expected ", n, " (", what, ")");
}

void check_scale_dtype(const pt_tensor* s, const char* name, int32_t granularity) {
  if (granularity == PT_QUANT_MX_BLOCKWISE) {
    PT_CHECK_ARG(s->dtype == PT_FLOAT8_E8M0 || s->dtype == PT_UINT8, "argument '", name, "' has dtype ",
                 dtype_name(s->dtype), "; MX_BLOCKWISE scales are float8_e8m0fnu (or uint8)");
  } else {
    PT_CHECK_ARG(s->dtype == PT_FLOAT32, "argument '", name, "' has dtype ", dtype_name(s->dtype), "; ",
                 granularity_name(granularity), " scales are float32");
  }
}

int32_t canonical_q_dtype(int32_t dt) { return dt == PT_UINT8 ? PT_FLOAT4_E2M1_X2 : dt; }

void check_granularity_block(int32_t granularity, int32_t block, bool fp4) {
  PT_CHECK_ARG(granularity >= PT_QUANT_TENSORWISE && granularity <= PT_QUANT_MX_BLOCKWISE,
               "argument 'granularity' is ", granularity, "; expected 0 (TENSORWISE) to 3 (MX_BLOCKWISE)");
  if (fp4) {
    PT_CHECK_ARG(granularity == PT_QUANT_MX_BLOCKWISE, "FP4 quantization is MX_BLOCKWISE only, got ",
                 granularity_name(granularity));
  }
  if (granularity == PT_QUANT_BLOCKWISE) {
    PT_CHECK_SUPPORTED(block == 32 || block == 64 || block == 128, "argument 'block_size' is ", block,
                       "; BLOCKWISE supports 32, 64 or 128");
  } else if (granularity == PT_QUANT_MX_BLOCKWISE) {
    PT_CHECK_ARG(block == 32, "argument 'block_size' is ", block, "; MX_BLOCKWISE needs 32");
  }
}

}  // namespace

QuantProblem make_quant_problem(const pt_tensor* x, const pt_tensor* q_row, const pt_tensor* s_row,
                                const pt_tensor* q_col, const pt_tensor* s_col, int32_t granularity,
                                int32_t block_size, int32_t col_transposed, int32_t flags) {
  check_tensor(x, "x");
  PT_CHECK_ARG(x->ndim == 2 || x->ndim == 3, "argument 'x' has shape ", shape_string(*x),
               "; expected a 2-D tensor [m, k] (or a stack of them, [b, m, k])");
  PT_CHECK_ARG(is_float_dtype(x->dtype), "argument 'x' has dtype ", dtype_name(x->dtype),
               "; expected float32, float16 or bfloat16");
  PT_CHECK_ARG((flags & ~(PT_QUANT_2D_BLOCK | PT_QUANT_RHT | PT_QUANT_SR | PT_QUANT_SCALES_MN_MAJOR |
                          PT_QUANT_SCALES_PAD4)) == 0,
               "argument 'flags' is ", flags,
               "; unknown bits set");
  QuantProblem p;
  const int64_t batch = x->ndim == 3 ? x->shape[0] : 0;  // 0: one matrix
  const int64_t mm = x->shape[x->ndim - 2];               // rows of each matrix
  p.m = batch ? batch * mm : mm;
  p.k = x->shape[x->ndim - 1];
  p.x_dtype = x->dtype;
  p.row = q_row != nullptr;
  p.col = q_col != nullptr;
  PT_CHECK_ARG(p.row || p.col, "arguments 'q_row' and 'q_col' are both null; at least one output is needed");
  PT_CHECK_ARG(!p.row || s_row != nullptr, "argument 's_row' is null but 'q_row' is given");
  PT_CHECK_ARG(!p.col || s_col != nullptr, "argument 's_col' is null but 'q_col' is given");
  if (p.row) check_tensor(q_row, "q_row");
  if (p.col) check_tensor(q_col, "q_col");
  const int32_t q_dtype = canonical_q_dtype(p.row ? q_row->dtype : q_col->dtype);
  PT_CHECK_ARG(q_dtype == PT_FLOAT8_E4M3 || q_dtype == PT_FLOAT8_E5M2 || q_dtype == PT_FLOAT4_E2M1_X2,
               "argument '", p.row ? "q_row" : "q_col", "' has dtype ",
               dtype_name(p.row ? q_row->dtype : q_col->dtype),
               "; expected float8_e4m3fn, float8_e5m2 or float4_e2m1fn_x2 (uint8)");
  if (p.row && p.col) {
    PT_CHECK_ARG(canonical_q_dtype(q_col->dtype) == q_dtype, "argument 'q_col' has dtype ",
                 dtype_name(q_col->dtype), "; expected the dtype of 'q_row' (", dtype_name(q_row->dtype), ")");
  }
  p.q_dtype = q_dtype;
  p.granularity = granularity;
  p.block = block_size;
  p.col_transposed = col_transposed != 0;
  p.block_2d = (flags & PT_QUANT_2D_BLOCK) != 0;
  p.rht = (flags & PT_QUANT_RHT) != 0;
  p.sr = (flags & PT_QUANT_SR) != 0;
  p.mn_major = (flags & PT_QUANT_SCALES_MN_MAJOR) != 0;
  p.pad4 = (flags & PT_QUANT_SCALES_PAD4) != 0;
  check_granularity_block(granularity, block_size, p.fp4());
  const bool blocks = granularity == PT_QUANT_BLOCKWISE || granularity == PT_QUANT_MX_BLOCKWISE;
  if (!blocks) p.block = 0;
  PT_CHECK_ARG(!p.block_2d || blocks, "2-D blocks need BLOCKWISE or MX_BLOCKWISE granularity, got ",
               granularity_name(granularity));
  PT_CHECK_ARG(!p.block_2d || !p.col || p.col_transposed,
               "2-D blocks with a column output need it transposed ('col_transposed')");
  PT_CHECK_ARG(!(p.rht || p.sr) || p.fp4(), "random Hadamard transform and stochastic rounding are FP4 options");
  PT_CHECK_ARG(!p.mn_major || (granularity == PT_QUANT_BLOCKWISE && !p.block_2d && (!p.col || p.col_transposed)),
               "MN-major scales (PT_QUANT_SCALES_MN_MAJOR) are for BLOCKWISE 1-D blocks with a transposed column "
               "output");
  PT_CHECK_ARG(!p.pad4 || (granularity == PT_QUANT_BLOCKWISE && p.block_2d),
               "padded scales (PT_QUANT_SCALES_PAD4) are for BLOCKWISE 2-D blocks (PT_QUANT_2D_BLOCK)");
  if (p.fp4()) {
    PT_CHECK_ARG(!p.col || p.col_transposed, "FP4 column output is stored transposed [k, m/2]");
    PT_CHECK_ARG(!p.row || p.k % 2 == 0, "argument 'x' has shape ", shape_string(*x),
                 "; FP4 packs two values per byte, so the quantized (last) dimension must be even");
    PT_CHECK_ARG(!p.col || p.m % 2 == 0, "argument 'x' has shape ", shape_string(*x),
                 "; FP4 packs two values per byte, so the quantized (first) dimension must be even");
  }
  if (p.rht) {
    PT_CHECK_SUPPORTED(!(p.row && p.col) && !p.block_2d,
                       "the random Hadamard transform applies to one direction with 1-D blocks");
    const int64_t dim = p.row ? p.k : p.m;
    PT_CHECK_ARG(dim % 16 == 0, "argument 'x' has shape ", shape_string(*x),
                 "; the random Hadamard transform needs the quantized dimension to be a multiple of 16, got ", dim);
  }
  const int B = p.block;
  if (batch) {
    // A stack: the row output is the 2-D one of [b * m, k] (no block crosses two matrices), the
    // column output is each matrix's own, transposed (ROWWISE: scaled per column of each matrix):
    // what a 16-bit FP8 weight stack needs.
    PT_CHECK_SUPPORTED(!p.fp4() && p.x_dtype != PT_FLOAT32 && !p.mn_major && !p.pad4 &&
                           (granularity == PT_QUANT_TENSORWISE || granularity == PT_QUANT_ROWWISE ||
                            (granularity == PT_QUANT_BLOCKWISE && B == 128)),
                       "a stack of matrices (3-D x) is quantized to FP8 from 16-bit input, TENSORWISE, ROWWISE or "
                       "BLOCKWISE with 128-element blocks, without MN-major or padded scales");
    PT_CHECK_ARG(!p.col || p.col_transposed, "a stack's column output is stored transposed ('col_transposed')");
    PT_CHECK_ARG(p.k % 8 == 0 && mm % 128 == 0, "argument 'x' has shape ", shape_string(*x),
                 "; a stack [b, m, k] needs k % 8 == 0 and m % 128 == 0");
    p.col_rows = mm;
  }
  const int64_t m = mm, k = p.k;
  const auto pad = [&](int64_t blocks) { return p.pad4 ? round_up4(blocks) : blocks; };  // 2-D scales' last dim
  if (p.row) {
    if (p.fp4()) check_shape2(q_row, "q_row", m, k / 2);
    else check_shape(q_row, "q_row", batch, m, k);
    check_tensor(s_row, "s_row");
    check_scale_dtype(s_row, "s_row", granularity);
    if (granularity == PT_QUANT_TENSORWISE) check_numel(s_row, "s_row", 1, "one scale for the tensor");
    else if (granularity == PT_QUANT_ROWWISE) check_numel(s_row, "s_row", p.m, "one scale per row");
    else if (p.block_2d) check_shape(s_row, "s_row", batch, ceil_div(m, B), pad(ceil_div(k, B)));
    else if (p.mn_major) check_shape2(s_row, "s_row", ceil_div(k, B), round_up4(m));
    else check_shape(s_row, "s_row", batch, m, ceil_div(k, B));
  }
  if (p.col) {
    if (p.fp4()) check_shape2(q_col, "q_col", k, m / 2);
    else if (p.col_transposed) check_shape(q_col, "q_col", batch, k, m);
    else check_shape2(q_col, "q_col", m, k);
    check_tensor(s_col, "s_col");
    check_scale_dtype(s_col, "s_col", granularity);
    if (granularity == PT_QUANT_TENSORWISE) check_numel(s_col, "s_col", 1, "one scale for the tensor");
    else if (granularity == PT_QUANT_ROWWISE)
      check_numel(s_col, "s_col", batch ? batch * k : k,
                  batch ? "one scale per column of each matrix" : "one scale per column of x");
    else if (p.block_2d) check_shape(s_col, "s_col", batch, ceil_div(k, B), pad(ceil_div(m, B)));
    else if (p.mn_major) check_shape2(s_col, "s_col", ceil_div(m, B), round_up4(k));
    else if (p.col_transposed) check_shape(s_col, "s_col", batch, k, ceil_div(m, B));
    else check_shape2(s_col, "s_col", ceil_div(m, B), k);
  }
  return p;
}

size_t workspace_bytes(const QuantProblem& p) {
  // A ROWWISE stack's column maxima are per matrix: [b, k].
  const int64_t mats = p.col_rows ? p.m / p.col_rows : 1;
  return workspace_bytes(p.m, p.k * mats, p.granularity);
}

size_t workspace_bytes(int64_t m, int64_t k, int32_t granularity) {
  if (granularity == PT_QUANT_TENSORWISE) return 16;
  if (granularity == PT_QUANT_ROWWISE) {
    const int64_t n = (m > 0 ? m : 0) + (k > 0 ? k : 0);
    return static_cast<size_t>((n * 4 + 15) / 16 * 16);
  }
  return 0;
}

DequantProblem make_dequant_problem(const pt_tensor* q, const pt_tensor* s, const pt_tensor* out,
                                    int32_t granularity, int32_t block_size, int32_t axis, int32_t flags) {
  check_tensor(q, "q");
  check_tensor(s, "scale_inv");
  check_tensor(out, "out");
  PT_CHECK_ARG(q->ndim == 2, "argument 'q' has shape ", shape_string(*q), "; expected a 2-D tensor");
  DequantProblem p;
  p.q_dtype = canonical_q_dtype(q->dtype);
  PT_CHECK_ARG(p.q_dtype == PT_FLOAT8_E4M3 || p.q_dtype == PT_FLOAT8_E5M2 || p.q_dtype == PT_FLOAT4_E2M1_X2,
               "argument 'q' has dtype ", dtype_name(q->dtype),
               "; expected float8_e4m3fn, float8_e5m2 or float4_e2m1fn_x2 (uint8)");
  const bool fp4 = p.q_dtype == PT_FLOAT4_E2M1_X2;
  check_granularity_block(granularity, block_size, fp4);
  PT_CHECK_ARG((flags & ~PT_QUANT_2D_BLOCK) == 0, "argument 'flags' is ", flags,
               "; only the 2-D block flag applies to dequantization");
  PT_CHECK_ARG(axis == -1 || axis == 0 || axis == 1, "argument 'axis' is ", axis, "; expected -1, 0 or 1");
  const bool along_k = axis != 0;
  PT_CHECK_ARG(!fp4 || along_k, "FP4 data is packed along its last dimension; dequantize it along axis -1");
  p.m = q->shape[0];
  p.k = fp4 ? 2 * q->shape[1] : q->shape[1];
  PT_CHECK_ARG(is_float_dtype(out->dtype), "argument 'out' has dtype ", dtype_name(out->dtype),
               "; expected float32, float16 or bfloat16");
  check_shape2(out, "out", p.m, p.k);
  p.out_dtype = out->dtype;
  check_scale_dtype(s, "scale_inv", granularity);
  p.e8m0 = granularity == PT_QUANT_MX_BLOCKWISE;
  const bool two_d = (flags & PT_QUANT_2D_BLOCK) != 0;
  const int64_t m = p.m, k = p.k, B = block_size;
  if (granularity == PT_QUANT_TENSORWISE) {
    check_numel(s, "scale_inv", 1, "one scale for the tensor");
    p.block_m = m > 0 ? m : 1;
    p.block_k = k > 0 ? k : 1;
    p.ld_s = 0;
  } else if (granularity == PT_QUANT_ROWWISE) {
    check_numel(s, "scale_inv", along_k ? m : k, along_k ? "one scale per row" : "one scale per column");
    p.block_m = along_k ? 1 : (m > 0 ? m : 1);
    p.block_k = along_k ? (k > 0 ? k : 1) : 1;
    p.ld_s = along_k ? 1 : k;
  } else if (two_d) {
    check_shape2(s, "scale_inv", ceil_div(m, B), ceil_div(k, B));
    p.block_m = p.block_k = B;
    p.ld_s = ceil_div(k, B);
  } else if (along_k) {
    check_shape2(s, "scale_inv", m, ceil_div(k, B));
    p.block_m = 1;
    p.block_k = B;
    p.ld_s = ceil_div(k, B);
  } else {
    check_shape2(s, "scale_inv", ceil_div(m, B), k);
    p.block_m = B;
    p.block_k = 1;
    p.ld_s = k;
  }
  return p;
}

}  // namespace primus_turbo::quant
