// C API entry points of FP8 attention: the 16-bit problem's checks, the workspace of quantized
// tiles, then the module's quantization and forward (kernels/attention/attn_fwd_fp8_sm90.cuh) or
// backward (kernels/attention/attn_bwd_fp8_sm90.cuh).
#include <tuple>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/attention/attention_kernels.h"
#include "ops/attention/attention_problem.h"
#include "runtime/device.h"

using namespace primus_turbo;
using namespace primus_turbo::attention;

namespace {

constexpr int64_t kTile = PT_ATTN_FP8_TILE_ROWS;
constexpr size_t kAlign = 1024;  // a swizzled tile image must start on a 1024-byte boundary

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Hands out aligned offsets of a workspace, in order; `bytes` is the total so far.
struct Carver {
  size_t bytes = 0;
  size_t take(size_t n) {
    const size_t start = bytes;
    bytes += round_up(n);
    return start;
  }
};

// Tile indices of an operand's tokens for tiles of `rows` (attention_fp8_abi.h's scheme).
size_t tile_capacity(const PtAttnParams& r, bool keys, int64_t rows) {
  const bool packed = r.cu_seqlens_q != nullptr;
  const int64_t tokens = keys ? (packed ? r.total_k : r.batch * r.seqlen_k) : (packed ? r.total_q : r.batch * r.seqlen_q);
  return static_cast<size_t>(r.batch + (tokens + rows - 1) / rows);
}

char* aligned_base(void* workspace) {
  return reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign);
}

// Where each part of the workspace starts, from an aligned base.
struct Fp8Workspace {
  size_t k_tiles = 0, vt_tiles = 0, k_scale = 0, v_scale = 0, bytes = 0;
};

Fp8Workspace plan(const PtAttnParams& r) {
  Fp8Workspace w;
  const size_t k_cap = tile_capacity(r, true, kTile);
  Carver c;
  w.k_tiles = c.take(k_cap * r.heads_kv * kTile * r.head_dim);
  w.vt_tiles = c.take(k_cap * r.heads_kv * kTile * r.head_dim_v);
  w.k_scale = c.take(k_cap * r.heads_kv * 2 * sizeof(float));
  w.v_scale = c.take(k_cap * r.heads_kv * 2 * sizeof(float));
  w.bytes = c.bytes + kAlign;  // room to align the caller's base
  return w;
}

// The backward's workspace (attention_fp8_bwd_abi.h): its parameters' pointers from an aligned
// base, and the bytes it takes (with room to align the caller's base).
size_t plan_backward(const PtAttnParams& r, char* base, PtAttnFp8BwdParams* f) {
  constexpr int64_t kRows = PT_ATTN_FP8_BWD_TILE_ROWS;
  const size_t q_cap = tile_capacity(r, false, kRows) * r.heads_q, k_cap = tile_capacity(r, true, kRows) * r.heads_kv;
  const size_t d = r.head_dim, dv = r.head_dim_v;
  Carver c;
  auto at = [base](size_t offset) { return base == nullptr ? nullptr : base + offset; };
  void** images[] = {&f->q_tiles, &f->qt_tiles, &f->do_tiles, &f->dot_tiles, &f->k_tiles, &f->kt_tiles, &f->v_tiles};
  const size_t image_bytes[] = {q_cap * kRows * d,  q_cap * kRows * d,  q_cap * kRows * dv, q_cap * kRows * dv,
                                k_cap * kRows * d,  k_cap * kRows * d,  k_cap * kRows * dv};
  float** floats[] = {&f->q_scale, &f->do_scale, &f->k_scale, &f->v_scale, &f->lse2_tiles, &f->delta_tiles};
  const size_t float_counts[] = {q_cap, q_cap, k_cap, k_cap, q_cap * kRows, q_cap * kRows};
  for (int i = 0; i < 7; ++i) *images[i] = at(c.take(image_bytes[i]));
  for (int i = 0; i < 6; ++i) *floats[i] = reinterpret_cast<float*>(at(c.take(float_counts[i] * sizeof(float))));
  return c.bytes + kAlign;
}

}  // namespace

