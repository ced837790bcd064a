import pytest
import torch

from primus_turbo.pytorch.core.backend import GlobalBackendManager

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def clean_backend_settings(monkeypatch, tmp_path):
    """Every test starts from default settings and a private autotune cache file."""
    for var in (
        "PRIMUS_TURBO_GEMM_BACKEND",
        "PRIMUS_TURBO_GROUPED_GEMM_BACKEND",
        "PRIMUS_TURBO_ATTN_BACKEND",
        "PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND",
        "PRIMUS_TURBO_AUTO_TUNE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PRIMUS_TURBO_AUTOTUNE_CACHE_FILE", str(tmp_path / "autotune.tsv"))
    GlobalBackendManager.reset()
    yield
    GlobalBackendManager.reset()
