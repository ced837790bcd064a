#include "ops/rope/rope_problem.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/tensor.h"

namespace primus_turbo::rope {

namespace {

void check_basic(const pt_tensor* t, const char* name) {
  check_descriptor(t, name);
  const int bits = dtype_bits(t->dtype);  // validates the code
  if (numel(*t) == 0) return;
  PT_CHECK_ARG(t->data != nullptr, "argument '", name, "' has a null data pointer");
  PT_CHECK_ARG(reinterpret_cast<uintptr_t>(t->data) % (bits / 8) == 0, "argument '", name,
               "' is not aligned to its element size");
}

void check_contiguous(const pt_tensor* t, const char* name) {
  check_basic(t, name);
  PT_CHECK_ARG(is_contiguous(*t), "argument '", name, "' with shape ", shape_string(*t), " must be contiguous");
}


bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// q or k: [d0, d1, heads, head_dim] (bshd, sbhd) or [tokens, heads, head_dim] (thd), unit stride
// on the last dimension. Returns the strides of the token dimensions and the head dimension.
struct Operand {
  int64_t n0, n1, heads, head_dim, s0, s1, sh;
};

Operand as_operand(const pt_tensor* t, const char* name, int layout) {
  check_basic(t, name);
  const int want = layout == PT_ROPE_THD ? 3 : 4;
  PT_CHECK_ARG(t->ndim == want, "argument '", name, "' has shape ", shape_string(*t), "; expected ", want,
               " dimensions ", layout == PT_ROPE_THD ? "[tokens, heads, head_dim] for layout thd"
                                                     : (layout == PT_ROPE_BSHD ? "[batch, seq, heads, head_dim] for layout bshd"
                                                                               : "[seq, batch, heads, head_dim] for layout sbhd"));
  PT_CHECK_ARG(is_float_dtype(t->dtype), "argument '", name, "' has dtype ", dtype_name(t->dtype),
               "; expected float32, float16 or bfloat16");
  const int d = t->ndim;
  PT_CHECK_ARG(numel(*t) == 0 || t->shape[d - 1] <= 1 || t->strides[d - 1] == 1, "argument '", name,
               "' must have unit stride on its last (head_dim) dimension");
  Operand o;
  o.head_dim = t->shape[d - 1];
  o.heads = t->shape[d - 2];
  o.sh = t->strides[d - 2];
  if (d == 3) {
    o.n0 = 1, o.n1 = t->shape[0], o.s0 = 0, o.s1 = t->strides[0];
  } else {
    o.n0 = t->shape[0], o.n1 = t->shape[1], o.s0 = t->strides[0], o.s1 = t->strides[1];
  }
  return o;
}

void check_output(const pt_tensor* out, const char* name, const pt_tensor& like, const char* like_name) {
  check_contiguous(out, name);
  bool same = out->ndim == like.ndim && out->dtype == like.dtype;
  for (int i = 0; same && i < out->ndim; ++i) same = out->shape[i] == like.shape[i];
  PT_CHECK_ARG(same, "argument '", name, "' (", dtype_name(out->dtype), " ", shape_string(*out),
               ") must have the shape and dtype of '", like_name, "' (", dtype_name(like.dtype), " ",
               shape_string(like), ")");
}

}  // namespace

int vector_width(int32_t dtype) { return 16 / (dtype_bits(dtype) / 8); }

int tokens_per_block(int64_t heads, int64_t items_per_head) {
  // About four work items per thread of a 256-thread block, within the kernel's 64 tokens a block.
  const int64_t per_token = std::max<int64_t>(1, heads * items_per_head);
  return static_cast<int>(std::clamp<int64_t>((4 * 256 + per_token - 1) / per_token, 1, 64));
}

Problem make_problem(const pt_tensor* q, const pt_tensor* k, const pt_tensor* cos, const pt_tensor* sin,
                     const pt_tensor* positions, const pt_tensor* cu_seqlens, const pt_tensor* q_out,
                     const pt_tensor* k_out, int32_t rotary_dim, double theta, int32_t interleaved,
                     int32_t layout, int32_t backward) {
  PT_CHECK_ARG(layout == PT_ROPE_BSHD || layout == PT_ROPE_SBHD || layout == PT_ROPE_THD, "argument 'layout' is ",
               layout, "; expected PT_ROPE_BSHD, PT_ROPE_SBHD or PT_ROPE_THD");
  const Operand oq = as_operand(q, "q", layout);
  const Operand ok = as_operand(k, "k", layout);
  PT_CHECK_ARG(k->dtype == q->dtype, "argument 'k' has dtype ", dtype_name(k->dtype), "; expected the dtype of 'q' (",
               dtype_name(q->dtype), ")");
  PT_CHECK_ARG(ok.n0 == oq.n0 && ok.n1 == oq.n1 && ok.head_dim == oq.head_dim, "argument 'k' has shape ",
               shape_string(*k), "; expected the shape of 'q' ", shape_string(*q), " except for the number of heads");
  check_output(q_out, "q_out", *q, "q");
  check_output(k_out, "k_out", *k, "k");
  PT_CHECK_ARG(oq.head_dim >= 2 && oq.head_dim <= kMaxHeadDim, "argument 'q' has head_dim ", oq.head_dim,
               "; expected 2 to ", kMaxHeadDim);
  const int64_t rot = rotary_dim == 0 ? oq.head_dim : rotary_dim;
  PT_CHECK_ARG(rot >= 2 && rot <= oq.head_dim && rot % 2 == 0, "argument 'rotary_dim' is ", rotary_dim,
               "; expected an even number from 2 to head_dim (", oq.head_dim, "), or 0 for head_dim");
  const int64_t seq_len = layout == PT_ROPE_SBHD ? oq.n0 : oq.n1;

  Problem p;
  PtRopeParams& r = p.params;
  p.dtype = q->dtype;
  p.interleaved = interleaved != 0;
  r.n0 = oq.n0, r.n1 = oq.n1;
  r.q_stride0 = oq.s0, r.q_stride1 = oq.s1, r.q_stride_h = oq.sh;
  r.k_stride0 = ok.s0, r.k_stride1 = ok.s1, r.k_stride_h = ok.sh;
  r.heads_q = static_cast<int32_t>(oq.heads), r.heads_k = static_cast<int32_t>(ok.heads);
  PT_CHECK_ARG(oq.heads <= 65536 && ok.heads <= 65536, "arguments 'q' and 'k' may have at most 65536 heads");
  r.head_dim = static_cast<int32_t>(oq.head_dim);
  r.rotary_dim = static_cast<int32_t>(rot);
  r.q = q->data, r.k = k->data, r.q_out = q_out->data, r.k_out = k_out->data;
  r.seq_dim = layout == PT_ROPE_SBHD ? 0 : 1;
  r.backward = backward != 0;

  PT_CHECK_ARG((cos == nullptr) == (sin == nullptr), "arguments 'cos' and 'sin' must be given together");
  p.table = cos != nullptr;
  if (p.table) {
    for (auto [t, name] : {std::pair{cos, "cos"}, std::pair{sin, "sin"}}) {
      check_contiguous(t, name);
      PT_CHECK_ARG(t->dtype == PT_FLOAT32, "argument '", name, "' has dtype ", dtype_name(t->dtype), "; expected float32");
      PT_CHECK_ARG(t->ndim == 2 && t->shape[1] == rot / 2, "argument '", name, "' has shape ", shape_string(*t),
                   "; expected [max_position, ", rot / 2, "] (rotary_dim / 2 columns)");
    }
    PT_CHECK_ARG(sin->shape[0] == cos->shape[0], "argument 'sin' has shape ", shape_string(*sin),
                 "; expected the shape of 'cos' ", shape_string(*cos));
    r.cos = static_cast<const float*>(cos->data), r.sin = static_cast<const float*>(sin->data);
    r.table_len = cos->shape[0];
  } else {
    PT_CHECK_ARG(std::isfinite(theta) && theta > 0, "argument 'theta' must be a positive finite number, got ", theta);
    r.log2_theta = std::log2(theta);
  }

  if (cu_seqlens != nullptr) {
    PT_CHECK_ARG(layout == PT_ROPE_THD, "argument 'cu_seqlens' needs layout thd (packed [tokens, heads, head_dim])");
    check_contiguous(cu_seqlens, "cu_seqlens");
    PT_CHECK_ARG(cu_seqlens->dtype == PT_INT32, "argument 'cu_seqlens' has dtype ", dtype_name(cu_seqlens->dtype),
                 "; expected int32");
    PT_CHECK_ARG(cu_seqlens->ndim == 1 && cu_seqlens->shape[0] >= 2, "argument 'cu_seqlens' has shape ",
                 shape_string(*cu_seqlens), "; expected [num_seqs + 1] with num_seqs >= 1");
    r.cu_seqlens = static_cast<const int32_t*>(cu_seqlens->data);
    r.num_seqs = cu_seqlens->shape[0] - 1;
  }
  if (positions != nullptr) {
    check_contiguous(positions, "positions");
    PT_CHECK_ARG(positions->dtype == PT_INT32 || positions->dtype == PT_INT64, "argument 'positions' has dtype ",
                 dtype_name(positions->dtype), "; expected int32 or int64");
    const bool shared = positions->ndim == 1 && positions->shape[0] == seq_len && layout != PT_ROPE_THD;
    bool per_token = positions->ndim == q->ndim - 2;
    for (int i = 0; per_token && i < positions->ndim; ++i) per_token = positions->shape[i] == q->shape[i];
    PT_CHECK_ARG(shared || per_token, "argument 'positions' has shape ", shape_string(*positions), "; expected ",
                 layout == PT_ROPE_THD ? str_cat("[", oq.n1, "] (one per token)")
                                       : str_cat("[", seq_len, "] (shared by the batch) or ", "[", q->shape[0], ", ",
                                                 q->shape[1], "] (one per token)"));
    r.positions = positions->data;
    r.positions_int64 = positions->dtype == PT_INT64;
    r.pos_mode = per_token ? PT_ROPE_POS_PER_TOKEN : PT_ROPE_POS_SHARED;
  } else if (cu_seqlens != nullptr) {
    r.pos_mode = PT_ROPE_POS_CU_SEQLENS;
  } else {
    r.pos_mode = PT_ROPE_POS_INDEX;
    if (p.table) {
      PT_CHECK_ARG(seq_len <= r.table_len, "arguments 'cos' / 'sin' have ", r.table_len,
                   " rows; the sequence has ", seq_len, " positions");
    }
  }

  const int vec = vector_width(p.dtype);
  const int item = p.interleaved ? std::max(vec, 2) : vec;
  const int64_t rot_elems = p.interleaved ? rot : rot / 2;
  p.vectorized = rot_elems % item == 0 && (oq.head_dim - rot) % vec == 0 && oq.head_dim % vec == 0;
  for (int64_t s : {oq.s0, oq.s1, oq.sh, ok.s0, ok.s1, ok.sh}) p.vectorized = p.vectorized && s % vec == 0;
  for (const void* ptr : {q->data, k->data, q_out->data, k_out->data}) p.vectorized = p.vectorized && aligned16(ptr);
  // The vector path also reads cos / sin rows in 16-byte pieces.
  if (p.table) p.vectorized = p.vectorized && aligned16(cos->data) && aligned16(sin->data);
  const int64_t v = p.vectorized ? vec : 1;
  const int64_t iv = p.interleaved ? std::max<int64_t>(v, 2) : v;
  const int64_t items_per_head = (p.interleaved ? rot / iv : rot / 2 / iv) + (oq.head_dim - rot) / v;
  r.tokens_per_block = tokens_per_block(oq.heads + ok.heads, items_per_head);
  return p;
}

}  // namespace primus_turbo::rope
