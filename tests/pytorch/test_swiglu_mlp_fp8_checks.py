"""turbo.ops.swiglu_mlp_fp8 on the host: argument errors, shapes under fake CUDA tensors (the fused
TENSORWISE path's native ops and their fake implementations) and meta tensors (the unfused chain),
forward and backward, and a torch.compile trace without graph breaks."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.ops.swiglu_mlp_fp8 import SwigluMlpFp8Function
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format
from primus_turbo.pytorch.core.low_precision import ScalingGranularity as G

from host_check_utils import meta

HYBRID_TW = Float8QuantConfig(format=Format.HYBRID, granularity=G.TENSORWISE)


@pytest.mark.parametrize(
    "x,wgu,wd,exc,match",
    [
        ((64, 32), (96, 32), (32, 48), None, None),
        ((64, 32), (96, 16), (32, 48), ValueError, "w_gate_up"),
        ((64, 32), (95, 32), (32, 48), ValueError, "w_gate_up"),
        ((64, 32), (96, 32), (32, 47), ValueError, "w_down"),
        ((64, 32), (96,), (32, 48), ValueError, "w_gate_up"),
    ],
)
def test_shapes_are_checked(x, wgu, wd, exc, match):
    args = meta(*x), meta(*wgu), meta(*wd)
    if exc is None:
        assert turbo.ops.swiglu_mlp_fp8(*args).shape == (64, 32)
        return
    with pytest.raises(exc, match=match):
        turbo.ops.swiglu_mlp_fp8(*args)


def test_dtypes_and_types_are_checked():
    with pytest.raises(TypeError, match="share a dtype"):
        turbo.ops.swiglu_mlp_fp8(meta(64, 32), meta(96, 32, dtype=torch.float16), meta(32, 48))
    with pytest.raises(TypeError, match="'w_down' must be a torch.Tensor"):
        turbo.ops.swiglu_mlp_fp8(meta(64, 32), meta(96, 32), None)


@pytest.mark.parametrize("config", [None, HYBRID_TW, Float8QuantConfig(granularity=G.ROWWISE)],
                         ids=["e4m3-tensorwise", "hybrid-tensorwise", "rowwise"])
def test_fake_cuda_forward_shapes(config):
    with FakeTensorMode():
        x = torch.empty(2, 64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        wgu = torch.empty(2 * 96, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        wd = torch.empty(128, 96, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = turbo.ops.swiglu_mlp_fp8(x, wgu, wd, config)
        with torch.no_grad():  # the forward-only call
            y_infer = turbo.ops.swiglu_mlp_fp8(x, wgu, wd, config)
    assert y.shape == (2, 64, 128) and y.dtype == torch.bfloat16 and y.device.type == "cuda"
    assert y_infer.shape == y.shape and y_infer.dtype == y.dtype


def test_fused_backward_shapes_under_fake_cuda_tensors():
    # The fused function's backward on its own saved tensors (an autograd run on fake CUDA tensors
    # needs a GPU context): every native op of both directions through its fake implementation.
    fn = SwigluMlpFp8Function

    class Ctx:
        needs_input_grad = (True, True, True, False, False)

        def save_for_backward(self, *t):
            self.saved_tensors = t

    ctx = Ctx()
    with FakeTensorMode():
        x = torch.empty(64, 128, device="cuda", dtype=torch.bfloat16)
        wgu = torch.empty(2 * 96, 128, device="cuda", dtype=torch.bfloat16)
        wd = torch.empty(128, 96, device="cuda", dtype=torch.bfloat16)
        y = fn.forward(ctx, x, wgu, wd, Format.HYBRID, True)
        dx, dwgu, dwd, *_ = fn.backward(ctx, torch.empty_like(y))
    assert y.shape == (64, 128)
    assert dx.shape == x.shape and dwgu.shape == wgu.shape and dwd.shape == wd.shape


def test_compiles_fullgraph():
    def mlp(x, wgu, wd):
        return turbo.ops.swiglu_mlp_fp8(x, wgu, wd, HYBRID_TW)

    x, wgu, wd = meta(64, 128, grad=True), meta(192, 128, grad=True), meta(128, 96, grad=True)
    out = torch.compile(mlp, fullgraph=True, backend="aot_eager")(x, wgu, wd)
    assert out.shape == (64, 128)
    out.sum().backward()


@pytest.mark.parametrize("op", ["swiglu_mlp_fp8", "swiglu_mlp_fp8_fwd"])
def test_native_ops_name_the_mlps_arguments(op):
    # Called directly (as a traced graph would): shapes, dtypes and devices, each naming the argument.
    from primus_turbo.pytorch.core import native

    fn = native.raises_python_errors(getattr(torch.ops.primus_turbo, op))
    cpu = lambda *s, dtype=torch.bfloat16: torch.randn(*s).to(dtype)  # noqa: E731
    e4m3 = torch.float8_e4m3fn
    with pytest.raises(ValueError, match="expected w_gate_up"):
        fn(cpu(64, 32), cpu(96, 16), cpu(32, 48), e4m3)
    with pytest.raises(ValueError, match="w_down"):
        fn(cpu(64, 32), cpu(96, 32), cpu(32, 47), e4m3)
    with pytest.raises(TypeError, match="share a float16, bfloat16 or float32 dtype"):
        fn(cpu(64, 32), cpu(96, 32, dtype=torch.float16), cpu(32, 48), e4m3)
    with pytest.raises(ValueError, match="swiglu_mlp_fp8: argument 'x' is on cpu"):
        fn(cpu(64, 32), cpu(96, 32), cpu(32, 48), e4m3)
