"""The native op layer (csrc/bindings/torch) on the host: every native op is registered with its
schema, its argument errors surface as the Python exception classes the fake implementations
raise, and under fake CUDA tensors (torch.compile's tracing) forward and backward give shapes."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import primus_turbo.pytorch as turbo
from primus_turbo._core import TurboError, TurboNotSupportedError
from primus_turbo.pytorch.core import native
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity

NATIVE_OPS = {
    "gemm": "gemm(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype) -> Tensor",
    "gemm_accum_": "gemm_accum_(Tensor a, Tensor b, Tensor(a!) out, bool trans_a, bool trans_b) -> ()",
    "rmsnorm_fwd": "rmsnorm_fwd(Tensor x, Tensor gamma, float eps, bool zero_centered) -> (Tensor, Tensor)",
    "rmsnorm_bwd": "rmsnorm_bwd(Tensor dy, Tensor x, Tensor gamma, Tensor rstd, bool zero_centered)",
    "rmsnorm_residual_fwd": "rmsnorm_residual_fwd(Tensor x, Tensor residual, Tensor gamma, float eps",
    "rmsnorm_residual_bwd": "rmsnorm_residual_bwd(Tensor dy, Tensor? dsum, Tensor s, Tensor gamma",
    "layernorm_fwd": "layernorm_fwd(Tensor x, Tensor gamma, Tensor beta, float eps)",
    "layernorm_bwd": "layernorm_bwd(Tensor dy, Tensor x, Tensor gamma, Tensor mean, Tensor rstd)",
    "rope": "rope(Tensor q, Tensor k, Tensor? cos, Tensor? sin, Tensor? positions, Tensor? cu_seqlens",
    "attention_fwd": "attention_fwd(Tensor q, Tensor k, Tensor v, Tensor? sink, Tensor? cu_seqlens_q",
    "attention_bwd": "attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? sink",
    "grouped_gemm": "grouped_gemm(Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs, bool trans_b, int num_sms)",
    "grouped_gemm_wgrad": "grouped_gemm_wgrad(Tensor a, Tensor grad_out, Tensor group_lens, Tensor? group_offs",
    "gemm_fp8": "gemm_fp8(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype, ScalarType fwd_dtype",
    "dequantize": "dequantize(Tensor q, Tensor scale_inv, ScalarType out_dtype, int granularity, int block_size",
    "gated_act_fwd": "gated_act_fwd(Tensor x, Tensor? probs, Tensor? row_mask, int act) -> Tensor",
    "gated_act_bwd": "gated_act_bwd(Tensor dy, Tensor x, Tensor? probs, Tensor? row_mask, int act, bool need_dprobs)",
    "gated_act_fwd_amax": "gated_act_fwd_amax(Tensor x, Tensor? probs, Tensor? row_mask, int act) -> (Tensor, Tensor)",
    "gated_act_bwd_amax": "gated_act_bwd_amax(Tensor dy, Tensor x, Tensor? probs, Tensor? row_mask, int act",
    "swiglu_mlp_fp8": "swiglu_mlp_fp8(Tensor x, Tensor w_gate_up, Tensor w_down, ScalarType fwd_dtype, bool fast_accum",
    "swiglu_mlp_fp8_fwd": "swiglu_mlp_fp8_fwd(Tensor x, Tensor w_gate_up, Tensor w_down, ScalarType fwd_dtype",
    "swiglu_mlp_fp8_bwd": "swiglu_mlp_fp8_bwd(Tensor dy, Tensor h, Tensor x_bwd, Tensor sx_bwd, Tensor wgu_bwd",
    "moe_token_permute": "moe_token_permute(Tensor tokens, Tensor routing_map, Tensor? probs, int num_out)",
    "moe_token_unpermute": "moe_token_unpermute(Tensor input, Tensor row_id_map, Tensor? merging_probs",
    "gemm_fp8_fwd": "gemm_fp8_fwd(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype",
    "gemm_fp8_bwd": "gemm_fp8_bwd(Tensor grad_out, Tensor a_bwd, Tensor sa_bwd, Tensor b_bwd, Tensor sb_bwd",
    "gemm_fp8_fwd_qb": "gemm_fp8_fwd_qb(Tensor a, Tensor b_q, Tensor b_scale_inv, int b_scaling, bool trans_a",
    "swiglu_mlp_fp8_fwd_qw": "swiglu_mlp_fp8_fwd_qw(Tensor x, Tensor wgu_q, Tensor wgu_s, Tensor wd_q, Tensor wd_s",
    "quantize_fp8_with_amax": "quantize_fp8_with_amax(Tensor x, Tensor amax, ScalarType out_dtype, bool transposed=False)",
    "moe_index_permute": "moe_index_permute(Tensor tokens, Tensor expert_map, Tensor? probs, Tensor? scaling_factor",
    "gemm_fp4_fwd": "gemm_fp4_fwd(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype, bool two_d",
    "gemm_fp4_bwd": "gemm_fp4_bwd(Tensor grad_out, Tensor qbn, Tensor sbn, Tensor qam, Tensor sam, bool trans_a",
    "grouped_gemm_fp4_fwd": "grouped_gemm_fp4_fwd(Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs, bool trans_b",
    "grouped_gemm_fp4_bwd": "grouped_gemm_fp4_bwd(Tensor grad_out, Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs",
    "grouped_gemm_fp8_fwd": "grouped_gemm_fp8_fwd(Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs, bool trans_b",
    "grouped_gemm_fp8_bwd": "grouped_gemm_fp8_bwd(Tensor grad_out, Tensor a, Tensor b, Tensor wq, Tensor ws",
    "grouped_gemm_fp8_mm": "grouped_gemm_fp8_mm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor group_lens",
    "grouped_gemm_fp8_wgrad_mm": "grouped_gemm_fp8_wgrad_mm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale",
    "grouped_weight_rows_fp8": "grouped_weight_rows_fp8(Tensor w, ScalarType out_dtype) -> (Tensor, Tensor, Tensor, Tensor)",
}


@pytest.mark.parametrize("name", sorted(NATIVE_OPS))
def test_native_op_is_registered_with_its_schema(name):
    op = getattr(torch.ops.primus_turbo, name).default
    assert f"primus_turbo::{NATIVE_OPS[name]}" in str(op._schema)
    # A native op has a CUDA and a CPU kernel (the CPU one only reports the device error).
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CPU")


def _cpu(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=dtype)


def _direct(op, *args):
    """Calls a native op directly (the public functions translate its errors; this does the same)."""
    return native.raises_python_errors(op)(*args)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: turbo.ops.gemm(_cpu(4, 8), _cpu(8, 3)), "gemm: argument 'a' is on cpu; expected a CUDA device"),
        (lambda: turbo.ops.rmsnorm(_cpu(4, 8), _cpu(8)), "rmsnorm: argument 'x' is on cpu"),
        (
            lambda: turbo.ops.dequantize_fp8(_cpu(4, 8).to(torch.float8_e4m3fn), torch.bfloat16,
                                             ScalingGranularity.ROWWISE, axis=-1, scale_inv=_cpu(4, 1, dtype=torch.float32)),
            "dequantize_fp8: argument 'x' is on cpu",
        ),
        (lambda: turbo.ops.layernorm(_cpu(4, 8), _cpu(8), _cpu(8)), "layernorm: argument 'x' is on cpu"),
        (lambda: turbo.ops.rmsnorm_residual(_cpu(4, 8), _cpu(4, 8), _cpu(8)), "rmsnorm_residual: argument 'x' is on cpu"),
        (lambda: turbo.ops.rope(_cpu(1, 4, 2, 8), _cpu(1, 4, 2, 8)), "rope: argument 'q' is on cpu"),
        (
            lambda: turbo.ops.grouped_gemm(_cpu(4, 8), _cpu(2, 8, 3), torch.tensor([2, 2])),
            "grouped_gemm: argument 'a' is on cpu",
        ),
        (
            lambda: _direct(
                torch.ops.primus_turbo.gemm_fp8_fwd,
                _cpu(16, 16), _cpu(16, 16), False, True, torch.bfloat16, torch.float8_e4m3fn, 1, False,
            ),
            "gemm_fp8: argument 'a' is on cpu",
        ),
        (
            lambda: _direct(
                torch.ops.primus_turbo.gemm_fp8, _cpu(16, 16), _cpu(16, 16), False, True, torch.bfloat16,
                torch.float8_e4m3fn, 0,
            ),
            "gemm_fp8: argument 'a' is on cpu",
        ),
    ],
)
def test_cpu_tensors_raise_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "w,dtype,error,match",
    [
        (_cpu(2, 128, 64), torch.float8_e4m3fn, ValueError, "argument 'w' is on cpu"),
        (_cpu(2, 100, 64), torch.float8_e4m3fn, ValueError, "N a multiple of 128"),
        (_cpu(2, 128, 40), torch.float8_e4m3fn, ValueError, "K of 16"),
        (_cpu(128, 64), torch.float8_e4m3fn, ValueError, r"expected w \[G, N, K\]"),
        (_cpu(2, 128, 64), torch.bfloat16, TypeError, "out_dtype"),
        (_cpu(2, 128, 64, dtype=torch.float32), torch.float8_e4m3fn, TypeError, "bfloat16 or float16"),
    ],
)
def test_grouped_weight_rows_checks_before_launch(w, dtype, error, match):
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_weight_rows

    with pytest.raises(error, match=match):
        grouped_weight_rows(w, dtype)


def test_grouped_weight_rows_shapes_under_fake_cuda_tensors():
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_weight_rows

    with FakeTensorMode():
        w = torch.empty(4, 256, 96, dtype=torch.bfloat16, device="cuda")
        shapes = [tuple(t.shape) for t in grouped_weight_rows(w, torch.float8_e4m3fn)]
    assert shapes == [(4, 256, 96), (4, 256), (4, 96, 256), (4, 96)]


def test_native_checks_raise_the_fake_implementations_classes():
    # The C++ checks run before the device check, with the fake implementation's words and class.
    with pytest.raises(TypeError, match="gemm: argument 'a' has dtype torch.int32"):
        turbo.ops.gemm(torch.zeros(4, 8, dtype=torch.int32), torch.zeros(8, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"inner dimensions do not match: op\(a\) is \[4, 8\]"):
        turbo.ops.gemm(_cpu(4, 8), _cpu(7, 3))
    with pytest.raises(ValueError, match="argument 'gamma' has shape"):
        _direct(torch.ops.primus_turbo.rmsnorm_fwd, _cpu(4, 8), _cpu(7), 1e-6, False)
    with pytest.raises(ValueError, match="K=8 must be a multiple of 16"):
        _direct(
            torch.ops.primus_turbo.gemm_fp8_fwd,
            _cpu(16, 8), _cpu(16, 8), False, True, torch.bfloat16, torch.float8_e4m3fn, 1, False,
        )


E4M3 = torch.float8_e4m3fn


def _fwd_qb(a, b_q, b_s, b_scaling=0, granularity=0):
    return _direct(torch.ops.primus_turbo.gemm_fp8_fwd_qb, a, b_q, b_s, b_scaling, False, torch.bfloat16, E4M3,
                   granularity, True)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: _fwd_qb(_cpu(32, 64), _cpu(48, 64).to(torch.float8_e5m2), _cpu(1, dtype=torch.float32)), TypeError,
         "argument 'b_q' has dtype torch.float8_e5m2; expected torch.float8_e4m3fn"),
        (lambda: _fwd_qb(_cpu(32, 64), _cpu(48, 32).to(E4M3), _cpu(1, dtype=torch.float32)), ValueError,
         r"argument 'b_q' must be \[N, K=64\]"),
        (lambda: _fwd_qb(_cpu(32, 64), _cpu(64, 48).to(E4M3).t(), _cpu(1, dtype=torch.float32)), ValueError,
         "argument 'b_q' must be contiguous"),
        (lambda: _fwd_qb(_cpu(32, 64), _cpu(48, 64).to(E4M3), _cpu(1, dtype=torch.float32), 3, 0), ValueError,
         "argument 'b_q' has scaling code 3; granularity code 0 reads weights with code 0"),
        (lambda: _fwd_qb(_cpu(32, 64), _cpu(48, 64).to(E4M3), _cpu(47, dtype=torch.float32), 1, 1), ValueError,
         "argument 'b_scale_inv'"),
        (lambda: _fwd_qb(_cpu(32, 256), _cpu(256, 256).to(E4M3), _cpu(2, 3, dtype=torch.float32), 3, 2), ValueError,
         "argument 'b_scale_inv'"),
        (lambda: _fwd_qb(_cpu(30, 64), _cpu(48, 64).to(E4M3), _cpu(1, dtype=torch.float32)), ValueError,
         "the backward needs M=30 and N=48 to be multiples of 16"),
        (lambda: _fwd_qb(_cpu(32, 64), _cpu(48, 64).to(E4M3), _cpu(1, dtype=torch.float32)), ValueError,
         "gemm_fp8: argument 'a' is on cpu"),
        (lambda: _direct(torch.ops.primus_turbo.swiglu_mlp_fp8_fwd_qw, _cpu(32, 64), _cpu(96, 64).to(E4M3),
                         _cpu(1, dtype=torch.float32), _cpu(64, 32).to(E4M3), _cpu(1, dtype=torch.float32), E4M3),
         ValueError, r"swiglu_mlp_fp8: expected x \[M, H\], w_gate_up \[2I, H\] and w_down \[H, I\]"),
        (lambda: _direct(torch.ops.primus_turbo.quantize_fp8_with_amax, _cpu(2, 16, 32), _cpu(1, dtype=torch.float32),
                         E4M3, True), ValueError, "a transposed copy needs a 2-D 'x'"),
    ],
)
def test_prequantized_weight_arguments_are_checked_before_launch(call, error, match):
    # A weight's FP8 copy comes from outside the op (a layer's per-step cache): its dtype, shape,
    # layout and scales are checked, on any device, before the device check.
    with pytest.raises(error, match=match):
        call()


def test_argument_types_the_dispatcher_refuses_become_type_errors_naming_them():
    # torch's dispatcher checks argument types against the schema before the op runs.
    with pytest.raises(TypeError, match="gemm_fp8: argument 'out_dtype' must be int, got str"):
        _direct(torch.ops.primus_turbo.gemm_fp8, _cpu(16, 16), _cpu(16, 16), False, True, "bf16",
                torch.float8_e4m3fn, 0)
    with pytest.raises(TypeError, match="argument 'sin' must be Optional\\[Tensor\\]"):
        _direct(torch.ops.primus_turbo.rope, _cpu(2, 4, 2, 8), _cpu(2, 4, 2, 8), _cpu(4, 8), 3, None, None,
                False, 0, 1.0)


def test_translate_maps_tags_and_leaves_other_errors():
    assert type(native.translate(RuntimeError("[primus_turbo:ValueError] x: bad"))) is ValueError
    assert str(native.translate(RuntimeError("[primus_turbo:TypeError] x: bad\nmore"))) == "x: bad"
    assert isinstance(native.translate(RuntimeError("[primus_turbo:NotImplementedError] n")), TurboNotSupportedError)
    assert isinstance(native.translate(RuntimeError("[primus_turbo:RuntimeError] r")), TurboError)
    plain = RuntimeError("not ours")
    assert native.translate(plain) is plain


@pytest.mark.parametrize("granularity", [ScalingGranularity.TENSORWISE, ScalingGranularity.ROWWISE, ScalingGranularity.BLOCKWISE])
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False), (False, False)])
def test_gemm_fp8_native_path_shapes_under_fake_cuda_tensors(granularity, trans_a, trans_b):
    block = 128 if granularity == ScalingGranularity.BLOCKWISE else None
    config = Float8QuantConfig(format=Format.HYBRID, granularity=granularity, block_size=block)
    m, k, n = 48, 160, 32
    code = {ScalingGranularity.TENSORWISE: 0, ScalingGranularity.ROWWISE: 1, ScalingGranularity.BLOCKWISE: 2}[granularity]
    with FakeTensorMode():
        a = torch.empty((k, m) if trans_a else (m, k), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.empty((n, k) if trans_b else (k, n), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out = turbo.ops.gemm_fp8(a, b, trans_a, trans_b, config=config)  # the native autograd path
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        # The backward's op on the forward's saved copies (a fake CUDA backward needs a GPU context).
        fp8 = torch.float8_e4m3fn
        _, a_bwd, sa, b_bwd, sb = torch.ops.primus_turbo.gemm_fp8_fwd(a, b, trans_a, trans_b, torch.bfloat16, fp8, code, True)
        assert a_bwd.shape == (k, m) and b_bwd.shape == (k, n) and a_bwd.dtype == fp8
        grad = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        da, db = torch.ops.primus_turbo.gemm_fp8_bwd(
            grad, a_bwd, sa, b_bwd, sb, trans_a, trans_b, torch.float8_e5m2, code, torch.bfloat16, torch.bfloat16,
            True, True, None,
        )
        assert da.shape == a.shape and db.shape == b.shape
        # Inference: the product alone.
        with torch.no_grad():
            out = turbo.ops.gemm_fp8(a, b, trans_a, trans_b, config=config)
        assert out.shape == (m, n) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("granularity", [ScalingGranularity.TENSORWISE, ScalingGranularity.ROWWISE, ScalingGranularity.BLOCKWISE])
@pytest.mark.parametrize("trans_b", [True, False])
def test_grouped_gemm_fp8_native_path_shapes_under_fake_cuda_tensors(granularity, trans_b):
    block = 128 if granularity == ScalingGranularity.BLOCKWISE else None
    config = Float8QuantConfig(format=Format.HYBRID, granularity=granularity, block_size=block)
    m, k, n, g = 48, 256, 128, 3
    code = {ScalingGranularity.TENSORWISE: 0, ScalingGranularity.ROWWISE: 1, ScalingGranularity.BLOCKWISE: 2}[granularity]
    with FakeTensorMode():
        a = torch.empty((m, k), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.empty((g, n, k) if trans_b else (g, k, n), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        lens = torch.empty((g,), device="cuda", dtype=torch.int64)
        out = turbo.ops.grouped_gemm_fp8(a, b, lens, trans_b=trans_b, config=config)  # the native autograd path
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        fp8 = torch.float8_e4m3fn
        _, wq, ws = torch.ops.primus_turbo.grouped_gemm_fp8_fwd(
            a, b, lens, None, trans_b, torch.bfloat16, fp8, code, 0, True
        )
        assert wq.shape == (g, k, n) and wq.dtype == fp8  # the dgrad's B, op(b) [G, K, N]
        assert ws.shape == ((), (g, k, 1), (g, -(-k // 128), -(-n // 128)))[code]  # per tensor, row, block
        if granularity == ScalingGranularity.ROWWISE:  # experts' rows not whole 128-row tiles: b again
            odd = torch.empty((g, 144, k) if trans_b else (g, k, 144), device="cuda", dtype=torch.bfloat16)
            _, oq, os_ = torch.ops.primus_turbo.grouped_gemm_fp8_fwd(
                a, odd, lens, None, trans_b, torch.bfloat16, fp8, code, 0, True
            )
            assert (oq.numel() == 0) == trans_b and (os_.numel() == 0) == trans_b
        grad = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        da, db = torch.ops.primus_turbo.grouped_gemm_fp8_bwd(
            grad, a, b, wq, ws, lens, None, trans_b, torch.float8_e5m2, fp8, code, 0, True, True
        )
        assert da.shape == a.shape and db.shape == b.shape


def test_grouped_gemm_fp8_fake_blockwise_dgrad_scales_round_k_up():
    """BLOCKWISE with trans_b and K not a multiple of 128: the dgrad copy's block scales are
    [G, ceil(K/128), N/128], as the op writes them (the fake once rounded K down)."""
    with FakeTensorMode():
        a = torch.empty((48, 208), device="cuda", dtype=torch.bfloat16)
        b = torch.empty((3, 128, 208), device="cuda", dtype=torch.bfloat16)
        lens = torch.empty((3,), device="cuda", dtype=torch.int64)
        _, wq, ws = torch.ops.primus_turbo.grouped_gemm_fp8_fwd(
            a, b, lens, None, True, torch.bfloat16, torch.float8_e4m3fn, 2, 0, True
        )
    assert wq.shape == (3, 208, 128) and ws.shape == (3, 2, 1)


@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False), (False, False)])
def test_gemm_fp4_native_path_shapes_under_fake_cuda_tensors(trans_a, trans_b):
    m, k, n = 64, 96, 32
    with FakeTensorMode():
        a = torch.empty((k, m) if trans_a else (m, k), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.empty((n, k) if trans_b else (k, n), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out = turbo.ops.gemm_fp4(a, b, trans_a, trans_b)  # the native autograd path
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        _, qbn, sbn, qam, sam = torch.ops.primus_turbo.gemm_fp4_fwd(
            a, b, trans_a, trans_b, torch.bfloat16, True, True, True, True
        )
        assert qbn.shape == (k, n // 2) and sbn.shape == (k // 32, n // 32) and qam.shape == (k, m // 2)
        grad = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        da, db = torch.ops.primus_turbo.gemm_fp4_bwd(
            grad, qbn, sbn, qam, sam, trans_a, trans_b, True, True, 1, 2, torch.bfloat16, torch.bfloat16, True, True
        )
        assert da.shape == a.shape and db.shape == b.shape


@pytest.mark.parametrize("trans_b", [True, False])
def test_grouped_gemm_fp4_native_path_shapes_under_fake_cuda_tensors(trans_b):
    m, k, n, g = 48, 256, 96, 3
    with FakeTensorMode():
        a = torch.empty((m, k), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.empty((g, n, k) if trans_b else (g, k, n), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        lens = torch.empty((g,), device="cuda", dtype=torch.int64)
        out = turbo.ops.grouped_gemm_fp4(a, b, lens, trans_b=trans_b)  # the native autograd path
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        grad = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        da, db = torch.ops.primus_turbo.grouped_gemm_fp4_bwd(grad, a, b, lens, None, trans_b, True, True, 7, 0, True,
                                                             True)
        assert da.shape == a.shape and db.shape == b.shape


def test_gemm_fp4_inference_takes_any_m_and_n():
    # No backward follows (no_grad): no backward copies, so M and N need no alignment.
    with FakeTensorMode(), torch.no_grad():
        a = torch.empty((5, 96), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.nn.Parameter(torch.empty((7, 96), device="cuda", dtype=torch.bfloat16))
        assert turbo.ops.gemm_fp4(a, b, trans_b=True).shape == (5, 7)


def test_native_ops_trace_under_compile_without_graph_breaks():
    def fn(x, w, g, q, k):
        y = turbo.ops.rmsnorm(turbo.ops.gemm(x, w, trans_b=True), g)
        qr, kr = turbo.ops.rope(q, k)
        return y.sum() + qr.float().sum() + kr.float().sum()

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    meta = dict(device="meta", dtype=torch.bfloat16)
    out = compiled(
        torch.empty(8, 16, **meta), torch.empty(32, 16, **meta), torch.empty(32, **meta),
        torch.empty(1, 4, 2, 8, **meta), torch.empty(1, 4, 2, 8, **meta),
    )
    assert out.shape == ()


def _descriptor(shape, dtype_code):
    from primus_turbo._core import PtTensor

    t = PtTensor()
    t.data, t.dtype, t.ndim = 1 << 20, dtype_code, len(shape)
    stride = 1
    for i in reversed(range(len(shape))):
        t.shape[i], t.strides[i] = shape[i], stride
        stride *= shape[i]
    return t


def test_planner_builds_each_ops_problem_and_reports_its_choice_or_error(monkeypatch):
    """The ctypes planner the native ops call on a plan miss: each op's request becomes its
    problem, autotune.select picks, and a failure comes back as a status with the message."""
    import contextlib
    import ctypes

    from primus_turbo._core.lib import PtGroupedGemmArgs, PtGroupedGemmFp8Args
    from primus_turbo.pytorch.core import autotune, tensor_bridge
    from primus_turbo.pytorch.core.backend import BackendType
    import sys

    # (the ops package exports functions named like these modules)
    gemm_mod = sys.modules["primus_turbo.pytorch.ops.gemm"]
    fp8_mod = sys.modules["primus_turbo.pytorch.ops.gemm_fp8"]
    grouped_mod = sys.modules["primus_turbo.pytorch.ops.grouped_gemm"]
    grouped_fp8_mod = sys.modules["primus_turbo.pytorch.ops.grouped_gemm_fp8"]

    seen = []

    def fake_select(problem, device):
        seen.append((type(problem).__name__, device))
        return BackendType.CUTLASS, 3

    monkeypatch.setattr(autotune, "select", fake_select)
    monkeypatch.setattr(tensor_bridge, "device_guard", lambda device: contextlib.nullcontext())
    for mod in (gemm_mod, fp8_mod, grouped_mod, grouped_fp8_mod):
        monkeypatch.setattr(mod, "current_stream_handle", lambda device: 0)

    bf16, f32, e4m3, i64 = 2, 0, 3, 8
    a, b, d = _descriptor((64, 32), bf16), _descriptor((48, 32), bf16), _descriptor((64, 48), bf16)
    gemm_req = gemm_mod._GemmPlanRequest(ctypes.pointer(a), ctypes.pointer(b), ctypes.pointer(d), 0, 1, 0.0)
    qa, qb, s = _descriptor((64, 32), e4m3), _descriptor((48, 32), e4m3), _descriptor((), f32)
    fp8_req = fp8_mod._GemmFp8PlanRequest(
        ctypes.pointer(qa), ctypes.pointer(s), 0, ctypes.pointer(qb), ctypes.pointer(s), 0, ctypes.pointer(d), 0.0
    )
    ga, gb, lens, gd = (_descriptor((64, 32), bf16), _descriptor((2, 48, 32), bf16), _descriptor((2,), i64),
                        _descriptor((64, 48), bf16))
    grouped_req = PtGroupedGemmArgs(
        ctypes.pointer(ga), ctypes.pointer(gb), ctypes.pointer(lens), None, ctypes.pointer(gd), 0, 1
    )
    backend, config = ctypes.c_int32(), ctypes.c_int32()
    message = ctypes.create_string_buffer(256)
    fa, fsa, fb, fsb, fd = (_descriptor((64, 32), e4m3), _descriptor((64, 1), f32), _descriptor((2, 48, 32), e4m3),
                            _descriptor((2, 1, 1), f32), _descriptor((64, 48), bf16))
    grouped_fp8_req = PtGroupedGemmFp8Args(
        ctypes.pointer(fa), ctypes.pointer(fsa), ctypes.pointer(fb), ctypes.pointer(fsb), ctypes.pointer(lens), None,
        ctypes.pointer(fd), 128, 0, 0, 0,
    )
    for op, req, name in (
        (native.PLAN_GROUPED_GEMM_FP8, grouped_fp8_req, "GroupedGemmFp8Problem"),
        (native.PLAN_GEMM, gemm_req, "GemmProblem"),
        (native.PLAN_GEMM_FP8, fp8_req, "Fp8GemmProblem"),
        (native.PLAN_GROUPED_GEMM, grouped_req, "GroupedGemmProblem"),
    ):
        rc = native._plan(op, ctypes.addressof(req), 0, ctypes.byref(backend), ctypes.byref(config), message, 256)
        assert rc == 0, message.value
        assert (backend.value, config.value) == (BackendType.CUTLASS.value, 3)
        assert seen[-1] == (name, torch.device("cuda", 0))

    def refuse(problem, device):
        raise TurboNotSupportedError("no backend accepts this problem")

    monkeypatch.setattr(autotune, "select", refuse)
    rc = native._plan(native.PLAN_GEMM, ctypes.addressof(gemm_req), 0, ctypes.byref(backend), ctypes.byref(config),
                      message, 256)
    assert rc == 2 and message.value == b"no backend accepts this problem"


@pytest.mark.gpu
def test_norms_take_any_rank_and_strided_weights_forward_and_backward():
    """Inputs of more than PT_MAX_DIMS dimensions, and a gamma that is a strided view (saved as is
    by the autograd function, so the backward gets it too)."""
    x = torch.randn((1,) * 10 + (3, 64), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w2 = torch.randn(64, 2, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gamma = w2[:, 0]  # stride 2
    y = turbo.ops.rmsnorm(x, gamma)
    y.float().sum().backward()
    ref = x.detach().float() * torch.rsqrt(x.detach().float().pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(y.float(), (ref * gamma.detach().float()).to(torch.bfloat16).float(), atol=2e-2, rtol=2e-2)
    assert x.grad.shape == x.shape and w2.grad[:, 1].eq(0).all() and w2.grad[:, 0].abs().sum() > 0
    beta = torch.zeros(64, 2, device="cuda", dtype=torch.bfloat16, requires_grad=True)[:, 1]
    turbo.ops.layernorm(x, gamma, beta).float().sum().backward()


@pytest.mark.gpu
def test_grouped_lengths_that_overflow_when_summed_write_nothing_outside():
    """Lengths whose sum overflows int64: group 0 is clamped to every row, group 1 to none, and the
    uncovered-row zeroing writes nothing (run under compute-sanitizer to see no stray write)."""
    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, 32, 16, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([2**63 - 1, 2**63 - 1], device="cuda", dtype=torch.int64)
    out = turbo.ops.grouped_gemm(a, b, lens)
    ref = (a.double() @ b[0].double()).to(torch.bfloat16)
    torch.testing.assert_close(out, ref, atol=5e-2, rtol=2e-2)


# ---- the C++ autograd (bindings/torch_autograd), on meta tensors: the graph and the shapes ----------


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_gemm_cpp_autograd_on_meta(trans_a, trans_b):
    m, k, n = 64, 32, 48
    a = torch.empty((k, m) if trans_a else (m, k), device="meta", dtype=torch.bfloat16, requires_grad=True)
    b = torch.empty((n, k) if trans_b else (k, n), device="meta", dtype=torch.bfloat16, requires_grad=True)
    y = turbo.ops.gemm(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=torch.float32)
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert type(y.grad_fn).__name__ == "CppFunction"  # not the Python GemmFunction
    ga, gb = torch.autograd.grad(y, (a, b), torch.empty_like(y))
    assert ga.shape == a.shape and gb.shape == b.shape and ga.dtype == gb.dtype == torch.bfloat16
    # Only the gradients asked for.
    b.requires_grad_(False)
    y = turbo.ops.gemm(a, b, trans_a=trans_a, trans_b=trans_b)
    (ga,) = torch.autograd.grad(y, (a,), torch.empty_like(y))
    assert ga.shape == a.shape


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
@pytest.mark.parametrize("code", [0, 1, 2])
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False), (False, False)])
@pytest.mark.parametrize("fast_accum", [False, True])
def test_gemm_fp8_train_cpp_autograd_on_meta(code, trans_a, trans_b, fast_accum):
    m, k, n = 64, 256, 48
    a = torch.empty((k, m) if trans_a else (m, k), device="meta", dtype=torch.bfloat16, requires_grad=True)
    b = torch.empty((n, k) if trans_b else (k, n), device="meta", dtype=torch.bfloat16, requires_grad=True)
    y = native.ops.gemm_fp8_train.default(a, b, trans_a, trans_b, torch.bfloat16, torch.float8_e4m3fn,
                                          torch.float8_e5m2, code, fast_accum=fast_accum)
    assert y.shape == (m, n) and type(y.grad_fn).__name__ == "CppFunction"
    ga, gb = torch.autograd.grad(y, (a, b), torch.empty_like(y))
    assert ga.shape == a.shape and gb.shape == b.shape


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
@pytest.mark.parametrize("code,scaling", [(0, 0), (1, 1), (2, 3)])
@pytest.mark.parametrize("need_a", [True, False])
def test_gemm_fp8_train_with_given_weight_copies_on_meta(code, scaling, need_a):
    # A layer's per-step cache passes the weight's copies along K and N; the weight itself still
    # gets the gradient, and without a dgrad (frozen input) no copy along N is needed.
    m, k, n = 64, 256, 384
    a = torch.empty(m, k, device="meta", dtype=torch.bfloat16, requires_grad=need_a)
    b = torch.empty(n, k, device="meta", dtype=torch.bfloat16, requires_grad=True)
    s_fwd = {0: (), 1: (n, 1), 2: (n // 128, k // 128)}[code]
    s_bwd = {0: (), 1: (k, 1), 2: (k // 128, n // 128)}[code]
    b_q, b_s = torch.empty(n, k, device="meta", dtype=E4M3), torch.empty(s_fwd, device="meta")
    d_q, d_s = (torch.empty(k, n, device="meta", dtype=E4M3), torch.empty(s_bwd, device="meta")) if need_a else (None,
                                                                                                               None)
    y = native.ops.gemm_fp8_train.default(a, b, False, True, torch.bfloat16, E4M3, torch.float8_e5m2, code, b_q, b_s,
                                          scaling, d_q, d_s)
    assert y.shape == (m, n) and type(y.grad_fn).__name__ == "CppFunction"
    inputs = (a, b) if need_a else (b,)
    grads = torch.autograd.grad(y, inputs, torch.empty_like(y))
    assert all(g.shape == t.shape for g, t in zip(grads, inputs))
    with pytest.raises(ValueError, match="b_q with b_s"):
        native.ops.gemm_fp8_train.default(a, b, False, True, torch.bfloat16, E4M3, torch.float8_e5m2, code, b_q, None,
                                          scaling, None, None)
    if not need_a:
        return
    train = native.ops.gemm_fp8_train.default
    with pytest.raises(ValueError, match="the dgrad's weight copy d_q"):  # a dgrad would have nothing to read
        train(a, b, False, True, torch.bfloat16, E4M3, torch.float8_e5m2, code, b_q, b_s, scaling, None, None)
    with torch.no_grad():  # no gradient will be asked for: no dgrad copy needed
        train(a, b, False, True, torch.bfloat16, E4M3, torch.float8_e5m2, code, b_q, b_s, scaling, None, None)
    with pytest.raises(ValueError, match="argument 'd_q' must be b_q's copy along N"):  # the layout, not the values
        train(a, b, False, True, torch.bfloat16, E4M3, torch.float8_e5m2, code, b_q, b_s, scaling, b_q.t(), d_s)
    wrong_s = torch.empty(n if code == 1 else 3, device="meta")
    with pytest.raises(ValueError, match="argument 'd_s'"):
        train(a, b, False, True, torch.bfloat16, E4M3, torch.float8_e5m2, code, b_q, b_s, scaling, d_q, wrong_s)


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
@pytest.mark.parametrize("use_sum", [True, False])
def test_rmsnorm_residual_cpp_autograd_on_meta(use_sum):
    # Both outputs differentiable; an unused sum takes no gradient (none materialized).
    x, r = (torch.empty(4, 16, 256, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    g = torch.empty(256, device="meta", dtype=torch.float32, requires_grad=True)
    y, s = turbo.ops.rmsnorm_residual(x, r, g)
    assert y.shape == s.shape == x.shape and type(y.grad_fn).__name__ == "CppFunction" and s.grad_fn is y.grad_fn
    outputs = (y, s) if use_sum else (y,)
    dx, dr, dg = torch.autograd.grad(outputs, (x, r, g), [torch.empty_like(o) for o in outputs])
    assert dx.shape == dr.shape == x.shape and dg.shape == g.shape


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
@pytest.mark.parametrize("tables", [True, False])
def test_rope_cpp_autograd_on_meta(tables):
    q = torch.empty(2, 16, 4, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    k = torch.empty(2, 16, 2, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    cos, sin = ((torch.empty(32, 32, device="meta"), torch.empty(32, 32, device="meta")) if tables else (None, None))
    q_out, k_out = turbo.ops.rope(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape and type(q_out.grad_fn).__name__ == "CppFunction"
    dq, dk = torch.autograd.grad((q_out,), (q, k), (torch.empty_like(q_out),))  # k_out unused: zeros
    assert dq.shape == q.shape and dk.shape == k.shape


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
def test_norm_cpp_autograd_on_meta():
    x = torch.empty(4, 16, 256, device="meta", dtype=torch.bfloat16, requires_grad=True)
    g = torch.empty(256, device="meta", dtype=torch.float32, requires_grad=True)
    beta = torch.empty(256, device="meta", dtype=torch.float32, requires_grad=True)
    y = turbo.ops.rmsnorm(x, g)
    assert y.shape == x.shape and type(y.grad_fn).__name__ == "CppFunction"
    dx, dg = torch.autograd.grad(y, (x, g), torch.empty_like(y))
    assert dx.shape == x.shape and dg.shape == g.shape and dg.dtype == torch.float32
    y = turbo.ops.layernorm(x, g, beta)
    assert type(y.grad_fn).__name__ == "CppFunction"
    dx, dg, db = torch.autograd.grad(y, (x, g, beta), torch.empty_like(y))
    assert dx.shape == x.shape and dg.shape == db.shape == g.shape


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
@pytest.mark.parametrize("with_sink", [False, True])
def test_attention_cpp_autograd_on_meta(with_sink):
    def t(*shape, grad=True):
        return torch.empty(*shape, device="meta", dtype=torch.bfloat16, requires_grad=grad)

    q, k, v = t(2, 128, 8, 64), t(2, 256, 2, 64), t(2, 256, 2, 64)
    sink = torch.empty(8, device="meta", dtype=torch.float32, requires_grad=True) if with_sink else None
    out, lse = turbo.ops.flash_attn_func(q, k, v, causal=True, sink=sink, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 8, 128) and not lse.requires_grad
    assert type(out.grad_fn).__name__ == "CppFunction"
    inputs = (q, k, v, sink) if with_sink else (q, k, v)
    grads = torch.autograd.grad(out, inputs, torch.empty_like(out))
    assert all(g.shape == x.shape for g, x in zip(grads, inputs))


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
@pytest.mark.parametrize("trans_b", [False, True])
def test_grouped_gemm_cpp_autograd_on_meta(trans_b):
    g, m, k, n = 4, 256, 128, 64
    a = torch.empty(m, k, device="meta", dtype=torch.bfloat16, requires_grad=True)
    b = torch.empty((g, n, k) if trans_b else (g, k, n), device="meta", dtype=torch.bfloat16, requires_grad=True)
    lens = torch.empty(g, device="meta", dtype=torch.int64)
    y = turbo.ops.grouped_gemm(a, b, lens, trans_b=trans_b)
    assert y.shape == (m, n) and type(y.grad_fn).__name__ == "CppFunction"
    ga, gb = torch.autograd.grad(y, (a, b), torch.empty_like(y))
    assert ga.shape == a.shape and gb.shape == b.shape


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
@pytest.mark.parametrize("code", [0, 1, 2])
@pytest.mark.parametrize("trans_b", [False, True])
def test_grouped_gemm_fp8_train_cpp_autograd_on_meta(code, trans_b):
    g, m, k, n = 4, 256, 128, 256
    a = torch.empty(m, k, device="meta", dtype=torch.bfloat16, requires_grad=True)
    b = torch.empty((g, n, k) if trans_b else (g, k, n), device="meta", dtype=torch.bfloat16, requires_grad=True)
    lens = torch.empty(g, device="meta", dtype=torch.int64)
    y = native.ops.grouped_gemm_fp8_train.default(a, b, lens, None, trans_b, torch.bfloat16, torch.float8_e4m3fn,
                                                  torch.float8_e5m2, code, 0)
    assert y.shape == (m, n) and type(y.grad_fn).__name__ == "CppFunction"
    ga, gb = torch.autograd.grad(y, (a, b), torch.empty_like(y))
    assert ga.shape == a.shape and gb.shape == b.shape and gb.dtype == torch.bfloat16
    # Only the weight's gradient (frozen tokens): no quantized weight is kept for a dgrad.
    a.requires_grad_(False)
    y = native.ops.grouped_gemm_fp8_train.default(a, b, lens, None, trans_b, torch.bfloat16, torch.float8_e4m3fn,
                                                  torch.float8_e5m2, code, 0)
    (gb,) = torch.autograd.grad(y, (b,), torch.empty_like(y))
    assert gb.shape == b.shape


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
def test_grouped_gemm_fp8_train_with_given_weight_operands_on_meta():
    # A per-step weight cache passes the forward's and the dgrad's B in the kernel's layout; the
    # weight itself still gets the gradient.
    g, m, k, n = 4, 256, 128, 256
    a = torch.empty(m, k, device="meta", dtype=torch.bfloat16, requires_grad=True)
    b = torch.empty(g, n, k, device="meta", dtype=torch.bfloat16, requires_grad=True)
    lens = torch.empty(g, device="meta", dtype=torch.int64)
    fp8 = torch.float8_e4m3fn
    b_q, b_s = torch.empty(g, n, k, device="meta", dtype=fp8), torch.empty(g, n // 128, k // 128, device="meta")
    d_q, d_s = torch.empty(g, k, n, device="meta", dtype=fp8), torch.empty(g, k // 128, n // 128, device="meta")
    y = native.ops.grouped_gemm_fp8_train.default(a, b, lens, None, True, torch.bfloat16, fp8, torch.float8_e5m2, 2,
                                                  0, b_q, b_s, 128, d_q, d_s, 128)
    assert y.shape == (m, n) and type(y.grad_fn).__name__ == "CppFunction"
    ga, gb = torch.autograd.grad(y, (a, b), torch.empty_like(y))
    assert ga.shape == a.shape and gb.shape == b.shape


@pytest.mark.skipif(not native.CPP_AUTOGRAD, reason="the C++ autograd library is not built")
@pytest.mark.parametrize("with_probs", [False, True])
def test_token_permute_cpp_autograd_on_meta(with_probs):
    t, e, h, n = 64, 8, 128, 128
    tokens = torch.empty(t, h, device="meta", dtype=torch.bfloat16, requires_grad=True)
    routing_map = torch.empty(t, e, device="meta", dtype=torch.bool)
    probs = torch.empty(t, e, device="meta", dtype=torch.float32, requires_grad=True) if with_probs else None
    out, pprobs, row_id_map = native.ops.token_permute_train.default(tokens, routing_map, probs, n)
    assert out.shape == (n, h) and row_id_map.shape == (t, e) and not row_id_map.requires_grad
    assert type(out.grad_fn).__name__ == "CppFunction"
    inputs = (tokens, probs) if with_probs else (tokens,)
    outputs = (out, pprobs) if with_probs else (out,)
    result = torch.autograd.grad(outputs, inputs, [torch.empty_like(o) for o in outputs])
    assert all(g.shape == x.shape for g, x in zip(result, inputs))
    # The unpermute of those rows, with and without merging probabilities.
    merging = torch.empty(t, e, device="meta", dtype=torch.float32, requires_grad=True)
    for mp in (None, merging):
        rows = out.detach().requires_grad_()
        y = native.ops.token_unpermute_train.default(rows, row_id_map, mp)
        assert y.shape == (t, h) and type(y.grad_fn).__name__ == "CppFunction"
        inputs = (rows, mp) if mp is not None else (rows,)
        result = torch.autograd.grad(y, inputs, torch.empty_like(y))
        assert all(g.shape == x.shape for g, x in zip(result, inputs))
