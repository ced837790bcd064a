"""Host-side behaviour of token_permute / token_unpermute that needs no GPU: argument errors before
any launch, and shapes through meta tensors and torch.compile."""

import pytest
import torch

import primus_turbo.pytorch as turbo


def meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(shape, device="meta", dtype=dtype, requires_grad=grad)


def test_shapes_on_meta_and_backward():
    x, p = meta(6, 32, grad=True), meta(6, 8, dtype=torch.float32, grad=True)
    out, pp, rmap = turbo.ops.token_permute(x, p, meta(6, 8, dtype=torch.bool), num_out_tokens=12)
    assert out.shape == (12, 32) and pp.shape == (12,) and rmap.shape == (6, 8) and rmap.dtype == torch.int32
    y = meta(12, 32, grad=True)
    merged = turbo.ops.token_unpermute(y, rmap, p)
    assert merged.shape == (6, 32)
    (out.float().sum() + pp.sum()).backward()
    assert x.grad.shape == x.shape and p.grad.shape == p.shape
    merged.float().sum().backward()
    assert y.grad.shape == y.shape


def test_compile_traces_without_graph_break():
    def fn(x, p, m):
        out, _, rmap = turbo.ops.token_permute(x, p, m, num_out_tokens=16)
        return turbo.ops.token_unpermute(out, rmap, p)

    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(
        meta(8, 32, grad=True), meta(8, 4, dtype=torch.float32), meta(8, 4, dtype=torch.bool)
    )
    assert out.shape == (8, 32)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"inp": meta(6, 32, dtype=torch.int32)}, TypeError, "argument 'inp' has dtype"),
        ({"routing_map": meta(5, 8, dtype=torch.bool)}, ValueError, "argument 'routing_map' has shape"),
        ({"routing_map": meta(6, 2000, dtype=torch.bool)}, ValueError, "argument 'routing_map' has shape"),
        ({"routing_map": meta(6, 8, dtype=torch.float32)}, TypeError, "argument 'routing_map'"),
        ({"probs": meta(6, 7, dtype=torch.float32)}, ValueError, "argument 'probs' has shape"),
        ({"num_out_tokens": -2}, ValueError, "argument 'num_out_tokens'"),
        ({"topk_indices": meta(6, 2, dtype=torch.int32)}, NotImplementedError, "topk_indices"),
        ({"routing_map": None}, ValueError, "routing_map"),
        ({"inp": torch.empty(6, 32)}, ValueError, "argument 'inp' is on cpu"),
    ],
)
def test_permute_argument_errors(kwargs, exc, match):
    args = {"inp": meta(6, 32), "routing_map": meta(6, 8, dtype=torch.bool), "num_out_tokens": 12}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        turbo.ops.token_permute(**args)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"row_id_map": meta(6, 8, dtype=torch.int64)}, TypeError, "argument 'row_id_map'"),
        ({"merging_probs": meta(6, 9, dtype=torch.float32)}, ValueError, "argument 'merging_probs' has shape"),
        ({"restore_shape": (7, 32)}, ValueError, "argument 'restore_shape'"),
        ({"map_type": "index"}, ValueError, "argument 'map_type'"),
    ],
)
def test_unpermute_argument_errors(kwargs, exc, match):
    args = {"inp": meta(12, 32), "row_id_map": meta(6, 8, dtype=torch.int32)}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        turbo.ops.token_unpermute(**args)


def test_core_rejects_bad_descriptors():
    from primus_turbo._core import check, lib
    from primus_turbo.pytorch.core.tensor_bridge import to_pt

    x = torch.empty(4, 8, dtype=torch.bfloat16)
    out = torch.empty(8, 8, dtype=torch.float16)
    rmap = torch.empty(4, 2, dtype=torch.int32)
    mask = torch.empty(4, 2, dtype=torch.uint8)
    ws = torch.empty(5, dtype=torch.int32)
    with pytest.raises(ValueError, match="argument 'output' has dtype"):
        check(lib.pt_moe_permute(to_pt(x), to_pt(mask), None, to_pt(out), None, to_pt(rmap), to_pt(ws), None))
    with pytest.raises(ValueError, match="argument 'workspace' has shape"):
        check(
            lib.pt_moe_permute(
                to_pt(x), to_pt(mask), None, to_pt(out.bfloat16()), None, to_pt(rmap), to_pt(ws[:3]), None
            )
        )
