"""turbo.modules.RMSNorm and turbo.modules.LayerNorm: torch.nn's interfaces on turbo.ops.rmsnorm
and turbo.ops.layernorm."""

import numbers

import torch
from torch import nn

from primus_turbo.pytorch.ops.normalization import layernorm, rmsnorm

__all__ = ["RMSNorm", "LayerNorm"]


def _normalized_shape(normalized_shape, name: str) -> tuple:
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (normalized_shape,)
    try:
        shape = tuple(normalized_shape)
    except TypeError:
        shape = None
    if shape is None or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in shape):
        raise TypeError(f"{name}: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    shape = tuple(int(d) for d in shape)
    if not shape:
        raise ValueError(f"{name}: normalized_shape must name at least one dimension")
    if any(d < 1 for d in shape):
        raise ValueError(f"{name}: normalized_shape must be positive, got {shape}")
    return shape


def _check_dtype(dtype, name: str) -> None:
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{name}: argument 'dtype' must be a floating-point torch.dtype, got {dtype!r}")


def _flatten(x: torch.Tensor, shape: tuple, name: str):
    """x as [..., hidden] with the trailing normalized dimensions merged; checks they match."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: input must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: input has dtype {x.dtype}; expected float32, float16 or bfloat16")
    n = len(shape)
    if x.dim() < n or tuple(x.shape[-n:]) != shape:
        raise ValueError(f"{name}: input shape {tuple(x.shape)} does not end with normalized_shape {shape}")
    hidden = 1
    for d in shape:
        hidden *= d
    return x.reshape(*x.shape[: x.dim() - n], hidden), hidden


def _weight_for(w, x: torch.Tensor, hidden: int):
    """A [hidden] view of a parameter, in x's dtype unless it is float32 (which the kernels take)."""
    if w is None:
        return None
    w = w.reshape(hidden)
    return w if w.dtype in (x.dtype, torch.float32) else w.to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm over the trailing ``normalized_shape`` dimensions of the input.

    Like ``torch.nn.RMSNorm``: ``eps=None`` uses ``torch.finfo(x.dtype).eps``; ``weight`` has shape
    ``normalized_shape``. With ``zero_centered_gamma`` the weight is stored as ``gamma`` and applied
    as ``1 + gamma`` (initialized to zeros), which keeps weight decay pulling towards the identity.
    """

    def __init__(
        self,
        normalized_shape,
        eps=None,
        elementwise_affine: bool = True,
        zero_centered_gamma: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        _check_dtype(dtype, "RMSNorm")
        self.normalized_shape = _normalized_shape(normalized_shape, "RMSNorm")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.zero_centered_gamma = zero_centered_gamma
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            with torch.no_grad():
                self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, hidden = _flatten(x, self.normalized_shape, "RMSNorm")
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        if self.weight is None:
            gamma, zero_centered = torch.ones(hidden, dtype=x.dtype, device=x.device), False
        else:
            gamma, zero_centered = _weight_for(self.weight, x, hidden), self.zero_centered_gamma
        y = rmsnorm(x2, gamma, eps, zero_centered)
        return y.view(x.shape)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"zero_centered_gamma={self.zero_centered_gamma}"
        )


class LayerNorm(nn.Module):
    """LayerNorm over the trailing ``normalized_shape`` dimensions, with ``torch.nn.LayerNorm``'s
    interface and parameters (``weight`` ones, ``bias`` zeros; ``bias=False`` or
    ``elementwise_affine=False`` drop them)."""

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        _check_dtype(dtype, "LayerNorm")
        self.normalized_shape = _normalized_shape(normalized_shape, "LayerNorm")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            if bias:
                self.bias = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.weight is not None:
                self.weight.fill_(1.0)
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, hidden = _flatten(x, self.normalized_shape, "LayerNorm")
        gamma, beta = _weight_for(self.weight, x, hidden), _weight_for(self.bias, x, hidden)
        if gamma is not None and beta is not None and beta.dtype != gamma.dtype:
            beta = beta.to(gamma.dtype)
        return layernorm(x2, gamma, beta, self.eps).view(x.shape)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
