#include "bindings/torch/fp8_quantize.h"

namespace primus_turbo::torch_binding {

namespace {

int64_t round_up4(int64_t a) { return cdiv(a, 4) * 4; }

std::vector<int64_t> scale_shape(const QuantSpec& spec, int64_t m, int64_t k, bool along_k) {
  const int64_t rows = along_k ? m : k, cols = along_k ? k : m;
  switch (spec.granularity) {
    case PT_QUANT_TENSORWISE: return {};
    case PT_QUANT_ROWWISE: return {rows, 1};
    default:
      if (spec.two_d) return {cdiv(rows, 128), cdiv(cols, 128)};
      if (spec.mn_major) return {cdiv(cols, 128), round_up4(rows)};
      return {rows, cdiv(cols, 128)};
  }
}

}  // namespace

std::pair<int32_t, int32_t> fp8_scalings(int64_t granularity, const char* op) {
  switch (granularity) {
    case PT_QUANT_TENSORWISE: return {PT_FP8_SCALING_TENSOR, PT_FP8_SCALING_TENSOR};
    case PT_QUANT_ROWWISE: return {PT_FP8_SCALING_ROW, PT_FP8_SCALING_ROW};
    case PT_QUANT_BLOCKWISE: return {PT_FP8_SCALING_BLOCK_1x128, PT_FP8_SCALING_BLOCK_128x128};
    default: fail_with(ErrorKind::NotImplemented, op, ": granularity code ", granularity, " has no native path");
  }
}

size_t quantize_workspace_bytes(int64_t m, int64_t k, int64_t granularity, bool want_row, bool want_col) {
  if (granularity == PT_QUANT_ROWWISE && want_row && !want_col) return 0;
  return (pt_quantize_workspace_bytes(m, k, static_cast<int32_t>(granularity)) + 255) / 256 * 256;
}

QuantScratch::QuantScratch(size_t bytes, int32_t device) {
  if (bytes) buffer = empty({static_cast<int64_t>(bytes)}, ScalarType::Byte, device);
}

void* QuantScratch::at(size_t offset) const {
  return buffer ? static_cast<char*>(buffer->data_ptr()) + offset : nullptr;
}

std::pair<std::optional<Quantized>, std::optional<Quantized>> quantize_fp8(const Tensor& x, const QuantSpec& spec,
                                                                           bool want_row, bool want_col, void* ws,
                                                                           int32_t device, void* stream,
                                                                           const char* context) {
  const int64_t m = x.sizes()[0], k = x.sizes()[1];
  const int64_t g = spec.granularity;
  const auto [act, wgt] = fp8_scalings(g, context);
  const int32_t scaling = spec.two_d ? wgt : act;
  std::optional<Quantized> row, col;
  pt_tensor px = to_pt(x), pqr{}, psr{}, pqc{}, psc{};
  if (want_row) {
    const auto ss = scale_shape(spec, m, k, true);
    row = Quantized{empty({m, k}, spec.dtype, device), empty(ss.data(), ss.size(), ScalarType::Float, device), scaling};
    pqr = to_pt(row->q);
    psr = to_pt(row->s);
  }
  if (want_col) {
    const auto ss = scale_shape(spec, m, k, false);
    col = Quantized{empty({k, m}, spec.dtype, device), empty(ss.data(), ss.size(), ScalarType::Float, device), scaling};
    pqc = to_pt(col->q);
    psc = to_pt(col->s);
  }
  const size_t ws_bytes = quantize_workspace_bytes(m, k, g, want_row, want_col);
  const bool blocks = g == PT_QUANT_BLOCKWISE;
  const int32_t flags = !blocks ? 0 : spec.two_d ? PT_QUANT_2D_BLOCK : spec.mn_major ? PT_QUANT_SCALES_MN_MAJOR : 0;
  check_status(pt_quantize(&px, row ? &pqr : nullptr, row ? &psr : nullptr, col ? &pqc : nullptr,
                           col ? &psc : nullptr, static_cast<int32_t>(g), blocks ? 128 : 0, 1, flags, 0,
                           ws_bytes ? ws : nullptr, ws_bytes, stream),
               context);
  return {row, col};
}

}  // namespace primus_turbo::torch_binding
