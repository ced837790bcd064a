#include "bindings/torch/fp4_quantize.h"

#include "primus_turbo/gemm_mx.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr int64_t kMx = 32;

std::vector<int64_t> fp4_scale_shape(int64_t rows, int64_t cols, bool two_d) {
  return {two_d ? cdiv(rows, kMx) : rows, cdiv(cols, kMx)};
}

std::vector<int64_t> restated_scale_shape(int64_t rows, int64_t k, bool mn_major) {
  const int64_t kb = cdiv(k, 128);
  return mn_major ? std::vector<int64_t>{kb, cdiv(rows, 4) * 4} : std::vector<int64_t>{rows, kb};
}

Tensor take_or_empty(Scratch* scratch, const std::vector<int64_t>& shape, ScalarType dtype, int32_t device) {
  return scratch ? scratch->take(shape, dtype) : empty(shape.data(), static_cast<int64_t>(shape.size()), dtype, device);
}

// A copy [rows, cols] (packed to cols / 2 bytes a row) and its E8M0 scales.
Fp4 fp4_copy(int64_t rows, int64_t cols, bool two_d, Scratch* scratch, int32_t device) {
  return Fp4{take_or_empty(scratch, {rows, cols / 2}, ScalarType::Byte, device),
             take_or_empty(scratch, fp4_scale_shape(rows, cols, two_d), ScalarType::Byte, device)};
}

}  // namespace

size_t fp4_scratch_bytes(int64_t rows, int64_t cols, bool two_d) {
  return Scratch::share({rows, cols / 2}, ScalarType::Byte) +
         Scratch::share(fp4_scale_shape(rows, cols, two_d), ScalarType::Byte);
}

size_t restated_scratch_bytes(int64_t rows, int64_t k, bool mn_major) {
  return Scratch::share({rows, k}, ScalarType::Float8_e4m3fn) +
         Scratch::share(restated_scale_shape(rows, k, mn_major), ScalarType::Float);
}

std::pair<std::optional<Fp4>, std::optional<Fp4>> quantize_fp4(const Tensor& x, bool want_row, bool want_col,
                                                               int32_t flags, int64_t seed, int32_t device,
                                                               void* stream, Scratch* row_scratch,
                                                               Scratch* col_scratch) {
  const int64_t m = x.sizes()[0], k = x.sizes()[1];
  const bool two_d = flags & PT_QUANT_2D_BLOCK;
  std::optional<Fp4> row, col;
  pt_tensor px = to_pt(x), pqr{}, psr{}, pqc{}, psc{};
  if (want_row) {
    row = fp4_copy(m, k, two_d, row_scratch, device);
    pqr = to_pt(row->q);
    psr = to_pt(row->s);
  }
  if (want_col) {
    col = fp4_copy(k, m, two_d, col_scratch, device);
    pqc = to_pt(col->q);
    psc = to_pt(col->s);
  }
  check_status(pt_quantize(&px, row ? &pqr : nullptr, row ? &psr : nullptr, col ? &pqc : nullptr,
                           col ? &psc : nullptr, PT_QUANT_MX_BLOCKWISE, static_cast<int32_t>(kMx), 1, flags,
                           static_cast<uint64_t>(seed), nullptr, 0, stream),
               "FP4 quantize");
  return {row, col};
}

Quantized restate(const Fp4& x, bool mn_major, int32_t device, void* stream, Scratch* scratch) {
  const int64_t rows = x.q.sizes()[0], k = 2 * x.q.sizes()[1];
  Quantized out{take_or_empty(scratch, {rows, k}, ScalarType::Float8_e4m3fn, device),
                take_or_empty(scratch, restated_scale_shape(rows, k, mn_major), ScalarType::Float, device),
                PT_FP8_SCALING_BLOCK_1x128};
  const pt_tensor pq = to_pt(x.q), ps = to_pt(x.s);
  pt_tensor pq8 = to_pt(out.q), ps8 = to_pt(out.s);
  check_status(mn_major ? pt_mx_to_blocks_mn_major(&pq, &ps, &pq8, &ps8, stream)
                        : pt_mx_to_blocks(&pq, &ps, &pq8, &ps8, stream),
               "FP4 restatement");
  return out;
}

}  // namespace primus_turbo::torch_binding
