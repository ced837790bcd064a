"""Host-side behaviour of the gated activations that needs no GPU: argument errors raised before
any launch (in Python and in the core), and shapes through meta tensors and torch.compile."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo._core import check, lib

from host_check_utils import desc, meta


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 16), (16,), (0, 16), (4, 2)])
def test_shapes_on_meta(name, shape):
    x = meta(*shape, grad=True)
    out = getattr(turbo.ops, name)(x)
    assert out.shape == shape[:-1] + (shape[-1] // 2,) and out.dtype == x.dtype
    out.sum().backward()
    assert x.grad.shape == x.shape
    rows = x.numel() // shape[-1]
    probs = meta(*shape[:-1], dtype=torch.float32, grad=True)
    mask = torch.empty(rows, dtype=torch.int64, device="meta")
    out = getattr(turbo.ops, name + "_with_probs")(x, probs, mask)
    assert out.shape == (rows, shape[-1] // 2)  # rows of tokens, as the original library
    out.sum().backward()
    assert probs.grad.shape == probs.shape and probs.grad.dtype == torch.float32


def test_compile_traces_without_graph_break():
    def fn(x, p):
        return turbo.ops.swiglu_with_probs(x, p, None) + turbo.ops.geglu(x).flatten(0, 1)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    x, p = meta(8, 4, 64, grad=True), meta(8, 4, dtype=torch.float32, grad=True)
    out = compiled(x, p)
    assert out.shape == (32, 32)
    out.sum().backward()
    assert x.grad.shape == x.shape and p.grad.shape == p.shape


@pytest.mark.parametrize(
    "fn,args,exc,match",
    [
        ("swiglu", (torch.randn(4, 8),), ValueError, "argument 'x' is on cpu"),
        ("swiglu", ([1.0],), TypeError, "argument 'x' must be a torch.Tensor"),
        ("geglu", (meta(4, 7),), ValueError, r"expected \[..., 2H\]"),
        ("geglu", (meta(4, 8, dtype=torch.int32),), TypeError, "argument 'x' has dtype"),
        ("swiglu_with_probs", (meta(4, 8), meta(4), None), TypeError, "argument 'probs' has dtype torch.bfloat16"),
        ("swiglu_with_probs", (meta(4, 8), meta(5, dtype=torch.float32), None), ValueError, "argument 'probs' has shape"),
        ("geglu_with_probs", (meta(4, 8), None, None), TypeError, "argument 'probs' must be a torch.Tensor"),
        (
            "geglu_with_probs",
            (meta(4, 8), meta(4, dtype=torch.float32), meta(4, dtype=torch.float32)),
            TypeError,
            "argument 'row_mask' has dtype",
        ),
        (
            "geglu_with_probs",
            (meta(4, 8), meta(4, dtype=torch.float32), torch.empty(3, dtype=torch.int64, device="meta")),
            ValueError,
            "argument 'row_mask' has shape",
        ),
    ],
)
def test_bad_arguments(fn, args, exc, match):
    with pytest.raises(exc, match=match):
        getattr(turbo.ops, fn)(*args)


def test_core_checks():
    x, out = desc([4, 16]), desc([4, 8])
    with pytest.raises(ValueError, match="argument 'out' has shape"):
        check(lib.pt_gated_act_fwd(0, x, None, None, desc([4, 16]), None, None))
    with pytest.raises(ValueError, match="last dimension must be even"):
        check(lib.pt_gated_act_fwd(0, desc([4, 7]), None, None, out, None, None))
    with pytest.raises(ValueError, match="argument 'probs' has dtype"):
        check(lib.pt_gated_act_fwd(1, x, desc([4]), None, out, None, None))
    with pytest.raises(ValueError, match="argument 'row_mask' has dtype"):
        check(lib.pt_gated_act_fwd(1, x, desc([4], 0), desc([4], 0), out, None, None))
    with pytest.raises(ValueError, match="argument 'act'"):
        check(lib.pt_gated_act_fwd(2, x, None, None, out, None, None))
    with pytest.raises(ValueError, match="argument 'dx' has shape"):
        check(lib.pt_gated_act_bwd(0, out, x, None, None, out, None, None, None))
    with pytest.raises(ValueError, match="argument 'x' .* must be contiguous"):
        check(lib.pt_gated_act_fwd(0, desc([4, 16], strides=[32, 1]), None, None, out, None, None))
    check(lib.pt_gated_act_fwd(0, desc([0, 16], ptr=None), None, None, desc([0, 8], ptr=None), None, None))
    with pytest.raises(ValueError, match="argument 'amax'"):
        check(lib.pt_gated_act_fwd(0, x, None, None, out, desc([2], 0), None))
    with pytest.raises(ValueError, match="argument 'amax'"):
        check(lib.pt_gated_act_bwd(0, out, x, None, None, desc([4, 16]), None, desc([1], 2), None))
