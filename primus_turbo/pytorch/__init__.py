"""PyTorch API of Primus-Turbo: ``import primus_turbo.pytorch as turbo``."""

from primus_turbo.pytorch import modules, ops, optim  # noqa: F401
from primus_turbo.pytorch.convert import convert_model  # noqa: F401
from primus_turbo.pytorch.core.low_precision import (  # noqa: F401
    float4_e2m1fn_x2,
    float8_e4m3,
    float8_e5m2,
)

__all__ = ["ops", "modules", "optim", "convert_model", "float8_e4m3", "float8_e5m2", "float4_e2m1fn_x2"]
