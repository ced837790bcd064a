"""Operators: ``turbo.ops.*``."""

from primus_turbo.pytorch.ops.gemm import gemm  # noqa: F401
from primus_turbo.pytorch.ops.grouped_gemm import grouped_gemm  # noqa: F401
from primus_turbo.pytorch.ops.normalization import rmsnorm  # noqa: F401

__all__ = ["gemm", "grouped_gemm", "rmsnorm"]
