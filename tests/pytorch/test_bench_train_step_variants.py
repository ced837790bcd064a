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


def test_shared_kernel_ratio(bench):
    base = {"gemm_a": 10.0, "attn": 5.0, "elementwise": 3.0}
    ours = {"gemm_a": 10.6, "attn": 5.3, "our_norm": 1.0}  # the shared ones 6% slower
    assert bench.shared_kernel_ratio(ours, base) == pytest.approx(15.9 / 15.0)
    assert bench.shared_kernel_ratio({"only_ours": 1.0}, base) != bench.shared_kernel_ratio({"only_ours": 1.0}, base)
