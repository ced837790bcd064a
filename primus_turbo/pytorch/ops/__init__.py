"""Operators: ``turbo.ops.*``."""

from primus_turbo.pytorch.ops.gemm import gemm  # noqa: F401
from primus_turbo.pytorch.ops.gemm_fp8 import gemm_fp8  # noqa: F401
from primus_turbo.pytorch.ops.normalization import rmsnorm  # noqa: F401

__all__ = ["gemm", "gemm_fp8", "rmsnorm"]
