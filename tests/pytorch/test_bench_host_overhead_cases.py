"""The host-overhead benchmark's cases are well formed: each of its four calls per op (ours and
torch's, forward and forward+backward) runs once on meta tensors, so a changed signature breaks
here and not in the middle of a GPU run."""

import importlib.util
from pathlib import Path

import pytest

import primus_turbo.pytorch as turbo

_BENCH = Path(__file__).resolve().parents[2] / "benchmark" / "ops" / "bench_host_overhead.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_host_overhead", _BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cases():
    return _bench()._cases(turbo, dev="meta")


def test_every_case_runs_on_meta_tensors(cases):
    assert len(cases) >= 20
    for name, calls in cases.items():
        for which, fn in zip(("ours fwd", "torch fwd", "ours fwd+bwd", "torch fwd+bwd"), calls):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 -- say which call broke
                raise AssertionError(f"{name}: {which}: {type(e).__name__}: {e}") from e


def test_torch_fp8_baselines_build_on_meta_tensors():
    fp8 = _bench()._torch_fp8_cases(dev="meta")
    assert set(fp8) == {"gemm_fp8_tensorwise", "gemm_fp8_rowwise"}
    for name, fn in fp8.items():
        try:
            out = fn()
        except NotImplementedError as e:  # torch._scaled_mm without a meta kernel in this torch
            pytest.skip(f"{name}: {e}")
        assert out.shape == (256, 256), name


def test_interleaved_min_keeps_the_fastest_round_of_each(monkeypatch):
    bench = _bench()
    times = iter([5.0, 9.0, 4.0, 8.0, 6.0, 7.0])
    monkeypatch.setattr(bench.bu, "host_us_per_call", lambda fn, n, warmup: next(times))
    assert bench.interleaved_min(lambda: None, lambda: None, iters=30, warmup=1, rounds=3) == (4.0, 7.0)


def test_every_public_op_has_a_case():
    import re

    source = _BENCH.read_text()
    ops = [n for n in dir(turbo.ops) if not n.startswith("_") and callable(getattr(turbo.ops, n))]
    missing = [n for n in ops if not re.search(rf"turbo\.ops\.{n}\b", source)]
    assert not missing, f"turbo.ops functions without a host-cost case: {missing}"


def test_every_case_compiles_fullgraph_forward_and_backward(cases):
    # Every public op (through its case) as a real custom op: torch.compile(fullgraph=True) traces
    # it without a graph break, forward and (AOTAutograd's joint graph) backward, on meta tensors.
    import torch

    for name, (ours, *_) in cases.items():
        torch._dynamo.reset()
        try:
            out = torch.compile(ours, fullgraph=True, backend="aot_eager")()
            first = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(first, torch.Tensor) and first.requires_grad:
                first.float().sum().backward()
        except Exception as e:  # noqa: BLE001 -- say which op broke
            raise AssertionError(f"{name}: {type(e).__name__}: {str(e)[:500]}") from e
