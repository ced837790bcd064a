// primus_turbo::attention_fwd / attention_bwd (and the FP8 pair): flash attention in one native
// call per direction.
// The core checks shapes, head dims, windows and sequence offsets; here: dtypes and devices, the
// conversions the kernels need (readable rows, float32 sinks, int32 offsets) and the outputs.
#include <optional>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/ops.h>

#include "bindings/torch/debug_readback.h"
#include "bindings/torch/torch_binding.h"

namespace primus_turbo::torch_binding {

namespace {

constexpr const char* kFwd = "flash_attn forward";
constexpr const char* kBwd = "flash_attn backward";

bool is_half(ScalarType t) { return t == ScalarType::BFloat16 || t == ScalarType::Half; }

// The kernels copy rows of 16 bytes: a unit last stride, other strides multiples of 8 elements, a
// 16-byte aligned pointer. Views that fit (slices of a fused qkv, transposed layouts) are read in
// place; anything else is copied once.
Tensor readable(const Tensor& t) {
  if (t.numel() == 0) return t;
  bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(t.dim() - 1) == 1;
  for (int64_t i = 0; ok && i + 1 < t.dim(); ++i) ok = t.sizes()[i] <= 1 || t.stride(i) % 8 == 0;
  return ok ? t : fresh_copy(t);  // a contiguous tensor off a 16-byte boundary is copied too
}

// q, k, v (and dout) share one 16-bit float dtype; ranks follow the layout: 3 packed, 4 fixed.
void check_operands(const char* op, const NamedTensors& tensors, bool packed) {
  const Tensor& q = *tensors[0].second;
  for (const auto& [name, t] : tensors) {
    if (!is_half(t->scalar_type()))
      fail_with(ErrorKind::Type, op, ": argument '", name, "' has dtype ", dtype_name(t->scalar_type()),
                "; expected torch.bfloat16 or torch.float16");
    if (t->scalar_type() != q.scalar_type())
      fail_with(ErrorKind::Type, op, ": argument '", name, "' has dtype ", dtype_name(t->scalar_type()),
                "; expected the dtype of 'q' (", dtype_name(q.scalar_type()), ")");
    if (t->dim() != (packed ? 3 : 4))
      fail_with(ErrorKind::Value, op, ": argument '", name, "' has shape ", shape_string(*t), "; expected ",
                packed ? "[total_tokens, heads, head_dim] (cu_seqlens given)" : "[batch, seqlen, heads, head_dim]");
  }
}

struct Optionals {
  std::optional<Tensor> sink, cu_q, cu_k;
  pt_tensor psink{}, pcu_q{}, pcu_k{};
  const pt_tensor* sink_ptr() const { return sink ? &psink : nullptr; }
  const pt_tensor* cu_q_ptr() const { return cu_q ? &pcu_q : nullptr; }
  const pt_tensor* cu_k_ptr() const { return cu_k ? &pcu_k : nullptr; }
};

Optionals convert(const std::optional<Tensor>& sink, const std::optional<Tensor>& cu_q,
                  const std::optional<Tensor>& cu_k) {
  Optionals o;
  if (sink) o.sink = contiguous_as(*sink, ScalarType::Float), o.psink = to_pt(*o.sink);
  if (cu_q) o.cu_q = contiguous_as(*cu_q, ScalarType::Int), o.pcu_q = to_pt(*o.cu_q);
  if (cu_k) o.cu_k = contiguous_as(*cu_k, ScalarType::Int), o.pcu_k = to_pt(*o.cu_k);
  return o;
}

void add_optionals(const char* op, NamedTensors& all, const std::optional<Tensor>& sink,
                   const std::optional<Tensor>& cu_q, const std::optional<Tensor>& cu_k) {
  // Converted below, but only from the dtypes that mean the same thing.
  if (sink && sink->scalar_type() != ScalarType::Float && !is_half(sink->scalar_type()))
    fail_with(ErrorKind::Type, op, ": argument 'sink' has dtype ", dtype_name(sink->scalar_type()),
              "; expected a floating-point dtype (float32)");
  for (const auto& [name, t] : {std::pair{"cu_seqlens_q", &cu_q}, std::pair{"cu_seqlens_k", &cu_k}})
    if (*t && (*t)->scalar_type() != ScalarType::Int && (*t)->scalar_type() != ScalarType::Long)
      fail_with(ErrorKind::Type, op, ": argument '", name, "' has dtype ", dtype_name((*t)->scalar_type()),
                "; expected torch.int32");
  if (sink) all.push_back({"sink", &*sink});
  if (cu_q) all.push_back({"cu_seqlens_q", &*cu_q});
  if (cu_k) all.push_back({"cu_seqlens_k", &*cu_k});
}

// PRIMUS_TURBO_CHECK_CU_SEQLENS=1 (debug): reads the int32 offsets back (a host sync, so never
// during a CUDA-graph capture) and checks that they start at 0 or more, never decrease, end within
// the rows of q / k and hold no sequence longer than max_seqlen. Without it bad offsets are
// clamped by the kernels (no access outside q, k, v or out) but give meaningless rows.
void check_offsets_on_host(const char* op, const Optionals& o, int64_t rows_q, int64_t rows_k, int64_t max_q,
                           int64_t max_k, void* stream) {
  constexpr const char* kVar = "PRIMUS_TURBO_CHECK_CU_SEQLENS";
  if (!o.cu_q || !o.cu_k || !debug_readback_on(kVar, stream)) return;
  for (const auto& [name, t, rows, longest, of] : {std::tuple{"cu_seqlens_q", &*o.cu_q, rows_q, max_q, "'q'"},
                                                   std::tuple{"cu_seqlens_k", &*o.cu_k, rows_k, max_k, "'k'"}}) {
    const std::vector<int32_t> host = read_back<int32_t>(op, *t, name, kVar, stream);
    if (!host.empty() && host[0] < 0) fail_with(ErrorKind::Value, op, ": ", name, "[0] = ", host[0], " is negative");
    for (size_t i = 1; i < host.size(); ++i) {
      const int64_t len = int64_t{host[i]} - host[i - 1];
      if (len < 0)
        fail_with(ErrorKind::Value, op, ": ", name, " decreases at index ", i, " (", host[i - 1], " -> ", host[i], ")");
      if (len > longest)
        fail_with(ErrorKind::Value, op, ": ", name, " holds a sequence of ", len, " tokens (index ", i - 1,
                  "), longer than max_seqlen ", longest);
    }
    if (!host.empty() && host.back() > rows)
      fail_with(ErrorKind::Value, op, ": ", name, " ends at ", host.back(), ", past the ", rows, " tokens of ", of);
  }
}

// Calls run(workspace, bytes, &needed) without a workspace; when the backend needed one (cuDNN's
// graphs may), allocates it from torch's pool and calls again.
template <class Run>
void with_workspace(int32_t device, const char* op, Run&& run) {
  size_t needed = 0;
  check_status(run(nullptr, 0, &needed), op);
  if (needed == 0) return;
  Tensor ws = empty({static_cast<int64_t>(needed)}, ScalarType::Byte, device);
  check_status(run(ws.data_ptr(), needed, &needed), op);
}

// lse (and the backward's delta): float32 [B, Hq, Sq], or [Hq, Tq] packed.
Tensor empty_lse(const Tensor& q, bool packed, int32_t device) {
  const auto s = q.sizes();
  return packed ? empty({s[1], s[0]}, ScalarType::Float, device) : empty({s[0], s[2], s[1]}, ScalarType::Float, device);
}

// What both forwards do before their launch: the checks, operands the kernels can read, the
// converted optionals and the outputs.
struct Forward {
  Tensor q, k, v, out, lse;
  Optionals o;
  int32_t device;
  pt_tensor pq, pk, pv, po, pl;
};

Forward prepare_forward(const char* op, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                        const std::optional<Tensor>& sink, const std::optional<Tensor>& cu_q,
                        const std::optional<Tensor>& cu_k) {
  const bool packed = cu_q.has_value() || cu_k.has_value();
  check_operands(op, {{"q", &q_in}, {"k", &k_in}, {"v", &v_in}}, packed);
  NamedTensors all{{"q", &q_in}, {"k", &k_in}, {"v", &v_in}};
  add_optionals(op, all, sink, cu_q, cu_k);
  Forward f;
  f.device = check_cuda(op, all);
  f.q = readable(q_in), f.k = readable(k_in), f.v = readable(v_in);
  f.o = convert(sink, cu_q, cu_k);
  const auto qs = f.q.sizes();
  const int64_t dv = f.v.sizes()[f.v.dim() - 1];
  f.out = packed ? empty({qs[0], qs[1], dv}, f.q.scalar_type(), f.device)
                 : empty({qs[0], qs[1], qs[2], dv}, f.q.scalar_type(), f.device);
  f.lse = empty_lse(f.q, packed, f.device);
  f.pq = to_pt(f.q), f.pk = to_pt(f.k), f.pv = to_pt(f.v), f.po = to_pt(f.out), f.pl = to_pt(f.lse);
  return f;
}

std::tuple<Tensor, Tensor> attention_fwd(Tensor q_in, Tensor k_in, Tensor v_in, std::optional<Tensor> sink_in,
                                         std::optional<Tensor> cu_q_in, std::optional<Tensor> cu_k_in,
                                         int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                                         int64_t window_left, int64_t window_right, int64_t backend) {
  Forward f = prepare_forward(kFwd, q_in, k_in, v_in, sink_in, cu_q_in, cu_k_in);
  DeviceScope scope(f.device);
  void* stream = current_stream(f.device);
  check_offsets_on_host(kFwd, f.o, f.q.sizes()[0], f.k.sizes()[0], max_seqlen_q, max_seqlen_k, stream);
  with_workspace(f.device, kFwd, [&](void* ws, size_t bytes, size_t* needed) {
    return pt_attention_fwd(&f.pq, &f.pk, &f.pv, f.o.sink_ptr(), f.o.cu_q_ptr(), f.o.cu_k_ptr(), &f.po, &f.pl,
                            max_seqlen_q, max_seqlen_k, softmax_scale, static_cast<int32_t>(window_left),
                            static_cast<int32_t>(window_right), static_cast<int32_t>(backend), ws, bytes, needed,
                            stream);
  });
  return {f.out, f.lse};
}

// FP8 forward: attention_fwd's outputs from q, k and v quantized blockwise (scale_rows rows per
// scale) inside the native call, and with `dequantized` the 16-bit q, k, v it computed with (else
// empty placeholders): attention_bwd on those, with this out and lse, is its backward.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> attention_fp8_fwd(
    Tensor q_in, Tensor k_in, Tensor v_in, std::optional<Tensor> sink_in, std::optional<Tensor> cu_q_in,
    std::optional<Tensor> cu_k_in, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
    int64_t window_left, int64_t window_right, int64_t scale_rows, bool dequantized) {
  constexpr const char* op = "flash_attn_fp8 forward";
  Forward f = prepare_forward(op, q_in, k_in, v_in, sink_in, cu_q_in, cu_k_in);
  DeviceScope scope(f.device);
  void* stream = current_stream(f.device);
  check_offsets_on_host(op, f.o, f.q.sizes()[0], f.k.sizes()[0], max_seqlen_q, max_seqlen_k, stream);
  // Tokens outside every packed sequence are never written, and without queries nothing is: zeros,
  // not garbage, for the backward.
  const bool untouched_rows = cu_q_in.has_value() || f.out.numel() == 0;
  auto copy_of = [&](const Tensor& t) {
    if (!dequantized) return placeholder(f.device);
    Tensor c = empty(t.sizes().data(), t.dim(), t.scalar_type(), f.device);
    if (untouched_rows) torch::stable::zero_(c);
    return c;
  };
  Tensor qd = copy_of(f.q), kd = copy_of(f.k), vd = copy_of(f.v);
  pt_tensor pqd = to_pt(qd), pkd = to_pt(kd), pvd = to_pt(vd);
  with_workspace(f.device, op, [&](void* ws, size_t bytes, size_t* needed) {
    return pt_attention_fp8_fwd(&f.pq, &f.pk, &f.pv, f.o.sink_ptr(), f.o.cu_q_ptr(), f.o.cu_k_ptr(), &f.po, &f.pl,
                                dequantized ? &pqd : nullptr, dequantized ? &pkd : nullptr,
                                dequantized ? &pvd : nullptr, max_seqlen_q, max_seqlen_k, softmax_scale,
                                static_cast<int32_t>(window_left), static_cast<int32_t>(window_right),
                                static_cast<int32_t>(scale_rows), ws, bytes, needed, stream);
  });
  return {f.out, f.lse, qd, kd, vd};
}

// The C API views of a backward's tensors; sink: &pdsink when the forward had a sink, else null.
struct BackwardPointers {
  pt_tensor pdo, pq, pk, pv, po, pl, pdq, pdk, pdv, pdsink, pdelta;
  pt_tensor* sink;
};

// What both backwards do: the checks, readable operands, the gradients and delta, then
// run(pointers, workspace, bytes, needed) through with_workspace.
template <class Run>
std::tuple<Tensor, Tensor, Tensor, Tensor> backward_call(const char* op, const Tensor& dout_in, const Tensor& q_in,
                                                         const Tensor& k_in, const Tensor& v_in, const Tensor& out,
                                                         const Tensor& lse, const std::optional<Tensor>& sink_in,
                                                         const std::optional<Tensor>& cu_q_in,
                                                         const std::optional<Tensor>& cu_k_in, Run&& run) {
  const bool packed = cu_q_in.has_value() || cu_k_in.has_value();
  check_operands(op, {{"q", &q_in}, {"k", &k_in}, {"v", &v_in}, {"out", &out}, {"dout", &dout_in}}, packed);
  NamedTensors all{{"dout", &dout_in}, {"q", &q_in}, {"k", &k_in}, {"v", &v_in}, {"out", &out}, {"lse", &lse}};
  add_optionals(op, all, sink_in, cu_q_in, cu_k_in);
  const int32_t device = check_cuda(op, all);
  const Tensor q = readable(q_in), k = readable(k_in), v = readable(v_in), dout = readable(dout_in);
  const Tensor o_c = as_contiguous(out), lse_c = as_contiguous(lse);
  const Optionals o = convert(sink_in, cu_q_in, cu_k_in);
  Tensor dq = empty(q.sizes().data(), q.dim(), q.scalar_type(), device);
  Tensor dk = empty(k.sizes().data(), k.dim(), k.scalar_type(), device);
  Tensor dv = empty(v.sizes().data(), v.dim(), v.scalar_type(), device);
  Tensor dsink = empty({sink_in ? q.sizes()[q.dim() - 2] : 0}, ScalarType::Float, device);
  Tensor delta = empty_lse(q, packed, device);
  BackwardPointers b{to_pt(dout), to_pt(q),  to_pt(k),  to_pt(v),     to_pt(o_c),   to_pt(lse_c),
                     to_pt(dq),   to_pt(dk), to_pt(dv), to_pt(dsink), to_pt(delta), {}};
  b.sink = sink_in ? &b.pdsink : nullptr;
  DeviceScope scope(device);
  void* stream = current_stream(device);
  with_workspace(device, op, [&](void* ws, size_t bytes, size_t* needed) { return run(b, o, ws, bytes, needed, stream); });
  return {dq, dk, dv, dsink};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                                         Tensor lse, std::optional<Tensor> sink,
                                                         std::optional<Tensor> cu_q, std::optional<Tensor> cu_k,
                                                         int64_t max_seqlen_q, int64_t max_seqlen_k,
                                                         double softmax_scale, int64_t window_left,
                                                         int64_t window_right, int64_t backend, bool deterministic) {
  return backward_call(kBwd, dout, q, k, v, out, lse, sink, cu_q, cu_k,
                       [&](BackwardPointers& b, const Optionals& o, void* ws, size_t bytes, size_t* needed,
                           void* stream) {
                         return pt_attention_bwd(&b.pdo, &b.pq, &b.pk, &b.pv, &b.po, &b.pl, o.sink_ptr(),
                                                 o.cu_q_ptr(), o.cu_k_ptr(), &b.pdq, &b.pdk, &b.pdv, b.sink,
                                                 &b.pdelta, max_seqlen_q, max_seqlen_k, softmax_scale,
                                                 static_cast<int32_t>(window_left), static_cast<int32_t>(window_right),
                                                 static_cast<int32_t>(backend), deterministic ? 1 : 0, ws, bytes,
                                                 needed, stream);
                       });
}

// FP8 backward: attention_bwd's gradients from our FP8 kernels, on the dequantized q, k, v that
// attention_fp8_fwd handed back (deterministic by construction).
std::tuple<Tensor, Tensor, Tensor, Tensor> attention_fp8_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                                             Tensor lse, std::optional<Tensor> sink,
                                                             std::optional<Tensor> cu_q, std::optional<Tensor> cu_k,
                                                             int64_t max_seqlen_q, int64_t max_seqlen_k,
                                                             double softmax_scale, int64_t window_left,
                                                             int64_t window_right) {
  return backward_call("flash_attn_fp8 backward", dout, q, k, v, out, lse, sink, cu_q, cu_k,
                       [&](BackwardPointers& b, const Optionals& o, void* ws, size_t bytes, size_t* needed,
                           void* stream) {
                         return pt_attention_fp8_bwd(&b.pdo, &b.pq, &b.pk, &b.pv, &b.po, &b.pl, o.sink_ptr(),
                                                     o.cu_q_ptr(), o.cu_k_ptr(), &b.pdq, &b.pdk, &b.pdv, b.sink,
                                                     &b.pdelta, max_seqlen_q, max_seqlen_k, softmax_scale,
                                                     static_cast<int32_t>(window_left),
                                                     static_cast<int32_t>(window_right), ws, bytes, needed, stream);
                       });
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("attention_fwd(Tensor q, Tensor k, Tensor v, Tensor? sink, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
        "int max_seqlen_q, int max_seqlen_k, float softmax_scale, int window_left, int window_right, int backend) "
        "-> (Tensor, Tensor)");
  m.def("attention_fp8_fwd(Tensor q, Tensor k, Tensor v, Tensor? sink, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
        "int max_seqlen_q, int max_seqlen_k, float softmax_scale, int window_left, int window_right, int scale_rows, "
        "bool dequantized) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? sink, "
        "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
        "int window_left, int window_right, int backend, bool deterministic) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("attention_fp8_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? sink, "
        "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
        "int window_left, int window_right) -> (Tensor, Tensor, Tensor, Tensor)");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("attention_fwd", TORCH_BOX(&attention_fwd));
  m.impl("attention_fp8_fwd", TORCH_BOX(&attention_fp8_fwd));
  m.impl("attention_bwd", TORCH_BOX(&attention_bwd));
  m.impl("attention_fp8_bwd", TORCH_BOX(&attention_fp8_bwd));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
