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
      if (spec.two_d) return {cdiv(rows, 128), spec.pad4 ? round_up4(cdiv(cols, 128)) : cdiv(cols, 128)};
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

namespace {

// x's outputs allocated (row [m, k] and / or col [k, m] with their scales) and described for the C
// API; the descriptors live as long as this object.
struct Outputs {
  std::optional<Quantized> row, col;
  pt_tensor x{}, qr{}, sr{}, qc{}, sc{};

  Outputs(const Tensor& t, const QuantSpec& spec, bool want_row, bool want_col, int32_t device, const char* context) {
    const int64_t m = t.sizes()[0], k = t.sizes()[1];
    const auto [act, wgt] = fp8_scalings(spec.granularity, context);
    const int32_t scaling = spec.two_d ? wgt : act;
    x = to_pt(t);
    // The copy along k ([m, k]) or along m (stored transposed, [k, m]) with its scales.
    const auto copy = [&](bool along_k, std::optional<Quantized>& out, pt_tensor& q, pt_tensor& s) {
      const auto ss = scale_shape(spec, m, k, along_k);
      out = Quantized{along_k ? empty({m, k}, spec.dtype, device) : empty({k, m}, spec.dtype, device),
                      empty(ss.data(), ss.size(), ScalarType::Float, device), scaling};
      q = to_pt(out->q);
      s = to_pt(out->s);
    };
    if (want_row) copy(true, row, qr, sr);
    if (want_col) copy(false, col, qc, sc);
  }

  pt_quantize_job job(const QuantSpec& spec) {
    const int64_t g = spec.granularity;
    const bool blocks = g == PT_QUANT_BLOCKWISE;
    const int32_t two_d = PT_QUANT_2D_BLOCK | (spec.pad4 ? PT_QUANT_SCALES_PAD4 : 0);
    const int32_t flags = !blocks ? 0 : spec.two_d ? two_d : spec.mn_major ? PT_QUANT_SCALES_MN_MAJOR : 0;
    return pt_quantize_job{&x, row ? &qr : nullptr, row ? &sr : nullptr, col ? &qc : nullptr, col ? &sc : nullptr,
                           static_cast<int32_t>(g), blocks ? 128 : 0, 1, flags};
  }
};

}  // namespace

std::vector<QuantPair> quantize_fp8_jobs(std::initializer_list<QuantRequest> requests, int32_t device, void* stream,
                                         const char* context) {
  std::vector<Outputs> outs;
  outs.reserve(requests.size());
  std::vector<pt_quantize_job> jobs;
  for (const QuantRequest& r : requests) {
    outs.emplace_back(*r.x, r.spec, r.want_row, r.want_col, device, context);
    jobs.push_back(outs.back().job(r.spec));
  }
  const int32_t count = static_cast<int32_t>(jobs.size());
  // The amax scratch of all the jobs, one allocation (none where no job reduces an amax).
  const size_t ws_bytes = pt_quantize_jobs_workspace_bytes(jobs.data(), count);
  std::optional<Tensor> scratch;
  if (ws_bytes) scratch = empty({static_cast<int64_t>(ws_bytes)}, ScalarType::Byte, device);
  check_status(pt_quantize_jobs(jobs.data(), count, scratch ? scratch->data_ptr() : nullptr, ws_bytes, stream),
               context);
  std::vector<QuantPair> result;
  for (Outputs& o : outs) result.emplace_back(o.row, o.col);
  return result;
}

}  // namespace primus_turbo::torch_binding
