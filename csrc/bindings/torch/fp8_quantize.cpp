#include "bindings/torch/fp8_quantize.h"

#include "bindings/torch/scratch.h"

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

// Where a batch's outputs come from: the transient copies' scratch allocation, and (kept_together)
// one allocation for the kept copies; bytes are summed first, the blocks made once the sizes are known.
struct Pools {
  size_t scratch_bytes = 0, kept_bytes = 0;
  bool kept_together = false;
  std::optional<Scratch> scratch, kept;
};

// One tensor of a request's outputs: owned (its own allocation, or a view of the batch's kept block:
// the op may return it) or transient (taken from the batch's Scratch). Its descriptor exists before
// the memory does.
struct Slot {
  std::vector<int64_t> shape;
  ScalarType dtype;
  bool transient;
  std::optional<Tensor> t;
  pt_tensor desc{};

  Slot(std::vector<int64_t> sizes, ScalarType type, bool in_scratch, Pools& pools, int32_t device)
      : shape(std::move(sizes)), dtype(type), transient(in_scratch) {
    if (!transient && !pools.kept_together) {
      t = empty(shape.data(), static_cast<int64_t>(shape.size()), dtype, device);
      desc = to_pt(*t);
      return;
    }
    (transient ? pools.scratch_bytes : pools.kept_bytes) += Scratch::share(shape, dtype);
    // Described on an aligned stand-in address until bind(): the planning reads sizes and
    // alignment only.
    desc.data = reinterpret_cast<void*>(Scratch::kAlign);
    desc.dtype = pt_dtype_of(dtype);
    desc.ndim = static_cast<int32_t>(shape.size());
    const std::vector<int64_t> strides = contiguous_strides(shape.data(), static_cast<int64_t>(shape.size()));
    for (size_t i = 0; i < shape.size(); ++i) {
      desc.shape[i] = shape[i];
      desc.strides[i] = strides[i];
    }
  }

  void bind(Pools& pools) {
    if (t) return;  // its own allocation
    t = (transient ? *pools.scratch : *pools.kept).take(shape, dtype);
    desc.data = t->data_ptr();
  }
};

// A request's outputs (row [m, k] and / or col [k, m], each with its scales) and their descriptors
// for the C API; the descriptors live as long as this object.
struct Outputs {
  std::optional<Slot> qr, sr, qc, sc;
  int32_t scaling;
  pt_tensor x{};
  std::optional<pt_tensor> amax;

  Outputs(const QuantRequest& r, Pools& pools, int32_t device, const char* context) {
    const Tensor& t = *r.x;
    const bool stack = t.dim() == 3;  // [b, m, k]: every output per matrix, stacked
    const int64_t m = t.sizes()[stack], k = t.sizes()[stack + 1];
    const auto [act, wgt] = fp8_scalings(r.spec.granularity, context);
    scaling = r.spec.two_d ? wgt : act;
    x = to_pt(t);
    if (r.amax) amax = to_pt(*r.amax);
    const auto stacked = [&](std::vector<int64_t> shape) {
      if (stack && !shape.empty()) shape.insert(shape.begin(), t.sizes()[0]);
      return shape;
    };
    if (r.want_row) {
      qr.emplace(stacked({m, k}), r.spec.dtype, r.row_transient, pools, device);
      sr.emplace(stacked(scale_shape(r.spec, m, k, true)), ScalarType::Float, r.row_transient, pools, device);
    }
    if (r.want_col) {
      qc.emplace(stacked({k, m}), r.spec.dtype, r.col_transient, pools, device);
      sc.emplace(stacked(scale_shape(r.spec, m, k, false)), ScalarType::Float, r.col_transient, pools, device);
    }
  }

  void bind(Pools& pools) {
    for (std::optional<Slot>* s : {&qr, &sr, &qc, &sc})
      if (*s) (*s)->bind(pools);
  }

  pt_quantize_job job(const QuantSpec& spec) {
    const int64_t g = spec.granularity;
    const bool blocks = g == PT_QUANT_BLOCKWISE;
    const int32_t two_d = PT_QUANT_2D_BLOCK | (spec.pad4 ? PT_QUANT_SCALES_PAD4 : 0);
    const int32_t flags = !blocks ? 0 : spec.two_d ? two_d : spec.mn_major ? PT_QUANT_SCALES_MN_MAJOR : 0;
    return pt_quantize_job{&x,  qr ? &qr->desc : nullptr, sr ? &sr->desc : nullptr, qc ? &qc->desc : nullptr,
                           sc ? &sc->desc : nullptr, static_cast<int32_t>(g), blocks ? 128 : 0, 1, flags,
                           amax ? &*amax : nullptr};
  }

  QuantPair result() const {
    QuantPair p;
    if (qr) p.first = Quantized{*qr->t, *sr->t, scaling};
    if (qc) p.second = Quantized{*qc->t, *sc->t, scaling};
    return p;
  }
};

}  // namespace

std::vector<QuantPair> quantize_fp8_jobs(std::initializer_list<QuantRequest> requests, int32_t device, void* stream,
                                         const char* context, bool kept_together) {
  Pools pools;
  pools.kept_together = kept_together;
  std::vector<Outputs> outs;
  outs.reserve(requests.size());
  std::vector<pt_quantize_job> jobs;
  for (const QuantRequest& r : requests) {
    outs.emplace_back(r, pools, device, context);
    jobs.push_back(outs.back().job(r.spec));
  }
  const int32_t count = static_cast<int32_t>(jobs.size());
  // The transient copies and the jobs' amax scratch (none where no job reduces an amax) in one
  // allocation.
  const size_t ws_bytes = pt_quantize_jobs_workspace_bytes(jobs.data(), count);
  pools.scratch.emplace(device, pools.scratch_bytes + Scratch::share(ws_bytes));
  if (kept_together) pools.kept.emplace(device, pools.kept_bytes);  // capacity 0: take() allocates
  for (Outputs& o : outs) o.bind(pools);
  std::optional<Tensor> ws;
  if (ws_bytes) ws = pools.scratch->take({static_cast<int64_t>(ws_bytes)}, ScalarType::Byte);
  check_status(pt_quantize_jobs(jobs.data(), count, ws ? ws->data_ptr() : nullptr, ws_bytes, stream), context);
  std::vector<QuantPair> result;
  for (const Outputs& o : outs) result.push_back(o.result());
  return result;
}

}  // namespace primus_turbo::torch_binding
