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


def test_compile_without_num_out_tokens_gives_an_unbacked_row_count():
    """num_out_tokens=-1 (count the mask): the row count is data-dependent, an unbacked size under
    tracing, so fullgraph compile works."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv()):
        x = torch.empty(8, 32, device="cuda", dtype=torch.bfloat16)
        p = torch.empty(8, 4, device="cuda", dtype=torch.float32)
        m = torch.empty(8, 4, device="cuda", dtype=torch.bool)
        out, pp, rmap = turbo.ops.token_permute(x, p, m)
        assert isinstance(out.shape[0], torch.SymInt) and out.shape[1] == 32
        assert pp.shape[0] is out.shape[0] or pp.shape[0] == out.shape[0]
        assert rmap.shape == (8, 4)

    def fn(x, p, m):
        out, _, rmap = turbo.ops.token_permute(x, p, m)
        return turbo.ops.token_unpermute(out, rmap, p)

    # Traced only (the graph is not run: meta tensors have no data to count).
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    try:
        torch.compile(fn, fullgraph=True, backend=record)(
            meta(8, 32), meta(8, 4, dtype=torch.float32), meta(8, 4, dtype=torch.bool)
        )
    except RuntimeError as e:  # running the traced graph on meta tensors; tracing itself succeeded
        assert "data-dependent shape" in str(e)
    assert len(graphs) == 1
    assert any("moe_token_permute_counted" in str(n.target) for n in graphs[0].graph.nodes)


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


# ---- moe_permute / moe_unpermute ----------------------------------------------------------------


def test_moe_shapes_on_meta_and_backward():
    x, p = meta(6, 32, grad=True), meta(6, 2, dtype=torch.float32, grad=True)
    idx = meta(6, 2, dtype=torch.int64)
    out, rmap, tpe, ovf, nd, ps, pp = turbo.ops.moe_permute(
        x, idx, num_local_experts=8, num_topk=2, pad_multiple=4, num_permuted_tokens=40, probs=p
    )
    assert out.shape == (40, 32) and rmap.shape == (10, 17) and rmap.dtype == torch.int32
    assert tpe.shape == (8,) and tpe.dtype == torch.int64 and ovf.shape == nd.shape == (1,)
    assert ps is None and pp.shape == (40,) and pp.dtype == torch.float32
    back, up = turbo.ops.moe_unpermute(
        out, rmap, nd, restore_shape=x.shape, num_local_experts=8, permuted_probs=pp, probs_topk_stride=2
    )
    assert back.shape == (6, 32) and up.shape == (6, 2)
    (back.float().sum() + up.sum()).backward()
    assert x.grad.shape == x.shape and p.grad.shape == p.shape
    # Routing map and per-expert probabilities; FP8 tokens with scales.
    out, rmap, *_, pp = turbo.ops.moe_permute(
        meta(6, 32), meta(6, 8, dtype=torch.bool), num_local_experts=8, num_permuted_tokens=12,
        probs=meta(6, 8, dtype=torch.float32), probs_layout="routing_map",
    )
    assert out.shape == (12, 32) and rmap.shape == (6, 17) and pp.shape == (12,)
    back, up = turbo.ops.moe_unpermute(out, rmap, nd, restore_shape=(6, 32), num_local_experts=8, permuted_probs=pp)
    assert up.shape == (6, 8)
    q = meta(6, 32, dtype=torch.float8_e4m3fn)
    out, *_, ps, pp = turbo.ops.moe_permute(
        q, idx, num_local_experts=8, num_topk=2, num_permuted_tokens=12, scaling_factor=meta(6, 2, dtype=torch.float32),
        scales_per_token=2, use_fp8=True,
    )
    assert out.dtype == torch.float8_e4m3fn and ps.shape == (12, 2) and pp is None
    # Zero tokens: no rows (as the original), the padding rows of the map remain.
    out, rmap, *_ = turbo.ops.moe_permute(
        meta(0, 32), meta(0, 2, dtype=torch.int32), num_local_experts=8, num_topk=2, pad_multiple=8,
        num_permuted_tokens=16,
    )
    assert out.shape == (0, 32) and rmap.shape == (8, 17)


def test_moe_compile_traces_without_graph_break():
    def fn(x, idx, p):
        out, rmap, _, _, nd, _, pp = turbo.ops.moe_permute(
            x, idx, num_local_experts=4, num_topk=2, pad_multiple=2, num_permuted_tokens=24, probs=p
        )
        return turbo.ops.moe_unpermute(
            out, rmap, nd, restore_shape=x.shape, num_local_experts=4, permuted_probs=pp, probs_topk_stride=2
        )

    back, up = torch.compile(fn, fullgraph=True, backend="aot_eager")(
        meta(8, 32, grad=True), meta(8, 2, dtype=torch.int64), meta(8, 2, dtype=torch.float32, grad=True)
    )
    assert back.shape == (8, 32) and up.shape == (8, 2)


def _permute_args(**kw):
    args = {
        "tokens": meta(6, 32),
        "expert_map": meta(6, 2, dtype=torch.int32),
        "num_local_experts": 8,
        "num_topk": 2,
        "num_permuted_tokens": 12,
    }
    args.update(kw)
    return args


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"probs_layout": "dense"}, ValueError, "probs_layout must be"),
        ({"num_topk": 0}, ValueError, "num_topk >= 1"),  # expert indices need a topk
        ({"num_topk": 0, "probs": meta(6, 2, dtype=torch.float32)}, ValueError, "requires num_topk > 0"),
        ({"num_local_experts": 0}, ValueError, "argument 'num_local_experts'"),
        ({"num_local_experts": 2000}, ValueError, "argument 'num_local_experts'"),
        ({"pad_multiple": -1}, ValueError, "argument 'pad_multiple'"),
        ({"num_permuted_tokens": 1.5}, ValueError, "argument 'num_permuted_tokens'"),
        ({"tokens": meta(6, 32, dtype=torch.int32)}, TypeError, "argument 'tokens' has dtype"),
        ({"tokens": meta(6, 32, dtype=torch.float8_e4m3fn)}, TypeError, "use_fp8=True"),
        ({"tokens": meta(6, 32), "use_fp8": True}, TypeError, "use_fp8 expects"),
        ({"tokens": meta(6, 20, dtype=torch.float8_e4m3fn), "use_fp8": True}, ValueError, "multiple of 16"),
        ({"tokens": meta(6, 4, 8)}, ValueError, "argument 'tokens' has shape"),
        ({"expert_map": meta(6, 2, dtype=torch.float32)}, TypeError, "argument 'expert_map'"),
        ({"expert_map": meta(5, 2, dtype=torch.int32)}, ValueError, "argument 'expert_map' has shape"),
        ({"expert_map": meta(6, 3, dtype=torch.int64)}, ValueError, "argument 'expert_map' has shape"),
        ({"expert_map": meta(6, 7, dtype=torch.bool)}, ValueError, "argument 'expert_map' has shape"),
        (
            {"expert_map": meta(6, 8, dtype=torch.bool), "probs": meta(6, 2, dtype=torch.float32)},
            ValueError,
            "probs_layout='routing_map'",
        ),
        ({"probs": meta(6, 8, dtype=torch.float32)}, ValueError, "argument 'probs' has shape"),
        ({"probs": meta(6, 2, dtype=torch.int32)}, TypeError, "argument 'probs'"),
        (
            {"probs": meta(6, 2, dtype=torch.float32), "probs_layout": "routing_map"},
            ValueError,
            "argument 'probs' has shape",
        ),
        (
            {
                "tokens": meta(6, 32, dtype=torch.float8_e4m3fn),
                "use_fp8": True,
                "scaling_factor": meta(6, 2, dtype=torch.float32),
            },
            ValueError,
            "scales_per_token must be > 0",
        ),
        (
            {
                "tokens": meta(6, 32, dtype=torch.float8_e4m3fn),
                "use_fp8": True,
                "scaling_factor": meta(6, 3, dtype=torch.float32),
                "scales_per_token": 2,
            },
            ValueError,
            "argument 'scaling_factor' has shape",
        ),
        (
            {
                "tokens": meta(6, 32, dtype=torch.float8_e4m3fn),
                "use_fp8": True,
                "scaling_factor": meta(6, 2, dtype=torch.bfloat16),
                "scales_per_token": 2,
            },
            TypeError,
            "argument 'scaling_factor' must be a float32",
        ),
        ({"tokens": torch.empty(6, 32)}, ValueError, "argument 'tokens' is on cpu"),
    ],
)
def test_moe_permute_argument_errors(kwargs, exc, match):
    args = _permute_args(**kwargs)
    tokens, emap = args.pop("tokens"), args.pop("expert_map")
    with pytest.raises(exc, match=match):
        turbo.ops.moe_permute(tokens, emap, **args)


def test_moe_permute_scales_ignored_without_fp8():
    out = turbo.ops.moe_permute(**_permute_args(scaling_factor=meta(6, 2, dtype=torch.float32), scales_per_token=2))
    assert out[5] is None


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"permuted_tokens": meta(12, 32, dtype=torch.float8_e4m3fn)}, TypeError, "argument 'permuted_tokens'"),
        ({"row_id_map": meta(6, 17, dtype=torch.int64)}, TypeError, "argument 'row_id_map'"),
        ({"row_id_map": meta(6, 16, dtype=torch.int32)}, ValueError, "argument 'row_id_map' has shape"),
        ({"restore_shape": (6, 31)}, ValueError, "argument 'restore_shape'"),
        ({"restore_shape": (7, 32)}, ValueError, "argument 'restore_shape'"),
        ({"restore_shape": 6}, ValueError, "argument 'restore_shape'"),
        ({"pad_multiple": 4}, ValueError, "argument 'pad_multiple'"),
        ({"num_dispatched_tokens_tensor": meta(2, dtype=torch.int32)}, TypeError, "num_dispatched_tokens_tensor"),
        ({"permuted_probs": meta(11, dtype=torch.float32)}, ValueError, "argument 'permuted_probs' has shape"),
        ({"num_local_experts": 9}, ValueError, "argument 'row_id_map' has shape"),
        ({"probs_topk_stride": -1}, ValueError, "argument 'probs_topk_stride'"),
    ],
)
def test_moe_unpermute_argument_errors(kwargs, exc, match):
    args = {
        "permuted_tokens": meta(12, 32),
        "row_id_map": meta(6, 17, dtype=torch.int32),
        "num_dispatched_tokens_tensor": meta(1, dtype=torch.int32),
        "restore_shape": (6, 32),
        "num_local_experts": 8,
    }
    args.update(kwargs)
    pt, rmap, nd = args.pop("permuted_tokens"), args.pop("row_id_map"), args.pop("num_dispatched_tokens_tensor")
    with pytest.raises(exc, match=match):
        turbo.ops.moe_unpermute(pt, rmap, nd, **args)


def test_core_rejects_bad_route_descriptors():
    from primus_turbo._core import check, lib
    from primus_turbo.pytorch.core.tensor_bridge import to_pt

    idx = torch.zeros(4, 2, dtype=torch.int32)
    rmap = torch.empty(4, 17, dtype=torch.int32)
    ws = torch.empty(lib.pt_moe_route_workspace_ints(4, 8), dtype=torch.int32)
    assert ws.numel() == 1 * 9 + 3 * 8 + 3
    with pytest.raises(ValueError, match="argument 'num_experts'"):
        check(lib.pt_moe_route_build(to_pt(idx), 0, 1, -1, 0, to_pt(rmap), to_pt(ws), None, None, None, None))
    with pytest.raises(ValueError, match="argument 'workspace' has shape"):
        check(lib.pt_moe_route_build(to_pt(idx), 8, 1, -1, 0, to_pt(rmap), to_pt(ws[:5]), None, None, None, None))
    with pytest.raises(ValueError, match="argument 'row_id_map' has shape"):
        bad = torch.empty(4, 9, dtype=torch.int32)
        check(lib.pt_moe_route_build(to_pt(idx), 8, 1, -1, 0, to_pt(bad), to_pt(ws), None, None, None, None))
    with pytest.raises(ValueError, match="argument 'expert_map' has dtype"):
        check(
            lib.pt_moe_route_build(
                to_pt(idx.float()), 8, 1, -1, 0, to_pt(rmap), to_pt(ws), None, None, None, None
            )
        )
    x = torch.empty(4, 8, dtype=torch.bfloat16)
    out = torch.empty(8, 8, dtype=torch.float16)
    n = torch.empty(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="argument 'dst' has dtype"):
        check(lib.pt_moe_rows_scatter(to_pt(x), to_pt(rmap), 8, None, None, to_pt(n), 1, to_pt(out), None, None, None))
    with pytest.raises(ValueError, match="argument 'src' has dtype"):
        check(lib.pt_moe_rows_gather(to_pt(x.to(torch.float8_e4m3fn)), to_pt(rmap), 8, None, to_pt(x), None, None))


def test_audit_fixes_restore_shape_zero_tokens_and_probs_layout():
    import torch as _t

    tokens, rmap = _t.empty(0, 32, device="meta"), _t.zeros(0, 4, dtype=_t.bool, device="meta")
    out, _, row_id_map = turbo.ops.token_permute(tokens, routing_map=rmap, num_out_tokens=16)
    with pytest.raises(TypeError, match="argument 'restore_shape'"):
        turbo.ops.token_unpermute(out, row_id_map, restore_shape=8)
    # A routing map without probs takes the default probs_layout.
    perm = turbo.ops.moe_permute(_t.empty(8, 32, device="meta"), _t.zeros(8, 4, dtype=_t.bool, device="meta"),
                                 num_local_experts=4, num_permuted_tokens=16)
    assert perm[0].shape == (16, 32)


def test_native_gather_and_scatter_name_bad_arguments():
    """moe_unpermute's gather and scatter are native ops: they check their tensors before any launch
    and name the argument (the public op's checks run first; these guard direct calls)."""
    ops = torch.ops.primus_turbo
    rows, rmap = torch.zeros(4, 8), torch.zeros(2, 5, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="moe_unpermute: argument 'permuted_tokens' is on cpu"):
        ops.moe_index_gather.default(rows, rmap, None, 2, 2, 2)
    with pytest.raises(RuntimeError, match="moe_unpermute: argument 'grad_output' is on cpu"):
        ops.moe_index_scatter.default(rows, rmap, None, 4, 2)
    back, probs = ops.moe_index_gather.default(meta(4, 8), meta(2, 5, dtype=torch.int32), meta(4), 2, 2, 3)
    assert back.shape == (2, 8) and probs.shape == (2, 3)
    grad, gprobs = ops.moe_index_scatter.default(meta(2, 8), meta(2, 5, dtype=torch.int32), None, 4, 2)
    assert grad.shape == (4, 8) and gprobs.shape == (0,)
