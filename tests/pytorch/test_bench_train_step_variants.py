"""The end-to-end benchmark's variant names parse as its build step reads them (granularity or
torchao recipe, compiled or not), and its default set is a subset of the choices."""

import importlib.util
import sys
from pathlib import Path

import pytest

_E2E = Path(__file__).resolve().parents[2] / "benchmark" / "e2e"


@pytest.fixture(scope="module")
def bench():
    for p in (_E2E, _E2E.parent / "ops"):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    spec = importlib.util.spec_from_file_location("bench_train_step", _E2E / "bench_train_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variant_names(bench):
    assert set(bench.DEFAULT_VARIANTS) <= set(bench.ALL_VARIANTS)
    assert len(set(bench.ALL_VARIANTS)) == len(bench.ALL_VARIANTS)
    for v in bench.ALL_VARIANTS:
        g = bench.fp8_granularity(v)
        if v.startswith("torchao"):
            assert g in bench.TORCHAO_RECIPES and v.endswith("_compile")
        elif "_fp8_" in v:
            assert g in bench.GRANULARITIES
        else:
            assert g is None
    assert bench.fp8_granularity("turbo_fp8_blockwise_compile") == "blockwise"
    assert bench.fp8_granularity("turbo_fp8_tensorwise_fp8attn") == "tensorwise"


def test_shared_kernel_ratio(bench):
    base = {"gemm_a": 10.0, "attn": 5.0, "elementwise": 3.0}
    ours = {"gemm_a": 10.6, "attn": 5.3, "our_norm": 1.0}  # the shared ones 6% slower
    assert bench.shared_kernel_ratio(ours, base) == pytest.approx(15.9 / 15.0)
    assert bench.shared_kernel_ratio({"only_ours": 1.0}, base) != bench.shared_kernel_ratio({"only_ours": 1.0}, base)


def _moe_mlp(turbo, fused: bool, device: str):
    import model  # benchmark/e2e/model.py, on the path through the bench fixture

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    mlp = model.MoEMLP(hidden=64, num_experts=16, topk=4, intermediate=32, num_shared=0).to(device)
    mlp.turbo, mlp.fused_routing = turbo, fused
    return mlp


def test_moe_dense_routing_matches_topk(bench):
    """The turbo path's dense (probs, routing_map), torch ops form: route()'s renormalized top-k,
    scattered."""
    import torch

    mlp = _moe_mlp(None, False, "cpu")
    x = torch.randn(40, 64)
    top_p, top_i = mlp.route(x)
    probs, routing_map = mlp.route_dense(x)
    assert routing_map.dtype == torch.bool and routing_map.sum(-1).eq(4).all()
    assert torch.equal(routing_map.nonzero()[:, 1].view(-1, 4), top_i.sort(-1).values)
    torch.testing.assert_close(probs.gather(1, top_i), top_p)
    assert probs.masked_fill(routing_map, 0).eq(0).all()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_moe_fused_routing_matches_torch(bench):
    """turbo's fused softmax top-k, renormalized, routes as torch's softmax / topk (random logits:
    no ties) with the same probabilities, and its gradient reaches the router."""
    import torch

    import primus_turbo.pytorch as turbo

    fused, plain = _moe_mlp(turbo, True, "cuda"), _moe_mlp(turbo, False, "cuda")
    x = torch.randn(300, 64, device="cuda")
    (pf, mf), (pt, mt) = fused.route_dense(x), plain.route_dense(x)
    assert torch.equal(mf, mt)
    torch.testing.assert_close(pf, pt, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(pf)
    (gf,) = torch.autograd.grad((pf * g).sum(), fused.router.weight)
    (gt,) = torch.autograd.grad((pt * g).sum(), plain.router.weight)
    torch.testing.assert_close(gf, gt, rtol=1e-4, atol=1e-5)
