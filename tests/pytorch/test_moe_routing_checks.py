"""Host-side behaviour of the MoE routing ops that needs no GPU: argument errors raised before any
launch (in Python and in the core), and shapes/dtypes through fake/meta tensors and torch.compile."""

import ctypes

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo._core import PtTensor, check, lib

FAKE_PTR = 1 << 20
route = turbo.ops.fused_group_topk_routing_with_aux_score


def meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(shape, device="meta", dtype=dtype, requires_grad=grad)


# ---- fused_group_topk_routing_with_aux_score ---------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens,experts,topk,groups,sel,fn",
    [
        (7, 256, 8, 8, 4, "sigmoid"),
        (3, 128, 8, 1, 1, "softmax"),
        (0, 8, 2, 1, 1, "softmax"),
        (5, 384, 8, 1, 1, "sigmoid"),
        (5, 1024, 16, 64, 8, "sigmoid"),
    ],
)
def test_routing_shapes_on_meta(dtype, tokens, experts, topk, groups, sel, fn):
    x = meta(tokens, experts, dtype=dtype, grad=True)
    scores, probs, rmap = route(x, topk, groups, sel, fn, 2.5)
    assert scores.shape == probs.shape == rmap.shape == (tokens, experts)
    assert scores.dtype == probs.dtype == dtype and rmap.dtype == torch.bool
    assert scores.requires_grad and probs.requires_grad and not rmap.requires_grad
    (scores.sum() + probs.sum()).backward()
    assert x.grad.shape == x.shape and x.grad.dtype == dtype


def test_routing_none_groups_and_scaling_mean_defaults():
    x = meta(4, 64)
    _, probs, _ = route(x, 4, None, None, "softmax", None)
    assert probs.shape == (4, 64)


def test_routing_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(16, 256, device="cuda", dtype=torch.bfloat16)
        s, p, m = route(x, 8, 8, 4, "sigmoid", 2.5)
    assert s.device.type == "cuda" and m.dtype == torch.bool and p.shape == (16, 256)


def test_routing_torch_compile_traces_without_graph_break():
    def fn(x):
        s, p, m = route(x, 8, 8, 4, "sigmoid", 2.5)
        return (s * s).sum() + (p * m).sum()

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    x = meta(6, 256, dtype=torch.float32, grad=True)
    compiled(x).backward()
    assert x.grad.shape == x.shape


def test_ops_registered():
    names = str(torch.ops.primus_turbo.moe_routing_fwd.default._schema)
    assert "moe_routing_fwd(Tensor logits, int topk, int groups, int selected_groups" in names
    assert "moe_routing_bwd" in str(torch.ops.primus_turbo.moe_routing_bwd.default._schema)
    assert "indices_to_multihot_fwd" in str(torch.ops.primus_turbo.indices_to_multihot_fwd.default._schema)
    assert "tokens_per_expert_to_mask" in str(torch.ops.primus_turbo.tokens_per_expert_to_mask.default._schema)


@pytest.mark.parametrize(
    "args,exc,match",
    [
        ((meta(4, 16, dtype=torch.int32), 2), TypeError, "argument 'logits' has dtype"),
        ((meta(4, 16, 2), 2), ValueError, "argument 'logits' has shape"),
        ((meta(16), 2), ValueError, "argument 'logits' has shape"),
        ((meta(4, 2048), 2), ValueError, "expected 1 to 1024"),
        ((meta(4, 16), 17), ValueError, "argument 'topk' is 17"),
        ((meta(4, 16), 0), ValueError, "argument 'topk' is 0"),
        ((meta(4, 16), 2.0), TypeError, "argument 'topk' must be an int"),
        ((meta(4, 18), 2, 4, 2), ValueError, r"'groups' \(4\) must divide"),
        ((meta(4, 16), 2, 4, 5), ValueError, "argument 'selected_groups' is 5"),
        ((meta(4, 16), 2, 4, 0), ValueError, "argument 'selected_groups' is 0"),
        ((meta(4, 16), 2, 4, 3), ValueError, r"'topk' \(2\) must be at least selected_groups"),
        ((meta(4, 16), 9, 4, 2), ValueError, r"exceeds the experts of the selected groups \(.* = 8\)"),
        ((meta(4, 128), 8, 128, 4), ValueError, "argument 'groups' is 128"),
        ((meta(4, 16), 2, 1, 1, "relu"), ValueError, "argument 'score_function'"),
        ((meta(4, 16), 2, 1, 1, "sigmoid", "x"), TypeError, "argument 'scaling_factor'"),
        ((torch.zeros(4, 16), 2), ValueError, "argument 'logits' is on cpu"),
        (([[1.0]], 1), TypeError, "argument 'logits' must be a torch.Tensor"),
    ],
)
def test_routing_argument_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        route(*args)


