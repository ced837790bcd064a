"""Operators: ``turbo.ops.*``."""

from primus_turbo.pytorch.ops.activation import geglu, geglu_with_probs, swiglu, swiglu_with_probs  # noqa: F401
from primus_turbo.pytorch.ops.gemm import gemm  # noqa: F401
from primus_turbo.pytorch.ops.normalization import layernorm, rmsnorm, rmsnorm_residual  # noqa: F401

__all__ = [
    "gemm",
    "rmsnorm",
    "rmsnorm_residual",
    "layernorm",
    "swiglu",
    "geglu",
    "swiglu_with_probs",
    "geglu_with_probs",
]
