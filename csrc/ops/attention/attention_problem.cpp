#include "ops/attention/attention_problem.h"

#include <cmath>

#include "core/error.h"
#include "core/tensor.h"

namespace primus_turbo::attention {

namespace {

// [batch, seq, heads, dim] (fixed) or [tokens, heads, dim] (packed) with a unit last stride,
// rows the kernels' 16-byte copies can read.
struct Operand {
  int64_t batch, seq, heads, dim;
  int64_t sb, ss, sh;
};

Operand as_operand(const pt_tensor* t, const char* name, bool packed) {
  check_descriptor(t, name);
  PT_CHECK_ARG(t->dtype == PT_BFLOAT16 || t->dtype == PT_FLOAT16, "argument '", name, "' has dtype ",
               dtype_name(t->dtype), "; expected bfloat16 or float16");
  const int want = packed ? 3 : 4;
  PT_CHECK_ARG(t->ndim == want, "argument '", name, "' has shape ", shape_string(*t), "; expected ",
               packed ? "[total_tokens, heads, head_dim] with cu_seqlens" : "[batch, seqlen, heads, head_dim]");
  Operand o;
  const int d = t->ndim;
  o.dim = t->shape[d - 1], o.heads = t->shape[d - 2];
  o.sh = t->strides[d - 2];
  if (packed) {
    o.batch = 1, o.seq = t->shape[0], o.sb = 0, o.ss = t->strides[0];
  } else {
    o.batch = t->shape[0], o.seq = t->shape[1], o.sb = t->strides[0], o.ss = t->strides[1];
  }
  if (numel(*t) == 0) return o;
  PT_CHECK_ARG(t->data != nullptr, "argument '", name, "' has a null data pointer");
  PT_CHECK_ARG(o.dim <= 1 || t->strides[d - 1] == 1, "argument '", name,
               "' must have unit stride on its last (head_dim) dimension");
  bool aligned = aligned16(t->data);
  for (int i = 0; i < d - 1; ++i) aligned = aligned && (t->shape[i] <= 1 || t->strides[i] % 8 == 0);
  PT_CHECK_ARG(aligned, "argument '", name, "' (shape ", shape_string(*t),
               ") must have 16-byte aligned rows: a 16-byte aligned pointer and strides that are multiples of 8");
  return o;
}

void check_output(const pt_tensor* t, const char* name, std::initializer_list<int64_t> dims, int32_t dtype) {
  check_contiguous(t, name);
  check_shape(t, name, dims);
  PT_CHECK_ARG(t->ndim == static_cast<int>(dims.size()), "argument '", name, "' has shape ", shape_string(*t),
               "; expected ", dims.size(), " dimensions");
  PT_CHECK_ARG(t->dtype == dtype, "argument '", name, "' has dtype ", dtype_name(t->dtype), "; expected ",
               dtype_name(dtype));
  PT_CHECK_ARG(numel(*t) == 0 || aligned16(t->data), "argument '", name, "' must be 16-byte aligned");
}

const int32_t* seqlens(const pt_tensor* t, const char* name, int64_t batch) {
  check_contiguous(t, name);
  PT_CHECK_ARG(t->dtype == PT_INT32, "argument '", name, "' has dtype ", dtype_name(t->dtype), "; expected int32");
  PT_CHECK_ARG(t->ndim == 1 && t->shape[0] == batch + 1 && batch >= 1, "argument '", name, "' has shape ",
               shape_string(*t), batch >= 1 ? str_cat("; expected [", batch + 1, "] (num_seqs + 1)")
                                            : std::string("; expected [num_seqs + 1] with num_seqs >= 1"));
  return static_cast<const int32_t*>(t->data);
}

}  // namespace

bool unset_backward_on_ours(const Problem& p, bool deterministic) {
  return deterministic || (p.params.sink != nullptr && p.params.head_dim <= 64);
}

bool supported_head_dims(int64_t d, int64_t dv) {
  return (d == dv && (d == 64 || d == 96 || d == 128 || d == 192 || d == 256)) || (d == 192 && dv == 128);
}

Problem make_problem(const pt_tensor* q, const pt_tensor* k, const pt_tensor* v, const pt_tensor* sink,
                     const pt_tensor* cu_seqlens_q, const pt_tensor* cu_seqlens_k, const pt_tensor* out,
                     const pt_tensor* lse, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                     int32_t window_left, int32_t window_right) {
  PT_CHECK_ARG((cu_seqlens_q == nullptr) == (cu_seqlens_k == nullptr),
               "arguments 'cu_seqlens_q' and 'cu_seqlens_k' must be given together");
  const bool packed = cu_seqlens_q != nullptr;
  const Operand oq = as_operand(q, "q", packed), ok = as_operand(k, "k", packed), ov = as_operand(v, "v", packed);
  PT_CHECK_ARG(k->dtype == q->dtype && v->dtype == q->dtype, "arguments 'k' and 'v' have dtypes ",
               dtype_name(k->dtype), " and ", dtype_name(v->dtype), "; expected the dtype of 'q' (",
               dtype_name(q->dtype), ")");
  PT_CHECK_ARG(ok.batch == oq.batch && ov.batch == oq.batch, "arguments 'q', 'k', 'v' have shapes ",
               shape_string(*q), ", ", shape_string(*k), ", ", shape_string(*v), "; expected the same batch size");
  PT_CHECK_ARG(ov.seq == ok.seq && ov.heads == ok.heads, "argument 'v' has shape ", shape_string(*v),
               "; expected the sequence length and heads of 'k' ", shape_string(*k));
  PT_CHECK_ARG(ok.dim == oq.dim, "argument 'k' has head_dim ", ok.dim, "; expected the head_dim of 'q' (", oq.dim,
               ")");
  PT_CHECK_ARG(ok.heads >= 1 && oq.heads % ok.heads == 0, "argument 'k' has ", ok.heads,
               " heads; the number of heads of 'q' (", oq.heads, ") must be a multiple of it (GQA/MQA)");
  PT_CHECK_SUPPORTED(supported_head_dims(oq.dim, ov.dim), "head dims (q/k ", oq.dim, ", v ", ov.dim,
                     ") are not supported; expected 64, 96, 128, 192 or 256 for both, or 192 for q/k with 128 for v");
  PT_CHECK_ARG(std::isfinite(softmax_scale), "argument 'softmax_scale' must be finite, got ", softmax_scale);
  PT_CHECK_ARG(window_left >= -1 && window_right >= -1, "argument 'window_size' is (", window_left, ", ",
               window_right, "); each side must be >= 0, or -1 for unbounded");

  Problem p;
  PtAttnParams& r = p.params;
  p.dtype = q->dtype;
  r.q = q->data, r.k = k->data, r.v = v->data;
  r.heads_q = static_cast<int32_t>(oq.heads), r.heads_kv = static_cast<int32_t>(ok.heads);
  PT_CHECK_ARG(oq.heads <= 65535, "argument 'q' has ", oq.heads, " heads; at most 65535 are supported");
  r.head_dim = static_cast<int32_t>(oq.dim), r.head_dim_v = static_cast<int32_t>(ov.dim);
  r.q_sb = oq.sb, r.q_ss = oq.ss, r.q_sh = oq.sh;
  r.k_sb = ok.sb, r.k_ss = ok.ss, r.k_sh = ok.sh;
  r.v_sb = ov.sb, r.v_ss = ov.ss, r.v_sh = ov.sh;
  r.softmax_scale = static_cast<float>(softmax_scale);
  r.window_left = window_left, r.window_right = window_right;

  if (packed) {
    const int64_t batch = cu_seqlens_q->ndim == 1 ? cu_seqlens_q->shape[0] - 1 : 0;
    r.cu_seqlens_q = seqlens(cu_seqlens_q, "cu_seqlens_q", batch);
    r.cu_seqlens_k = seqlens(cu_seqlens_k, "cu_seqlens_k", batch);
    PT_CHECK_ARG(max_seqlen_q >= 0 && max_seqlen_k >= 0, "arguments 'max_seqlen_q' and 'max_seqlen_k' must be >= 0, got ",
                 max_seqlen_q, " and ", max_seqlen_k);
    PT_CHECK_ARG(batch <= 65535, "argument 'cu_seqlens_q' holds ", batch, " sequences; at most 65535 are supported");
    r.batch = batch;
    r.seqlen_q = max_seqlen_q, r.seqlen_k = max_seqlen_k;
    r.total_q = oq.seq, r.total_k = ok.seq;
    check_output(out, "out", {oq.seq, oq.heads, ov.dim}, q->dtype);
    check_output(lse, "lse", {oq.heads, oq.seq}, PT_FLOAT32);
    r.lse_sb = 0, r.lse_sh = oq.seq;
  } else {
    PT_CHECK_ARG(oq.batch <= 65535, "argument 'q' has batch ", oq.batch, "; at most 65535 are supported");
    r.batch = oq.batch;
    r.seqlen_q = oq.seq, r.seqlen_k = ok.seq;
    check_output(out, "out", {oq.batch, oq.seq, oq.heads, ov.dim}, q->dtype);
    check_output(lse, "lse", {oq.batch, oq.heads, oq.seq}, PT_FLOAT32);
    r.lse_sb = oq.heads * oq.seq, r.lse_sh = oq.seq;
  }
  PT_CHECK_ARG(r.seqlen_q <= (int64_t{1} << 30) && r.seqlen_k <= (int64_t{1} << 30),
               "sequences of more than 2^30 tokens are not supported");
  r.out = out->data;
  r.lse = static_cast<float*>(lse->data);
  const int d = out->ndim;
  r.o_sb = packed ? 0 : out->strides[0], r.o_ss = out->strides[d - 3], r.o_sh = out->strides[d - 2];
  if (sink != nullptr) {
    check_contiguous(sink, "sink");
    PT_CHECK_ARG(sink->dtype == PT_FLOAT32, "argument 'sink' has dtype ", dtype_name(sink->dtype), "; expected float32");
    PT_CHECK_ARG(sink->ndim == 1 && sink->shape[0] == oq.heads, "argument 'sink' has shape ", shape_string(*sink),
                 "; expected [", oq.heads, "] (one logit per query head)");
    r.sink = static_cast<const float*>(sink->data);
  }
  p.empty = numel(*q) == 0 && numel(*k) == 0;
  return p;
}

void add_backward(Problem& p, const pt_tensor* dout, const pt_tensor* dq, const pt_tensor* dk, const pt_tensor* dv,
                  const pt_tensor* dsink, const pt_tensor* delta) {
  PtAttnParams& r = p.params;
  const bool packed = r.cu_seqlens_q != nullptr;
  // dout: out's shape and dtype, read in place with a unit last stride and aligned rows.
  check_descriptor(dout, "dout");
  PT_CHECK_ARG(dout->dtype == p.dtype, "argument 'dout' has dtype ", dtype_name(dout->dtype), "; expected ",
               dtype_name(p.dtype));
  const int64_t rows = packed ? r.total_q : r.seqlen_q;
  if (packed) {
    check_shape(dout, "dout", {rows, r.heads_q, r.head_dim_v});
  } else {
    check_shape(dout, "dout", {r.batch, rows, r.heads_q, r.head_dim_v});
  }
  const Operand od = as_operand(dout, "dout", packed);
  r.dout = dout->data;
  r.do_sb = od.sb, r.do_ss = od.ss, r.do_sh = od.sh;
  auto grad = [&](const pt_tensor* g, const char* name, int64_t seq, int64_t heads, int64_t dim, int64_t& sb,
                  int64_t& ss, int64_t& sh) {
    if (packed) {
      check_output(g, name, {seq, heads, dim}, p.dtype);
      sb = 0, ss = g->strides[0], sh = g->strides[1];
    } else {
      check_output(g, name, {r.batch, seq, heads, dim}, p.dtype);
      sb = g->strides[0], ss = g->strides[1], sh = g->strides[2];
    }
    return g->data;
  };
  const int64_t seq_k = packed ? r.total_k : r.seqlen_k;
  r.dq = grad(dq, "dq", rows, r.heads_q, r.head_dim, r.dq_sb, r.dq_ss, r.dq_sh);
  r.dk = grad(dk, "dk", seq_k, r.heads_kv, r.head_dim, r.dk_sb, r.dk_ss, r.dk_sh);
  r.dv = grad(dv, "dv", seq_k, r.heads_kv, r.head_dim_v, r.dv_sb, r.dv_ss, r.dv_sh);
  if (packed) {
    check_output(delta, "delta", {r.heads_q, rows}, PT_FLOAT32);
  } else {
    check_output(delta, "delta", {r.batch, r.heads_q, rows}, PT_FLOAT32);
  }
  r.delta = static_cast<float*>(delta->data);
  PT_CHECK_ARG((dsink != nullptr) == (r.sink != nullptr), "argument 'dsink' must be given exactly when 'sink' is");
  if (dsink != nullptr) {
    check_output(dsink, "dsink", {r.heads_q}, PT_FLOAT32);
    r.dsink = static_cast<float*>(dsink->data);
  }
}

bool no_gradients(const pt_tensor* dq, const pt_tensor* dk, const pt_tensor* dsink) {
  return numel(*dq) == 0 && numel(*dk) == 0 && (dsink == nullptr || numel(*dsink) == 0);
}

}  // namespace primus_turbo::attention