extern "C" {

pt_status pt_attention_fp8_fwd(const pt_tensor* q, const pt_tensor* k, const pt_tensor* v, const pt_tensor* sink,
                               const pt_tensor* cu_seqlens_q, const pt_tensor* cu_seqlens_k, pt_tensor* out,
                               pt_tensor* lse, pt_tensor* q_deq, pt_tensor* k_deq, pt_tensor* v_deq,
                               int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, int32_t window_left,
                               int32_t window_right, int32_t scale_rows, void* workspace, size_t workspace_bytes,
                               size_t* workspace_needed, void* stream) {
  return api_guard([&] {
    if (workspace_needed != nullptr) *workspace_needed = 0;
    PT_CHECK_ARG(scale_rows == 64 || scale_rows == 128, "argument 'scale_rows' (the quantization block) is ",
                 scale_rows, "; expected 64 or 128 rows");
    const Problem p = make_problem(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, out, lse, max_seqlen_q, max_seqlen_k,
                                   softmax_scale, window_left, window_right);
    PT_CHECK_SUPPORTED(fp8_head_dims(p.params.head_dim, p.params.head_dim_v), "FP8 attention supports head dims 64, ",
                       "96 and 128 (q/k and v alike) and 192 for q/k with 128 for v; got ", p.params.head_dim, "/",
                       p.params.head_dim_v, ": use flash_attn_func (16-bit) for this shape");
    const std::tuple<const pt_tensor*, pt_tensor*, const char*, const char*> copies[] = {
        {q, q_deq, "q_deq", "q"}, {k, k_deq, "k_deq", "k"}, {v, v_deq, "v_deq", "v"}};
    for (const auto& [from, copy, name, from_name] : copies) {
      if (copy == nullptr) continue;
      check_like(copy, name, *from, from_name);  // contiguous, from's shape and dtype
      PT_CHECK_ARG(numel(*copy) == 0 || aligned16(copy->data), "argument '", name, "' must be 16-byte aligned");
    }
    if (numel(*out) == 0 && numel(*lse) == 0) return;
    const Fp8Workspace w = plan(p.params);
    if (workspace_needed != nullptr) *workspace_needed = w.bytes;
    if (w.bytes > workspace_bytes) {
      PT_CHECK_ARG(workspace_needed != nullptr, "FP8 attention needs ", w.bytes,
                   " bytes of workspace; pass workspace_needed to learn the size");
      return;
    }
    const int device = current_device();
    bind_device_context(device);
    const PtAttnFp8Fn fn = load_fp8_forward(p.dtype, p.params.head_dim, p.params.head_dim_v, arch_for_device(device));
    char* base = aligned_base(workspace);
    PtAttnFp8Params f{};
    f.base = p.params;
    f.base.stream = stream;
    f.k_tiles = base + w.k_tiles, f.vt_tiles = base + w.vt_tiles;
    f.k_scale = reinterpret_cast<float*>(base + w.k_scale);
    f.v_scale = reinterpret_cast<float*>(base + w.v_scale);
    f.q_deq = q_deq != nullptr ? q_deq->data : nullptr;
    f.k_deq = k_deq != nullptr ? k_deq->data : nullptr;
    f.v_deq = v_deq != nullptr ? v_deq->data : nullptr;
    f.scale_rows = scale_rows;
    char err[1024] = {0};
    if (fn(&f, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "FP8 attention forward (q ", shape_string(*q), ", k ", shape_string(*k),
               ") failed: ", err);
    }
  });
}

pt_status pt_attention_fp8_bwd(const pt_tensor* dout, const pt_tensor* q, const pt_tensor* k, const pt_tensor* v,
                               const pt_tensor* out, const pt_tensor* lse, const pt_tensor* sink,
                               const pt_tensor* cu_seqlens_q, const pt_tensor* cu_seqlens_k, pt_tensor* dq,
                               pt_tensor* dk, pt_tensor* dv, pt_tensor* dsink, pt_tensor* delta,
                               int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, int32_t window_left,
                               int32_t window_right, void* workspace, size_t workspace_bytes,
                               size_t* workspace_needed, void* stream) {
  return api_guard([&] {
    if (workspace_needed != nullptr) *workspace_needed = 0;
    Problem p = make_problem(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, out, lse, max_seqlen_q, max_seqlen_k,
                             softmax_scale, window_left, window_right);
    add_backward(p, dout, dq, dk, dv, dsink, delta);
    PT_CHECK_SUPPORTED(fp8_backward_head_dims(p.params.head_dim, p.params.head_dim_v), "the FP8 attention backward ",
                       "supports head dims 64, 96 and 128 (q/k and v alike); got ", p.params.head_dim, "/",
                       p.params.head_dim_v, ": use the 16-bit backward (pt_attention_bwd) for this shape");
    if (no_gradients(dq, dk, dsink)) return;
    PtAttnFp8BwdParams f{};
    const size_t need = plan_backward(p.params, nullptr, &f);
    if (workspace_needed != nullptr) *workspace_needed = need;
    if (need > workspace_bytes) {
      PT_CHECK_ARG(workspace_needed != nullptr, "the FP8 attention backward needs ", need,
                   " bytes of workspace; pass workspace_needed to learn the size");
      return;
    }
    const int device = current_device();
    bind_device_context(device);
    const PtAttnFp8BwdFn fn =
        load_fp8_backward(p.dtype, p.params.head_dim, p.params.head_dim_v, arch_for_device(device));
    plan_backward(p.params, aligned_base(workspace), &f);
    f.base = p.params;
    f.base.stream = stream;
    char err[1024] = {0};
    if (fn(&f, err, sizeof(err)) != 0) {
      PT_THROW(PT_ERROR_CUDA, "FP8 attention backward (q ", shape_string(*q), ", k ", shape_string(*k),
               ") failed: ", err);
    }
  });
}

pt_status pt_attention_fp8_prepare(int32_t dtype, int32_t head_dim, int32_t head_dim_v) {
  return api_guard([&] {
    load_fp8_forward(dtype, head_dim, head_dim_v, "90a");
    if (fp8_backward_head_dims(head_dim, head_dim_v)) load_fp8_backward(dtype, head_dim, head_dim_v, "90a");
  });
}

}  // extern "C"
