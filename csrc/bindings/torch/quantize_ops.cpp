// primus_turbo::dequantize: FP8 / FP4 back to a 16- or 32-bit float, one native call (argument
// checks, the output allocation and the launch). The layout routing of turbo.ops.dequantize_fp8 /
// dequantize_fp4 (axis, leading dims, the padded MX layouts) stays in Python and hands this op a
// 2-D q with its scales as the quantizer wrote them; the core checks the scales against q.
// primus_turbo::quantize_fp8_with_amax: TENSORWISE FP8 with the amax reduced beforehand by the op
// that wrote x (e.g. the fused optimizer's update).
#include <tuple>

#include <torch/csrc/stable/ops.h>

#include "bindings/torch/fp8_quantize.h"
#include "bindings/torch/torch_binding.h"
#include "primus_turbo/quantization.h"

namespace primus_turbo::torch_binding {

namespace {

bool is_fp8(ScalarType t) { return t == ScalarType::Float8_e4m3fn || t == ScalarType::Float8_e5m2; }
bool is_fp4(ScalarType t) { return t == ScalarType::Float4_e2m1fn_x2 || t == ScalarType::Byte; }

// out [m, k] (k twice q's last dim for packed FP4) = q * scale_inv.
Tensor dequantize(Tensor q_in, Tensor scale_in, ScalarType out_dtype, int64_t granularity, int64_t block_size,
                  int64_t axis, int64_t flags) {
  constexpr const char* op = "dequantize";
  const int32_t device = check_cuda(op, {{"q", &q_in}, {"scale_inv", &scale_in}});
  if (q_in.dim() != 2) fail_with(ErrorKind::Value, op, ": argument 'q' has shape ", shape_string(q_in), "; expected 2-D");
  const ScalarType qt = q_in.scalar_type();
  if (!is_fp8(qt) && !is_fp4(qt))
    fail_with(ErrorKind::Type, op, ": argument 'q' has dtype ", dtype_name(qt),
              "; expected float8_e4m3fn, float8_e5m2 or float4_e2m1fn_x2 (or uint8 holding packed FP4)");
  if (!is_float_dtype(out_dtype))
    fail_with(ErrorKind::Type, op, ": argument 'out_dtype' is ", dtype_name(out_dtype),
              "; expected float32, float16 or bfloat16");
  const int64_t m = q_in.sizes()[0], k = q_in.sizes()[1] * (is_fp4(qt) ? 2 : 1);
  Tensor out = empty({m, k}, out_dtype, device);
  if (out.numel() == 0) return out;
  const Tensor q = as_contiguous(q_in), s = as_contiguous(scale_in);
  // A uint8 q is packed FP4 and a uint8 MX scale_inv is E8M0: the Python layer passes both as uint8
  // views, since torch's stable ABI converts neither float4_e2m1fn_x2 nor float8_e8m0fnu.
  const bool e8m0 = granularity == PT_QUANT_MX_BLOCKWISE && s.scalar_type() == ScalarType::Byte;
  const pt_tensor pq = is_fp4(qt) ? to_pt(q, PT_FLOAT4_E2M1_X2) : to_pt(q);
  const pt_tensor ps = e8m0 ? to_pt(s, PT_FLOAT8_E8M0) : to_pt(s);
  pt_tensor po = to_pt(out);
  DeviceScope scope(device);
  check_status(pt_dequantize(&pq, &ps, &po, static_cast<int32_t>(granularity), static_cast<int32_t>(block_size),
                             static_cast<int32_t>(axis), static_cast<int32_t>(flags), current_stream(device)),
               "dequantize");
  return out;
}

// (q with x's shape, 0-dim scale_inv, q_t): x quantized TENSORWISE with scale = FMT_MAX / amax[0], the
// same codes as quantizing x with its own amax pass when amax holds max |x|. With transposed, q_t
// is a 2-D x's codes stored transposed ([k, m], written in the same pass: a weight's dgrad copy),
// else a placeholder.
std::tuple<Tensor, Tensor, Tensor> quantize_fp8_with_amax(Tensor x_in, Tensor amax, ScalarType out_dtype,
                                                          bool transposed) {
  constexpr const char* op = "quantize_fp8_with_amax";
  if (!is_float_dtype(x_in.scalar_type()))
    fail_with(ErrorKind::Type, op, ": argument 'x' has dtype ", dtype_name(x_in.scalar_type()),
              "; expected float32, float16 or bfloat16");
  if (x_in.dim() < 1) fail_with(ErrorKind::Value, op, ": argument 'x' must have at least 1 dimension");
  if (transposed && x_in.dim() != 2)
    fail_with(ErrorKind::Value, op, ": a transposed copy needs a 2-D 'x', got shape ", shape_string(x_in));
  if (!is_fp8(out_dtype))
    fail_with(ErrorKind::Type, op, ": argument 'out_dtype' is ", dtype_name(out_dtype),
              "; expected float8_e4m3fn or float8_e5m2");
  if (amax.scalar_type() != ScalarType::Float || amax.numel() != 1)
    fail_with(ErrorKind::Value, op, ": argument 'amax' must be one float32 value, got ", dtype_name(amax.scalar_type()),
              " ", shape_string(amax));
  if (x_in.numel() == 0)
    fail_with(ErrorKind::Value, op, ": argument 'x' is empty (the Python layer quantizes empty tensors)");
  const int32_t device = check_cuda(op, {{"x", &x_in}, {"amax", &amax}});
  const Tensor x = as_contiguous(x_in), a = as_contiguous(amax);
  const int64_t cols = x.sizes()[x.dim() - 1];
  const Tensor rows = torch::stable::view(x, {x.numel() / cols, cols});
  QuantRequest request{&rows, QuantSpec{out_dtype, PT_QUANT_TENSORWISE}, true, transposed};
  request.amax = &a;
  DeviceScope scope(device);
  const auto q = quantize_fp8_jobs({request}, device, current_stream(device), op);
  const Quantized& row = *q[0].first;
  return {torch::stable::view(row.q, x.sizes()), row.s, transposed ? q[0].second->q : placeholder(device)};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(primus_turbo, m) {
  m.def("quantize_fp8_with_amax(Tensor x, Tensor amax, ScalarType out_dtype, bool transposed=False) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("dequantize(Tensor q, Tensor scale_inv, ScalarType out_dtype, int granularity, int block_size, int axis, "
        "int flags) -> Tensor");
}

static void register_kernels(torch::stable::detail::StableLibrary& m) {
  m.impl("dequantize", TORCH_BOX(&dequantize));
  m.impl("quantize_fp8_with_amax", TORCH_BOX(&quantize_fp8_with_amax));
}

PT_REGISTER_CUDA_AND_CPU(register_kernels)

}  // namespace primus_turbo::torch_binding
