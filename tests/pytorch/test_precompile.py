"""python -m primus_turbo.precompile: what it is asked to build (no compile runs here)."""

import os
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
    assert sorted(jobs) == sorted(("bf16", "bf16", layout, c) for layout in ("AkBk", "AkBn", "AmBn") for c in (0, 3))


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


def test_default_modules_cover_every_family_and_name_unknown_ones():
    jobs = precompile.default_jobs()
    kinds = {job[0] for job in jobs}
    assert {"prepare", "gemm_fp8", "grouped_gemm", "grouped_gemm_fp8"} <= kinds
    labels = " ".join(job[1] for job in jobs if job[0] == "prepare")
    for word in ("rmsnorm", "layernorm", "gated act", "rope", "attention", "quantize", "moe routing", "moe permute",
                 "rmsnorm_fp8", "fused adamw"):
        assert word in labels
    assert len(jobs) == len(set(jobs))
    assert precompile.default_jobs(["rope"]) and all(j[0] == "prepare" for j in precompile.default_jobs(["rope"]))
    with pytest.raises(SystemExit, match="unknown default families"):
        precompile.default_jobs(["flash"])


@pytest.mark.compile_check
def test_prebuilt_folder_is_loaded_without_compiling(tmp_path):
    """What PRIMUS_TURBO_PREBUILD does at install, on one family: build into a folder, then a process
    with an empty cache loads from it instead of compiling."""
    env = dict(os.environ, PYTHONPATH="")
    build = subprocess.run(
        [sys.executable, "-P", "-m", "primus_turbo.precompile", "--defaults", "rope", "--cache-dir", str(tmp_path / "pb")],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert not list((tmp_path / "pb" / "jit").glob(".lock-*"))
    probe = (
        "import ctypes\n"
        "from primus_turbo._core.lib import lib, check\n"
        "check(lib.pt_rope_prepare(2, 1, 0, 1))\n"
        "c, l = ctypes.c_int64(), ctypes.c_int64()\n"
        "check(lib.pt_jit_stats(ctypes.byref(c), ctypes.byref(l)))\n"
        "print(c.value, l.value)\n"
    )
    env.update(PRIMUS_TURBO_CACHE_DIR=str(tmp_path / "empty"), PRIMUS_TURBO_PREBUILT_DIR=str(tmp_path / "pb" / "jit"))
    out = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]  # compiled none, loaded one
