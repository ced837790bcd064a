"""Modules: ``turbo.modules.*``."""

from primus_turbo.pytorch.modules.linear import Linear  # noqa: F401
from primus_turbo.pytorch.modules.normalization import LayerNorm, RMSNorm  # noqa: F401

__all__ = ["Linear", "RMSNorm", "LayerNorm"]
