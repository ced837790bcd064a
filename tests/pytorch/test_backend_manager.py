"""Backend selection settings and the autotune cache, as users drive them (no GPU needed)."""

import subprocess
import sys

import pytest

from primus_turbo.pytorch.core.backend import BackendChoice, BackendType, GlobalBackendManager, PrecisionType


def test_amd_names_alias_their_nvidia_equivalents():
    assert BackendType.HIPBLASLT is BackendType.CUBLASLT
    assert BackendType.CK is BackendType.CUTLASS
    assert BackendType("hipblaslt") is BackendType.CUBLASLT
    assert BackendType.from_name(" cutlass ") is BackendType.CUTLASS


@pytest.mark.parametrize("name", ["AITER", "TRITON"])
def test_amd_only_names_are_rejected_with_explanation(name):
    with pytest.raises(ValueError, match="no equivalent on NVIDIA"):
        getattr(BackendType, name)


@pytest.mark.parametrize("name", ["CK", "aiter", "Triton", BackendType.CK, BackendType.CUTLASS])
def test_original_attention_backends_select_our_kernel(name):
    GlobalBackendManager.set_attn_backend(name)
    try:
        assert GlobalBackendManager.get_attn_backend("bf16").backend is BackendType.TURBO
    finally:
        GlobalBackendManager.reset()


def test_attention_environment_accepts_the_original_names(monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_ATTN_BACKEND", "fp8:CUDNN,other:AITER")
    assert GlobalBackendManager.get_attn_backend("bf16").backend is BackendType.TURBO
    assert GlobalBackendManager.get_attn_backend("fp8").backend is BackendType.CUDNN
    monkeypatch.setenv("PRIMUS_TURBO_GEMM_BACKEND", "AITER")  # no GEMM equivalent: still refused
    with pytest.raises(ValueError, match="no equivalent on NVIDIA"):
        GlobalBackendManager.get_gemm_backend("bf16")


def test_unknown_name_lists_choices():
    with pytest.raises(ValueError, match="choose one of CUBLASLT, CUTLASS"):
        BackendType.from_name("MAGIC")


def test_code_setting_per_precision_and_reset():
    GlobalBackendManager.set_gemm_backend(BackendType.CUTLASS, precision=PrecisionType.FP8)
    assert GlobalBackendManager.get_gemm_backend(PrecisionType.FP8) == BackendChoice(BackendType.CUTLASS)
    assert GlobalBackendManager.get_gemm_backend(PrecisionType.BF16_FP16_FP32) is None
    GlobalBackendManager.set_gemm_backend(BackendType.CUBLASLT)  # every precision
    assert GlobalBackendManager.get_gemm_backend("fp8").backend is BackendType.CUBLASLT
    GlobalBackendManager.set_gemm_backend(None)
    assert GlobalBackendManager.get_gemm_backend("fp8") is None
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.CK)
    GlobalBackendManager.reset()
    assert GlobalBackendManager.get_grouped_gemm_backend("bf16") is None


def test_environment_per_precision(monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_GEMM_BACKEND", "fp8:CUTLASS,bf16:HIPBLASLT")
    assert GlobalBackendManager.get_gemm_backend("fp8").backend is BackendType.CUTLASS
    assert GlobalBackendManager.get_gemm_backend("fp16").backend is BackendType.CUBLASLT
    assert GlobalBackendManager.get_gemm_backend("fp4") is None
    monkeypatch.setenv("PRIMUS_TURBO_GEMM_BACKEND", "fp8:CUTLASS,other:autotune")
    assert GlobalBackendManager.get_gemm_backend("bf16") == BackendChoice(None, True)


def test_code_beats_environment(monkeypatch):
    from primus_turbo.pytorch.core.backend import OpFamily, resolve

    monkeypatch.setenv("PRIMUS_TURBO_GEMM_BACKEND", "CUTLASS")
    assert resolve(OpFamily.GEMM, PrecisionType.BF16_FP16_FP32).backend is BackendType.CUTLASS
    GlobalBackendManager.set_gemm_backend(BackendType.CUBLASLT)
    assert resolve(OpFamily.GEMM, PrecisionType.BF16_FP16_FP32).backend is BackendType.CUBLASLT


def test_bad_environment_value_names_the_variable(monkeypatch):
    from primus_turbo.pytorch.core.backend import OpFamily, resolve

    monkeypatch.setenv("PRIMUS_TURBO_GEMM_BACKEND", "fp9:CUTLASS")
    with pytest.raises(ValueError, match="PRIMUS_TURBO_GEMM_BACKEND"):
        resolve(OpFamily.GEMM, PrecisionType.FP8)


def test_auto_tune_switch(monkeypatch):
    assert not GlobalBackendManager.auto_tune_enabled()
    monkeypatch.setenv("PRIMUS_TURBO_AUTO_TUNE", "1")
    assert GlobalBackendManager.auto_tune_enabled()
    GlobalBackendManager.set_auto_tune(False)  # code beats the environment
    assert not GlobalBackendManager.auto_tune_enabled()
    GlobalBackendManager.set_auto_tune(None)
    assert GlobalBackendManager.auto_tune_enabled()


def test_auto_tune_with_fixed_backend_is_rejected():
    with pytest.raises(ValueError, match="auto_tune=True needs backend=None"):
        GlobalBackendManager.set_gemm_backend(BackendType.CUTLASS, auto_tune=True)


def test_autotune_cache_persists_across_processes(tmp_path):
    cache = tmp_path / "cache.tsv"
    code = (
        "import sys, ctypes\n"
        "from primus_turbo._core import lib\n"
        "if sys.argv[1] == 'store':\n"
        "    assert lib.pt_autotune_store(b'GEMM|H100|1x2x3', b'CUTLASS:4') == 0\n"
        "else:\n"
        "    buf = ctypes.create_string_buffer(64)\n"
        "    assert lib.pt_autotune_lookup(b'GEMM|H100|1x2x3', buf, 64) == 1\n"
        "    print(buf.value.decode())\n"
    )
    env = {"PRIMUS_TURBO_AUTOTUNE_CACHE_FILE": str(cache), "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    subprocess.run([sys.executable, "-c", code, "store"], check=True, env=env, cwd=tmp_path)
    out = subprocess.run([sys.executable, "-c", code, "load"], check=True, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip() == "CUTLASS:4"
    # A damaged line is ignored, the good one survives.
    cache.write_text(cache.read_text() + "GEMM|H100|9x9x9\tCUTLASS:1\tdeadbeefdeadbeef\n")
    out = subprocess.run([sys.executable, "-c", code, "load"], check=True, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip() == "CUTLASS:4"


def test_backends_of_another_family_and_non_bool_flags_are_refused():
    from primus_turbo.pytorch.core.backend import BackendType, GlobalBackendManager

    try:
        with pytest.raises(ValueError, match="NCCL is not a GEMM backend"):
            GlobalBackendManager.set_gemm_backend(BackendType.NCCL)
        with pytest.raises(ValueError, match="CUBLASLT is not an attention backend"):
            GlobalBackendManager.set_attn_backend(BackendType.CUBLASLT)
        with pytest.raises(TypeError, match="auto_tune must be a bool"):
            GlobalBackendManager.set_gemm_backend(None, auto_tune="yes")
        with pytest.raises(TypeError, match="enabled must be a bool or None"):
            GlobalBackendManager.set_auto_tune("no")
        GlobalBackendManager.set_grouped_gemm_backend("HIPBLASLT")  # the original's name: accepted
    finally:
        GlobalBackendManager.reset()
