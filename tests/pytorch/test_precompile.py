"""python -m primus_turbo.precompile: what it is asked to build (no compile runs here)."""

import subprocess
import sys
from pathlib import Path

import pytest

from primus_turbo import precompile
from primus_turbo.pytorch.core.backend import BackendType, GlobalBackendManager

REPO = Path(__file__).resolve().parents[2]


def test_gemm_shapes_on_the_default_backend_need_no_modules():
    jobs, notes = precompile.shape_jobs(["8192x8192x8192"], ["bf16"], None, autotune=False)
    assert jobs == []
    assert any("cuBLASLt" in n for n in notes)


def test_gemm_shapes_with_cutlass_forced_build_the_default_config_of_each_gemm():
    GlobalBackendManager.set_gemm_backend(BackendType.CUTLASS)
    jobs, _ = precompile.shape_jobs(["4096x1024x2048"], ["bf16"], None, autotune=False)
    assert sorted(jobs) == [("bf16", "bf16", layout, -1) for layout in ("AkBk", "AkBn", "AmBn")]


def test_gemm_shapes_with_autotune_build_the_candidates_only():
    jobs, _ = precompile.shape_jobs(["4096x1024x2048", "4096x1024x2048"], ["bf16"], ["bf16", "fp32"], autotune=True)
    layouts = {j[2] for j in jobs}
    assert layouts == {"AkBk", "AkBn", "AmBn"}
    assert {j[1] for j in jobs} == {"bf16", "fp32"}
    assert len(jobs) == len(set(jobs))  # a repeated shape adds nothing
    assert len(jobs) <= 2 * 3 * precompile.num_cutlass_configs()


def test_bad_shape_is_reported():
    with pytest.raises(SystemExit, match="MxNxK"):
        precompile.shape_jobs(["8192x8192"], ["bf16"], None, autotune=False)


def test_runs_from_the_repository_root():
    """The source tree on sys.path has no built library: the installed one is found."""
    out = subprocess.run(
        [sys.executable, "-m", "primus_turbo.precompile", "--gemm", "256x256x256"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "compiling 0 kernel modules" in out.stdout
