"""Modules: ``turbo.modules.*``."""

from primus_turbo.pytorch.modules.linear import Linear  # noqa: F401

__all__ = ["Linear"]
