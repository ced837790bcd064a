"""Operators: ``turbo.ops.*``."""

from primus_turbo.pytorch.ops.gemm import gemm  # noqa: F401
from primus_turbo.pytorch.ops.normalization import rmsnorm  # noqa: F401
from primus_turbo.pytorch.ops.moe_permute import token_permute, token_unpermute  # noqa: F401
from primus_turbo.pytorch.ops.rope import rope, rope_cos_sin  # noqa: F401

__all__ = ["gemm", "rmsnorm", "rope", "rope_cos_sin", "token_permute", "token_unpermute"]
