"""Host-side behaviour of turbo.ops.gemm that needs no GPU: argument errors raised before any
launch, and shape propagation through fake/meta tensors and torch.compile tracing."""

import pytest
import torch

import primus_turbo.pytorch as turbo


def meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(shape, device="meta", dtype=dtype, requires_grad=grad)


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_shapes_forward_and_backward_on_meta(trans_a, trans_b):
    m, n, k = 7, 5, 3
    a = meta(*((k, m) if trans_a else (m, k)), grad=True)
    b = meta(*((n, k) if trans_b else (k, n)), grad=True)
    out = turbo.ops.gemm(a, b, trans_a, trans_b)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


def test_out_dtype_propagates():
    out = turbo.ops.gemm(meta(4, 8), meta(8, 2), out_dtype=torch.float32)
    assert out.dtype == torch.float32


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(16, 32, device="cuda", dtype=torch.float16)
        b = torch.empty(24, 32, device="cuda", dtype=torch.float16)
        out = turbo.ops.gemm(a, b, trans_b=True)
    assert out.shape == (16, 24) and out.device.type == "cuda"


def test_torch_compile_traces_without_graph_break():
    def fn(x, w):
        return torch.relu(turbo.ops.gemm(x, w, trans_b=True)) + 1

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = compiled(meta(8, 16), meta(4, 16))
    assert out.shape == (8, 4)


def test_registered_as_custom_op():
    schema = str(torch.ops.primus_turbo.gemm.default._schema)
    assert "primus_turbo::gemm(Tensor a, Tensor b, bool trans_a, bool trans_b, ScalarType out_dtype)" in schema


@pytest.mark.parametrize(
    "a,b,kwargs,exc,match",
    [
        (torch.randn(4, 8), torch.randn(8, 3), {}, ValueError, "argument 'a' is on cpu; expected a CUDA device"),
        (meta(4, 8), meta(7, 3), {}, ValueError, r"inner dimensions do not match: op\(a\) is \[4, 8\]"),
        (meta(4, 8), meta(3, 7), {"trans_b": True}, ValueError, r"op\(b\) is \[7, 3\]"),
        (meta(4, 8), meta(8, 3, dtype=torch.float32), {}, TypeError, "argument 'b' has dtype torch.float32"),
        (meta(4, 8, dtype=torch.int32), meta(8, 3, dtype=torch.int32), {}, TypeError, "argument 'a' has dtype"),
        (meta(4, 8, 2), meta(8, 3), {}, ValueError, "argument 'a' must be 2-D"),
        (meta(4, 8, dtype=torch.float32), meta(8, 3, dtype=torch.float32), {"out_dtype": torch.bfloat16},
         TypeError, "not supported for float32 inputs"),
        (meta(4, 8), meta(8, 3), {"out_dtype": torch.int8}, TypeError, "out_dtype"),
        ("not a tensor", meta(8, 3), {}, TypeError, "must be a torch.Tensor"),
    ],
)
def test_bad_arguments_raise_clear_errors(a, b, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.gemm(a, b, **kwargs)


def test_megatron_pattern_validates_main_grad():
    w = meta(4, 8, grad=True)
    with pytest.raises(ValueError, match="main_grad"):
        turbo.ops.gemm(meta(2, 8), w, trans_b=True, fuse_bgrad_accum_pattern="megatron")
    w.main_grad = meta(8, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match="main_grad has shape"):
        turbo.ops.gemm(meta(2, 8), w, trans_b=True, fuse_bgrad_accum_pattern="megatron")
    with pytest.raises(ValueError, match="'megatron'"):
        turbo.ops.gemm(meta(2, 8), w, trans_b=True, fuse_bgrad_accum_pattern="deepspeed")
    w.main_grad = meta(4, 8, dtype=torch.float32)
    turbo.ops.gemm(meta(2, 8), w, trans_b=True, fuse_bgrad_accum_pattern="megatron")
    assert w.grad_added_to_main_grad is True


def test_linear_module_shapes_and_errors():
    layer = turbo.modules.Linear(16, 8, device="meta", dtype=torch.bfloat16)
    assert layer(meta(2, 3, 16)).shape == (2, 3, 8)
    with pytest.raises(ValueError, match="in_features=16"):
        layer(meta(2, 15))