# ---- indices_to_multihot / tokens_per_expert_to_mask ------------------------------------------


@pytest.mark.parametrize("fused,want", [(False, torch.float32), (True, torch.bfloat16)])
def test_multihot_shapes_on_meta(fused, want):
    idx = meta(5, 8, dtype=torch.int64)
    probs = meta(5, 8, dtype=torch.bfloat16, grad=True)
    rmap, dense = turbo.ops.indices_to_multihot(idx, probs, 64, fused=fused)
    assert rmap.shape == dense.shape == (5, 64) and rmap.dtype == torch.bool and dense.dtype == want
    dense.sum().backward()
    assert probs.grad.shape == probs.shape and probs.grad.dtype == torch.bfloat16


def test_multihot_torch_compile_traces_without_graph_break():
    def fn(idx, probs):
        rmap, dense = turbo.ops.indices_to_multihot(idx, probs, 32, fused=True)
        return (dense * rmap).sum()

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    probs = meta(5, 4, dtype=torch.float32, grad=True)
    compiled(meta(5, 4, dtype=torch.int32), probs).backward()
    assert probs.grad.shape == probs.shape


@pytest.mark.parametrize(
    "args,exc,match",
    [
        ((meta(4, 2, dtype=torch.float32), meta(4, 2), 8), TypeError, "argument 'indices' has dtype"),
        ((meta(4, 2, dtype=torch.int64), meta(4, 2, dtype=torch.int32), 8), TypeError, "'probs_indices' has dtype"),
        ((meta(4, dtype=torch.int64), meta(4), 8), ValueError, "argument 'indices' has shape"),
        ((meta(4, 2, dtype=torch.int64), meta(4, 3), 8), ValueError, "'probs_indices' has shape"),
        ((meta(4, 2, dtype=torch.int64), meta(4, 2), -1), ValueError, "num_of_local_experts"),
        ((torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 2), 8), ValueError, "is on cpu"),
    ],
)
def test_multihot_argument_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.indices_to_multihot(*args)


