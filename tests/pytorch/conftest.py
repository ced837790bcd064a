import pytest
import torch

from primus_turbo.pytorch.core.backend import GlobalBackendManager

HAS_GPU = torch.cuda.is_available()


# Test functions the fast tier leaves to the full sweep: long sweeps of shapes, autotune, large sizes.
_FULL_ONLY = ("large", "autotune", "sweep", "all_shapes", "group_counts")


def pytest_addoption(parser):
    parser.addoption(
        "--tier",
        choices=("fast", "full"),
        default="full",
        help="fast: every test function once (its first parametrization), long sweeps left out; "
        "full: everything (default)",
    )


def _fast_tier(items):
    """The first parametrization of every test function, without the full-only ones: every op
    family, forward and backward, compile and capture, in a few minutes."""
    seen, kept, dropped = set(), [], []
    for item in items:
        fn = getattr(item, "originalname", item.name)
        key = (item.nodeid.split("::", 1)[0], fn)
        if key in seen or any(word in fn for word in _FULL_ONLY):
            dropped.append(item)
            continue
        seen.add(key)
        kept.append(item)
    return kept, dropped


def pytest_collection_modifyitems(config, items):
    if config.getoption("--tier") == "fast":
        kept, dropped = _fast_tier(items)
        items[:] = kept
        config.hook.pytest_deselected(items=dropped)
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
