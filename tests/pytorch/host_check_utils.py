"""Helpers shared by the host-side (no GPU) check tests, test_*_checks.py: meta tensors, core tensor
descriptors at a fake address, and the argument-error cases every 2-D GEMM (gemm_fp8, gemm_fp4) and
every grouped GEMM (grouped_gemm_fp8, grouped_gemm_fp4) with high-precision inputs rejects the same
way."""

import torch

from primus_turbo._core import PtTensor

#: A device address the core's checks accept; no kernel ever runs on it.
FAKE_PTR = 1 << 20


def meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(shape, device="meta", dtype=dtype, requires_grad=grad)


def meta_lens(groups, dtype=torch.int64):
    """A grouped GEMM's group_lens (or group_offs) as a meta tensor of ``groups`` entries."""
    return torch.empty(groups, device="meta", dtype=dtype)


def desc(shape, dtype=2, strides=None, ptr=FAKE_PTR):
    """A core tensor descriptor (PtTensor) of ``shape`` (row-major unless ``strides``) at ``ptr``."""
    t = PtTensor()
    t.data = ptr
    t.dtype = dtype
    t.ndim = len(shape)
    if strides is None:
        strides, s = [], 1
        for d in reversed(shape):
            strides.insert(0, s)
            s *= d
    for i, (d, st) in enumerate(zip(shape, strides)):
        t.shape[i], t.strides[i] = d, st
    return t


def check_gemm_step_on_meta(op, trans_a: bool, trans_b: bool, **kwargs) -> None:
    """``op(a, b, trans_a, trans_b, **kwargs)`` forward and backward on bf16 meta tensors (M=48,
    N=32, K=272): a bf16 [M, N] output, and gradients of each input's shape and dtype."""
    m, n, k = 48, 32, 272
    a = meta(*((k, m) if trans_a else (m, k)), grad=True)
    b = meta(*((n, k) if trans_b else (k, n)), grad=True)
    out = op(a, b, trans_a, trans_b, **kwargs)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    assert a.grad.dtype == a.dtype and b.grad.dtype == b.dtype


def check_grouped_gemm_step_on_meta(op, trans_b: bool, k: int, n: int, **kwargs) -> None:
    """``op(a, b, group_lens, trans_b=trans_b, **kwargs)`` forward and backward on bf16 meta tensors
    (3 groups, M=40): a bf16 [M, n] output, and gradients of each input's shape and dtype."""
    groups, m = 3, 40
    a = meta(m, k, grad=True)
    b = meta(*((groups, n, k) if trans_b else (groups, k, n)), grad=True)
    out = op(a, b, meta_lens(groups), trans_b=trans_b, **kwargs)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    out.sum().backward()
    assert a.grad.shape == a.shape and a.grad.dtype == a.dtype
    assert b.grad.shape == b.shape and b.grad.dtype == b.dtype


def hp_gemm_bad_arguments(odd_shapes_refused: bool = True):
    """(a, b, kwargs, exception, match) cases of gemm_fp8 / gemm_fp4 with high-precision inputs,
    for ``@pytest.mark.parametrize("a,b,kwargs,exc,match", ...)``; ``odd_shapes_refused``: the op
    refuses M, K, N that are not multiples of 16 (gemm_fp8 pads them instead)."""
    odd = [
        (meta(16, 40), meta(40, 16), {}, ValueError, "K=40 must be a multiple of 16"),
        (meta(16, 32, grad=True), meta(32, 24), {}, ValueError, r"N=24 to be multiples of 16"),
        (meta(24, 32, grad=True), meta(32, 16), {}, ValueError, r"M=24 and N=16 to be multiples of 16"),
    ]
    return (odd if odd_shapes_refused else []) + [
        (torch.randn(16, 32), torch.randn(32, 16), {}, ValueError, "argument 'a' is on cpu; expected a CUDA device"),
        (meta(16, 32), meta(48, 16), {}, ValueError, r"inner dimensions do not match: op\(a\) is \[16, 32\]"),
        (meta(16, 32), meta(32, 16, dtype=torch.float16), {}, TypeError, "argument 'b' has dtype torch.float16"),
        (meta(16, 32, dtype=torch.int32), meta(32, 16, dtype=torch.int32), {}, TypeError, "argument 'a' has dtype"),
        (meta(16, 32, 2), meta(32, 16), {}, ValueError, "argument 'a' must be 2-D"),
        (meta(16, 32), meta(32, 16), {"out_dtype": torch.int8}, TypeError, "out_dtype"),
        ("not a tensor", meta(32, 16), {}, TypeError, "must be a torch.Tensor"),
    ]


def hp_grouped_gemm_bad_arguments(n, k):
    """(args, kwargs, exception, match) cases of grouped_gemm_fp8 / grouped_gemm_fp4 with
    high-precision inputs, each a single fault in a valid problem a [4, k] x b [2, n, k] (trans_b),
    for ``@pytest.mark.parametrize("args,kwargs,exc,match", ...)``."""
    ok = (meta(4, k), meta(2, n, k), meta_lens(2))
    return [
        (
            (torch.randn(4, k).bfloat16(), torch.randn(2, n, k).bfloat16(), torch.tensor([2, 2])),
            {},
            ValueError,
            "argument 'a' is on cpu; expected a CUDA device",
        ),
        ((meta(4, k), meta(2, n, 2 * k), meta_lens(2)), {}, ValueError, "inner dimensions do not match"),
        (
            (meta(4, k), meta(2, n, k, dtype=torch.float16), meta_lens(2)),
            {},
            TypeError,
            "argument 'b' has dtype torch.float16",
        ),
        (
            (meta(4, k, dtype=torch.float32), meta(2, n, k, dtype=torch.float32), meta_lens(2)),
            {},
            TypeError,
            "argument 'a' has dtype torch.float32; expected bfloat16 or float16",
        ),
        ((meta(4, k), meta(n, k), meta_lens(2)), {}, ValueError, "argument 'b' must be 3-D"),
        ((meta(4, k), meta(2, n, k), meta_lens(3)), {}, ValueError, "'group_lens' has 3 groups but 'b' has 2"),
        (
            (meta(4, k), meta(2, n, k), meta_lens(2, torch.int32)),
            {},
            TypeError,
            "'group_lens' has dtype torch.int32",
        ),
        ((*ok, meta_lens(2)), {}, ValueError, r"'group_offs' has shape \(2,\); expected \[3\]"),
        (ok, {"out_dtype": torch.int8}, TypeError, "out_dtype"),
        (ok, {"num_cu": 0}, ValueError, "num_cu must be a positive int"),
        (("x", meta(2, n, k), meta_lens(2)), {}, TypeError, "argument 'a' must be a torch.Tensor"),
    ]
