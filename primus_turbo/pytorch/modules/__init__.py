"""Modules: ``turbo.modules.*``."""

from primus_turbo.pytorch.modules.attention import TurboAttention  # noqa: F401
from primus_turbo.pytorch.modules.grouped_linear import GroupedLinear  # noqa: F401
from primus_turbo.pytorch.modules.float8_linear import Float8Linear  # noqa: F401
from primus_turbo.pytorch.modules.linear import Linear  # noqa: F401
from primus_turbo.pytorch.modules.normalization import LayerNorm, RMSNorm  # noqa: F401

__all__ = ["Float8Linear", "GroupedLinear", "Linear", "LayerNorm", "RMSNorm", "TurboAttention"]
