"""Core types: low-precision configurations (``low_precision``), pre-quantized tensors
(``quantized_tensor``), backend settings, autotune and the native-op loader."""

from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor, QuantizedTensorPair  # noqa: F401

__all__ = ["QuantizedTensor", "QuantizedTensorPair"]