def test_tokens_mask_shapes_and_errors():
    out = turbo.ops.tokens_per_expert_to_mask(meta(8, dtype=torch.int64), 33)
    assert out.shape == (33,) and out.dtype == torch.int64
    assert turbo.ops.tokens_per_expert_to_mask(meta(8, dtype=torch.int32), 0).shape == (0,)
    with pytest.raises(TypeError, match="has dtype"):
        turbo.ops.tokens_per_expert_to_mask(meta(8, dtype=torch.float32), 4)
    with pytest.raises(ValueError, match="expected a 1-D"):
        turbo.ops.tokens_per_expert_to_mask(meta(2, 4, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="num_tokens"):
        turbo.ops.tokens_per_expert_to_mask(meta(8, dtype=torch.int32), -1)
    with pytest.raises(ValueError, match="is on cpu"):
        turbo.ops.tokens_per_expert_to_mask(torch.zeros(8, dtype=torch.int32), 4)


# ---- the core repeats the checks (C / JAX callers get the same messages) -----------------------


def pt(shape, dtype_code=2, ptr=FAKE_PTR):
    dims = ctypes.c_int64 * 8
    strides, acc = [], 1
    for s in reversed(shape):
        strides.insert(0, acc)
        acc *= s
    return PtTensor(ptr, dtype_code, len(shape), dims(*shape), dims(*strides))


def core_fwd(x, topk=2, groups=1, sel=1, softmax=0, scores=None, probs=None, rmap=None):
    shape = [x.shape[i] for i in range(x.ndim)]
    scores = scores or pt(shape, x.dtype)
    probs = probs or pt(shape, x.dtype)
    rmap = rmap or pt(shape, 9)
    r = ctypes.byref
    return lib.pt_moe_routing_fwd(r(x), r(scores), r(probs), r(rmap), topk, groups, sel, softmax, 1.0, None)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: core_fwd(pt([4, 16], 7)), "argument 'logits' has dtype"),
        (lambda: core_fwd(pt([4, 16, 2])), "argument 'logits' has shape"),
        (lambda: core_fwd(pt([4, 2048])), "expected 1 to 1024"),
        (lambda: core_fwd(pt([4, 16]), topk=17), "argument 'topk' is 17"),
        (lambda: core_fwd(pt([4, 18]), groups=4, sel=2), "must divide the number of experts"),
        (lambda: core_fwd(pt([4, 16]), groups=4, sel=5), "argument 'selected_groups' is 5"),
        (lambda: core_fwd(pt([4, 16]), topk=9, groups=4, sel=2), "exceeds the experts of the selected groups"),
        (lambda: core_fwd(pt([4, 16]), topk=2, groups=4, sel=3), "must be at least selected_groups"),
        (lambda: core_fwd(pt([4, 16]), softmax=3), "argument 'softmax'"),
        (lambda: core_fwd(pt([4, 16]), probs=pt([4, 16], 0)), "argument 'probs' has dtype"),
        (lambda: core_fwd(pt([4, 16]), rmap=pt([4, 16], 2)), "argument 'routing_map' has dtype"),
        (lambda: core_fwd(pt([4, 16]), scores=pt([4, 15])), "argument 'scores'"),
    ],
)
def test_core_rejects_bad_routing_descriptors(call, match):
    with pytest.raises(ValueError, match=match):
        check(call())


def test_core_rejects_bad_helper_descriptors():
    r = ctypes.byref
    with pytest.raises(ValueError, match="argument 'indices' has dtype"):
        check(
            lib.pt_indices_to_multihot_fwd(r(pt([4, 2], 0)), r(pt([4, 2], 0)), r(pt([4, 8], 9)), r(pt([4, 8], 0)), None)
        )
    with pytest.raises(ValueError, match="argument 'multihot' has shape"):
        check(
            lib.pt_indices_to_multihot_fwd(r(pt([4, 2], 8)), r(pt([4, 2], 0)), r(pt([5, 8], 9)), r(pt([5, 8], 0)), None)
        )
    with pytest.raises(ValueError, match="argument 'grad_probs'"):
        check(lib.pt_indices_to_multihot_bwd(r(pt([4, 2], 8)), r(pt([4, 8], 0)), r(pt([4, 3], 0)), None))
    with pytest.raises(ValueError, match="argument 'tokens_per_expert' has dtype"):
        check(lib.pt_tokens_per_expert_to_mask(r(pt([8], 0)), r(pt([4], 8)), None))
    with pytest.raises(ValueError, match="argument 'mask'"):
        check(lib.pt_tokens_per_expert_to_mask(r(pt([8], 7)), r(pt([4], 7)), None))
    with pytest.raises(ValueError, match="argument 'grad_logits'"):
        check(lib.pt_moe_routing_bwd(r(pt([4, 16])), r(pt([4, 16], 9)), None, None, r(pt([4, 16], 0)), 2, 0, 1.0, None))


def test_core_empty_tokens_is_a_no_op():
    r = ctypes.byref
    x = pt([0, 16], ptr=None)
    check(
        lib.pt_moe_routing_fwd(
            r(x), r(pt([0, 16], ptr=None)), r(pt([0, 16], ptr=None)), r(pt([0, 16], 9, ptr=None)), 2, 1, 1, 0, 1.0, None
        )
    )
