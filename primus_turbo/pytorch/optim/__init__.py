"""Optimizers of Primus-Turbo: ``turbo.optim.FusedAdamW``."""

from primus_turbo.pytorch.optim.fused_adamw import FusedAdamW

__all__ = ["FusedAdamW"]
