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
    "grouped_gemm": "grouped_gemm(Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs, bool trans_b)",
    "grouped_gemm_wgrad": "grouped_gemm_wgrad(Tensor a, Tensor grad_out, Tensor group_lens, Tensor? group_offs",
    "gemm_fp8_fwd": "gemm_fp8_fwd(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype",
    "gemm_fp8_bwd": "gemm_fp8_bwd(Tensor grad_out, Tensor a_bwd, Tensor sa_bwd, Tensor b_bwd, Tensor sb_bwd",
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
    ],
)
def test_cpu_tensors_raise_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


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
