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

constexpr size_t kArenaAlign = 256;  // every view in the arena starts 256-byte aligned, as an allocation would

size_t arena_bytes(size_t bytes) { return (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }

size_t element_bytes(ScalarType t) { return t == ScalarType::Float ? 4 : 1; }  // FP8 copies, float32 scales

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i] > 1 ? shape[i] : 1;
  }
  return strides;
}

// One tensor of a request's outputs: owned (its own allocation: the op may return it) or transient
// (a view into the batch's arena at `offset`, made by bind() once the arena exists; it shares the
// arena's storage, so it keeps the memory alive wherever it goes).
struct Slot {
  std::vector<int64_t> shape, strides;
  ScalarType dtype;
  bool transient;
  size_t offset = 0;
  std::optional<Tensor> t;
  pt_tensor desc{};

  Slot(std::vector<int64_t> sizes, ScalarType type, bool in_arena, size_t& arena, int32_t device)
      : shape(std::move(sizes)), strides(contiguous_strides(shape)), dtype(type), transient(in_arena) {
    if (!transient) {
      t = empty(shape.data(), static_cast<int64_t>(shape.size()), dtype, device);
      desc = to_pt(*t);
      return;
    }
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    offset = arena;
    arena += arena_bytes(static_cast<size_t>(n) * element_bytes(dtype));
    // Described on a stand-in base until bind(): the planning reads sizes and alignment only.
    desc.data = reinterpret_cast<void*>(kArenaAlign + offset);
    desc.dtype = pt_dtype_of(dtype);
    desc.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      desc.shape[i] = shape[i];
      desc.strides[i] = strides[i];
    }
  }

  void bind(const Tensor& arena) {
    if (!transient) return;
    t = storage_view(arena, static_cast<int64_t>(offset), dtype, shape, strides);
    desc.data = static_cast<char*>(arena.data_ptr()) + offset;
  }
};

// A request's outputs (row [m, k] and / or col [k, m], each with its scales) and their descriptors
// for the C API; the descriptors live as long as this object.
struct Outputs {
  std::optional<Slot> qr, sr, qc, sc;
  int32_t scaling;
  pt_tensor x{};

  Outputs(const QuantRequest& r, size_t& arena, int32_t device, const char* context) {
    const Tensor& t = *r.x;
    const int64_t m = t.sizes()[0], k = t.sizes()[1];
    const auto [act, wgt] = fp8_scalings(r.spec.granularity, context);
    scaling = r.spec.two_d ? wgt : act;
    x = to_pt(t);
    if (r.want_row) {
      qr.emplace(std::vector<int64_t>{m, k}, r.spec.dtype, r.row_transient, arena, device);
      sr.emplace(scale_shape(r.spec, m, k, true), ScalarType::Float, r.row_transient, arena, device);
    }
    if (r.want_col) {
      qc.emplace(std::vector<int64_t>{k, m}, r.spec.dtype, r.col_transient, arena, device);
      sc.emplace(scale_shape(r.spec, m, k, false), ScalarType::Float, r.col_transient, arena, device);
    }
  }

  void bind(const Tensor& arena) {
    for (std::optional<Slot>* s : {&qr, &sr, &qc, &sc})
      if (*s) (*s)->bind(arena);
  }

  pt_quantize_job job(const QuantSpec& spec) {
    const int64_t g = spec.granularity;
    const bool blocks = g == PT_QUANT_BLOCKWISE;
    const int32_t two_d = PT_QUANT_2D_BLOCK | (spec.pad4 ? PT_QUANT_SCALES_PAD4 : 0);
    const int32_t flags = !blocks ? 0 : spec.two_d ? two_d : spec.mn_major ? PT_QUANT_SCALES_MN_MAJOR : 0;
    return pt_quantize_job{&x,  qr ? &qr->desc : nullptr, sr ? &sr->desc : nullptr, qc ? &qc->desc : nullptr,
                           sc ? &sc->desc : nullptr, static_cast<int32_t>(g), blocks ? 128 : 0, 1, flags};
  }

  QuantPair result() const {
    QuantPair p;
    if (qr) p.first = Quantized{*qr->t, *sr->t, scaling};
    if (qc) p.second = Quantized{*qc->t, *sc->t, scaling};
    return p;
  }
};

}  // namespace

QuantBatch quantize_fp8_jobs(std::initializer_list<QuantRequest> requests, int32_t device, void* stream,
                             const char* context) {
  size_t arena = 0;
  std::vector<Outputs> outs;
  outs.reserve(requests.size());
  std::vector<pt_quantize_job> jobs;
  for (const QuantRequest& r : requests) {
    outs.emplace_back(r, arena, device, context);
    jobs.push_back(outs.back().job(r.spec));
  }
  const int32_t count = static_cast<int32_t>(jobs.size());
  // The amax scratch of all the jobs (none where no job reduces an amax) after the transient copies.
  const size_t ws_bytes = pt_quantize_jobs_workspace_bytes(jobs.data(), count);
  const size_t ws_offset = arena;
  arena += arena_bytes(ws_bytes);
  QuantBatch batch;
  char* base = nullptr;
  if (arena) {
    batch.arena = empty({static_cast<int64_t>(arena)}, ScalarType::Byte, device);
    base = static_cast<char*>(batch.arena->data_ptr());
    for (Outputs& o : outs) o.bind(*batch.arena);
  }
  check_status(pt_quantize_jobs(jobs.data(), count, ws_bytes ? base + ws_offset : nullptr, ws_bytes, stream),
               context);
  for (const Outputs& o : outs) batch.pairs.push_back(o.result());
  return batch;
}

}  // namespace primus_turbo::torch_binding
