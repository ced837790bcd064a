"""Host-side behaviour of turbo.ops.rope that needs no GPU: argument errors raised before any launch
(in Python and in the core), and shapes through fake/meta tensors and torch.compile."""

import ctypes

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo._core import PtTensor, check, lib

FAKE_PTR = 1 << 20


def meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(shape, device="meta", dtype=dtype, requires_grad=grad)


@pytest.mark.parametrize(
    "layout,qs,ks",
    [
        ("bshd", (2, 5, 4, 64), (2, 5, 2, 64)),
        ("sbhd", (5, 2, 4, 64), (5, 2, 1, 64)),
        ("thd", (9, 3, 32), (9, 3, 32)),
        ("bshd", (0, 5, 4, 64), (0, 5, 2, 64)),
    ],
)
def test_shapes_forward_and_backward_on_meta(layout, qs, ks):
    q, k = meta(*qs, grad=True), meta(*ks, grad=True)
    qo, ko = turbo.ops.rope(q, k, layout=layout)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == q.dtype
    (qo.sum() + ko.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 8, 4, 64, device="cuda", dtype=torch.float16)
        k = torch.empty(2, 8, 1, 64, device="cuda", dtype=torch.float16)
        cos = torch.empty(16, 16, device="cuda")
        qo, ko = turbo.ops.rope(q, k, cos, cos, interleaved=True)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.device.type == "cuda"


def test_fake_cuda_tensors_get_the_eager_checks():
    # torch.compile traces with fake CUDA tensors: the fake op runs the checks the C++ core would.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 8, 4, 64, device="cuda", dtype=torch.float16)
        bad = [
            ({"q": torch.empty(2, 8, 4, 64, device="cuda", dtype=torch.int32)}, TypeError, "argument 'q'"),
            ({"q": torch.empty(8, 4, 64, device="cuda", dtype=torch.float16)}, ValueError, "layout 'bshd'"),
            ({"rotary_dim": 31}, ValueError, "rotary_dim"),
            ({"theta": -1.0}, ValueError, "theta"),
            ({"cos": torch.empty(16, device="cuda"), "sin": torch.empty(16, device="cuda")}, ValueError,
             "argument 'cos' has shape"),
            ({"cos": torch.empty(16, 32, device="cuda")}, ValueError, "'cos' and 'sin'"),
            ({"interleaved": "no"}, TypeError, "interleaved"),
        ]
        for overrides, exc, match in bad:
            args = {"q": q, "k": q, **overrides}
            with pytest.raises(exc, match=match):
                turbo.ops.rope(args.pop("q"), args.pop("k"), **args)


def test_rope_cos_sin_checks_its_arguments():
    for kwargs, match in (
        ({"max_position": 16, "rotary_dim": 63}, "even"),
        ({"max_position": -1, "rotary_dim": 64}, "max_position"),
        ({"max_position": 16.0, "rotary_dim": 64}, "max_position"),
        ({"max_position": 16, "rotary_dim": 64, "theta": 0.0}, "theta"),
    ):
        with pytest.raises(ValueError, match=match):
            turbo.ops.rope_cos_sin(**kwargs)
    cos, sin = turbo.ops.rope_cos_sin(16, 64)
    assert cos.shape == sin.shape == (16, 32)


