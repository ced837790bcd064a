"""Operators: ``turbo.ops.*``."""

from primus_turbo.pytorch.ops.gemm import gemm  # noqa: F401
from primus_turbo.pytorch.ops.gemm_fp8 import gemm_fp8  # noqa: F401
from primus_turbo.pytorch.ops.normalization import rmsnorm  # noqa: F401
from primus_turbo.pytorch.ops.quantization import (  # noqa: F401
    dequantize_fp4,
    dequantize_fp8,
    quantize_fp4,
    quantize_fp8,
    quantize_fp8_with_trans,
)

__all__ = [
    "gemm",
    "gemm_fp8",
    "rmsnorm",
    "quantize_fp8",
    "quantize_fp8_with_trans",
    "dequantize_fp8",
    "quantize_fp4",
    "dequantize_fp4",
]
