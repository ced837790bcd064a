"""Host-side behaviour of turbo.ops.layernorm, turbo.modules.LayerNorm and turbo.ops.rmsnorm_residual
that needs no GPU: argument errors raised before any launch (in Python and in the core), and shapes
through fake/meta tensors and torch.compile."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo._core import check, lib

from host_check_utils import FAKE_PTR, desc, meta


@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 16), (16,), (0, 16)])
def test_layernorm_shapes_on_meta(shape):
    x, g, b = meta(*shape, grad=True), meta(shape[-1], grad=True), meta(shape[-1], grad=True)
    y = turbo.ops.layernorm(x, g, b)
    assert y.shape == x.shape and y.dtype == x.dtype
    y.sum().backward()
    assert x.grad.shape == x.shape and g.grad.shape == g.shape and b.grad.shape == b.shape
    assert turbo.ops.layernorm(meta(*shape), None, None).shape == x.shape


@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 16), (0, 16)])
def test_rmsnorm_residual_shapes_on_meta(shape):
    x, r, g = meta(*shape, grad=True), meta(*shape, grad=True), meta(shape[-1], dtype=torch.float32, grad=True)
    y, s = turbo.ops.rmsnorm_residual(x, r, g)
    assert y.shape == x.shape and s.shape == x.shape and s.dtype == x.dtype
    (y + s).sum().backward()
    assert x.grad.shape == x.shape and r.grad.shape == r.shape and g.grad.dtype == torch.float32


def test_compile_traces_without_graph_break():
    def fn(x, r, g, b):
        y, s = turbo.ops.rmsnorm_residual(x, r, g)
        return turbo.ops.layernorm(y, g, b) + s

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    x, r = meta(8, 4, 32, grad=True), meta(8, 4, 32, grad=True)
    g, b = meta(32, grad=True), meta(32, grad=True)
    out = compiled(x, r, g, b)
    assert out.shape == (8, 4, 32)
    out.sum().backward()
    assert x.grad.shape == x.shape and b.grad.shape == b.shape


def test_module_on_meta():
    m = turbo.modules.LayerNorm((4, 8), device="meta", dtype=torch.bfloat16)
    assert m.weight.shape == (4, 8) and m.bias.shape == (4, 8)
    assert m(meta(2, 4, 8)).shape == (2, 4, 8)
    assert turbo.modules.LayerNorm(8, bias=False).bias is None
    assert turbo.modules.LayerNorm(8, elementwise_affine=False).weight is None
    with pytest.raises(ValueError, match="does not end with normalized_shape"):
        m(meta(2, 8, 4))


@pytest.mark.parametrize(
    "args,exc,match",
    [
        ((torch.randn(4, 8), None, None), ValueError, "argument 'x' is on cpu"),
        ((meta(4, 8, dtype=torch.int32), None, None), TypeError, "argument 'x' has dtype torch.int32"),
        ((meta(4, 8), meta(7), meta(8)), ValueError, "argument 'gamma' has shape"),
        ((meta(4, 8), meta(8), meta(8, dtype=torch.float16)), TypeError, "argument 'beta' has dtype"),
        ((meta(4, 8), meta(8, dtype=torch.float32), meta(8)), TypeError, "argument 'beta' has dtype"),
        (([1.0], None, None), TypeError, "argument 'x' must be a torch.Tensor"),
    ],
)
def test_layernorm_bad_arguments(args, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.layernorm(*args)
    with pytest.raises(ValueError, match="argument 'eps'"):
        turbo.ops.layernorm(meta(4, 8), None, None, eps=-1.0)


@pytest.mark.parametrize(
    "args,exc,match",
    [
        ((meta(4, 8), meta(4, 7), meta(8)), ValueError, "argument 'residual' has shape"),
        ((meta(4, 8), meta(4, 8, dtype=torch.float16), meta(8)), TypeError, "argument 'residual' has dtype"),
        ((meta(4, 8), None, meta(8)), TypeError, "argument 'residual' must be a torch.Tensor"),
        ((meta(4, 8), meta(4, 8), meta(9)), ValueError, "argument 'gamma' has shape"),
    ],
)
def test_rmsnorm_residual_bad_arguments(args, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.rmsnorm_residual(*args)


# ---- the core's own checks ----


def test_core_layernorm_checks():
    x, g = desc([4, 8]), desc([8])
    st = desc([4], 0)
    with pytest.raises(ValueError, match="argument 'beta' has shape"):
        check(lib.pt_layernorm_fwd(x, g, desc([7]), desc([4, 8]), st, st, 1e-5, None))
    with pytest.raises(ValueError, match="argument 'mean' .* expected 4 elements"):
        check(lib.pt_layernorm_fwd(x, g, g, desc([4, 8]), desc([3], 0), st, 1e-5, None))
    need = lib.pt_layernorm_bwd_workspace_bytes(64, 4096)
    assert need == 2 * lib.pt_rmsnorm_bwd_workspace_bytes(64, 4096)
    xb, gb = desc([64, 4096]), desc([4096])
    with pytest.raises(ValueError, match="argument 'workspace' has"):
        check(lib.pt_layernorm_bwd(xb, xb, gb, desc([64], 0), desc([64], 0), xb, gb, gb, FAKE_PTR, need - 1, None))
    with pytest.raises(ValueError, match="argument 'dbeta' has dtype"):
        check(lib.pt_layernorm_bwd(xb, xb, gb, desc([64], 0), desc([64], 0), xb, gb, desc([4096], 0), FAKE_PTR, need, None))


def test_core_rmsnorm_residual_checks():
    x, g, st = desc([4, 8]), desc([8]), desc([4], 0)
    with pytest.raises(ValueError, match="argument 'residual_out' has shape"):
        check(lib.pt_rmsnorm_residual_fwd(x, x, g, x, desc([4, 4]), st, 1e-6, 0, None))
    with pytest.raises(ValueError, match="argument 'residual' .* must be contiguous"):
        check(lib.pt_rmsnorm_residual_fwd(x, desc([4, 8], strides=[16, 1]), g, x, x, st, 1e-6, 0, None))
    need = lib.pt_rmsnorm_bwd_workspace_bytes(4, 8)
    with pytest.raises(ValueError, match="argument 'dsum' has dtype"):
        check(lib.pt_rmsnorm_residual_bwd(x, desc([4, 8], 0), x, g, st, x, g, FAKE_PTR, need, 0, None))


def test_core_empty_rows_and_prepare_errors():
    e = desc([0, 8], ptr=None)
    check(lib.pt_layernorm_fwd(e, desc([8]), desc([8]), e, desc([0], 0, ptr=None), desc([0], 0, ptr=None), 1e-5, None))
    with pytest.raises(ValueError, match="argument 'kind'"):
        check(lib.pt_norm_prepare(3, 2, 2, 128))


def test_scalar_input_and_module_arguments_are_named():
    with pytest.raises(ValueError, match="argument 'x' must have at least 1 dimension"):
        turbo.ops.layernorm(torch.tensor(1.0, device="meta"))
    for cls in (turbo.modules.LayerNorm, turbo.modules.RMSNorm):
        with pytest.raises(ValueError, match="normalized_shape must be positive"):
            cls(-1)
        with pytest.raises(TypeError, match="normalized_shape must be an int"):
            cls("ab")
        with pytest.raises(TypeError, match="argument 'dtype'"):
            cls(8, dtype=torch.int32)
        layer = cls(16, device="meta")
        with pytest.raises(TypeError, match="input has dtype torch.int32"):
            layer(torch.empty(4, 16, device="meta", dtype=torch.int32))
        with pytest.raises(TypeError, match="input must be a torch.Tensor"):
            layer([1.0] * 16)