def test_torch_compile_traces_without_graph_break():
    def fn(q, k, pos):
        qo, ko = turbo.ops.rope(q, k, positions=pos, rotary_dim=32)
        return qo * 2, ko + 1

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    q, k = meta(2, 8, 4, 64, grad=True), meta(2, 8, 2, 64, grad=True)
    qo, ko = compiled(q, k, torch.empty(2, 8, dtype=torch.int64, device="meta"))
    assert qo.shape == q.shape and ko.shape == k.shape
    (qo.sum() + ko.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_registered_as_custom_op():
    assert "primus_turbo::rope(Tensor q, Tensor k, Tensor? cos, Tensor? sin, Tensor? positions" in str(
        torch.ops.primus_turbo.rope.default._schema
    )


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"q": meta(2, 4, 2, 64, dtype=torch.int32)}, TypeError, "argument 'q' has dtype"),
        ({"k": meta(2, 4, 2, 64, dtype=torch.float16)}, TypeError, "argument 'k' has dtype"),
        ({"q": meta(2, 4, 64)}, ValueError, "argument 'q' has shape"),
        ({"k": meta(2, 5, 2, 64)}, ValueError, "argument 'k' has shape"),
        ({"layout": "bhsd"}, ValueError, "argument 'layout'"),
        ({"rotary_dim": 33}, ValueError, "argument 'rotary_dim'"),
        ({"rotary_dim": 128}, ValueError, "argument 'rotary_dim'"),
        ({"theta": 0.0}, ValueError, "argument 'theta'"),
        ({"cos": meta(8, 32, dtype=torch.float32)}, ValueError, "'cos' and 'sin' must be given together"),
        (
            {"cos": meta(8, 16, dtype=torch.float32), "sin": meta(8, 16, dtype=torch.float32), "rotary_dim": 64},
            ValueError,
            "argument 'cos' has 16 columns",
        ),
        ({"positions": meta(4, dtype=torch.float32)}, TypeError, "argument 'positions'"),
        ({"positions": meta(3, dtype=torch.int64)}, ValueError, "argument 'positions' has shape"),
        ({"cu_seqlens": meta(3, dtype=torch.int32)}, ValueError, "needs layout='thd'"),
        ({"q": torch.empty(2, 4, 2, 64, dtype=torch.bfloat16)}, ValueError, "argument 'q' is on cpu"),
    ],
)
def test_argument_errors(kwargs, exc, match):
    args = {"q": meta(2, 4, 2, 64), "k": meta(2, 4, 1, 64)}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        turbo.ops.rope(args.pop("q"), args.pop("k"), args.pop("cos", None), args.pop("sin", None), **args)


def pt(shape, dtype_code=2, strides=None, ptr=FAKE_PTR):
    dims = ctypes.c_int64 * 8
    if strides is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.insert(0, acc)
            acc *= s
    return PtTensor(ptr, dtype_code, len(shape), dims(*shape), dims(*strides))


def core_rope(q, k, qo=None, ko=None, cos=None, sin=None, positions=None, cu=None, rotary_dim=0, theta=1e4, layout=0):
    ref = lambda t: ctypes.byref(t) if t is not None else None
    return lib.pt_rope(
        ref(q),
        ref(k),
        ref(cos),
        ref(sin),
        ref(positions),
        ref(cu),
        ref(qo or q),
        ref(ko or k),
        rotary_dim,
        theta,
        0,
        layout,
        0,
        None,
    )


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: core_rope(pt([2, 4, 2, 64]), pt([2, 4, 2, 32])), "argument 'k' has shape"),
        (lambda: core_rope(pt([2, 4, 2, 64]), pt([2, 4, 1, 64]), qo=pt([2, 4, 2, 64], 1)), "argument 'q_out'"),
        (lambda: core_rope(pt([2, 4, 2, 64]), pt([2, 4, 1, 64]), rotary_dim=7), "argument 'rotary_dim'"),
        (lambda: core_rope(pt([2, 4, 2, 64], strides=[512, 128, 64, 2]), pt([2, 4, 1, 64])), "unit stride"),
        (lambda: core_rope(pt([2, 4, 2, 64]), pt([2, 4, 1, 64]), layout=5), "argument 'layout'"),
        (
            lambda: core_rope(pt([2, 4, 2, 64]), pt([2, 4, 1, 64]), cos=pt([3, 32], 0), sin=pt([3, 32], 0)),
            "the sequence has 4 positions",
        ),
        (
            lambda: core_rope(pt([2, 4, 2, 64]), pt([2, 4, 1, 64]), cos=pt([8, 32], 2), sin=pt([8, 32], 2)),
            "argument 'cos' has dtype",
        ),
        (lambda: core_rope(pt([8, 2, 64]), pt([8, 1, 64]), cu=pt([3], 8), layout=2), "argument 'cu_seqlens' has dtype"),
        (
            lambda: core_rope(pt([8, 2, 64]), pt([8, 1, 64]), positions=pt([2, 4], 7), layout=2),
            "argument 'positions' has shape",
        ),
        (lambda: core_rope(pt([2, 4, 2, 64]), pt([2, 4, 1, 64]), theta=-1.0), "argument 'theta'"),
    ],
)
def test_core_rejects_bad_descriptors(call, match):
    with pytest.raises(ValueError, match=match):
        check(call())
