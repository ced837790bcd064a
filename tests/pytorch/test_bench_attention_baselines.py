"""The attention benchmark's FlexAttention baseline for windows and sinks computes attention with
sinks exactly (its forward, on the CPU, against an explicit float64 softmax with the sink in the
denominator): the ratios against it compare like with like."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

_OPS = Path(__file__).resolve().parents[2] / "benchmark" / "ops"


@pytest.fixture(scope="module")
def bench():
    if str(_OPS) not in sys.path:
        sys.path.insert(0, str(_OPS))
    spec = importlib.util.spec_from_file_location("bench_attention", _OPS / "bench_attention.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_attention"] = mod  # its dataclasses look their module up while it loads
    spec.loader.exec_module(mod)
    return mod


def reference(q, k, v, sink, left, causal):
    b, s, hq, d = q.shape
    g = hq // k.shape[2]
    kr, vr = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kr) / math.sqrt(d)
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    visible = torch.ones(s, s, dtype=torch.bool)
    if left is not None:  # the benchmark's window: (w, 0) causal, (w, w) otherwise
        visible &= (j >= i - left) & (j <= i + left)
    if causal:
        visible &= j <= i
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        scores = torch.cat([scores, sink[None, :, None, None].expand(b, hq, s, 1)], -1)
    p = torch.softmax(scores, -1)[..., :s]
    return torch.einsum("bhqk,bkhd->bqhd", p, vr)


@pytest.mark.parametrize("window,sinks,causal", [(7, True, True), (None, True, True), (5, False, True), (6, True, False)])
def test_flex_baseline_forward_matches_the_explicit_softmax(bench, window, sinks, causal):
    case = bench.Case(4, 2, 16, 16, 1, 40, causal, window, sinks)
    # Eager: the CPU runs FlexAttention's reference path.
    fn, prepare, _ = bench._flex_window_sink(case, 2, device="cpu", compiled=False)
    torch.manual_seed(0)
    q = torch.randn(1, 40, 4, 16, dtype=torch.float64)
    k, v = torch.randn(1, 40, 2, 16, dtype=torch.float64), torch.randn(1, 40, 2, 16, dtype=torch.float64)
    sink = torch.randn(4, dtype=torch.float64) if sinks else None
    out = fn(*prepare({"q": q, "k": k, "v": v, "sink": sink}))
    # The sink correction runs in float32 (as on the GPU), the rest in float64.
    torch.testing.assert_close(out, reference(q, k, v, sink, window, causal), rtol=1e-5, atol=1e-5)
