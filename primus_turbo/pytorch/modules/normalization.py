"""turbo.modules.RMSNorm: torch.nn.RMSNorm's interface on turbo.ops.rmsnorm."""

import numbers

import torch
from torch import nn

from primus_turbo.pytorch.ops.normalization import rmsnorm

__all__ = ["RMSNorm"]


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
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        if not self.normalized_shape:
            raise ValueError("RMSNorm: normalized_shape must name at least one dimension")
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
        n = len(self.normalized_shape)
        if tuple(x.shape[-n:]) != self.normalized_shape or x.dim() < n:
            raise ValueError(
                f"RMSNorm: input shape {tuple(x.shape)} does not end with normalized_shape {self.normalized_shape}"
            )
        hidden = 1
        for d in self.normalized_shape:
            hidden *= d
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        if self.weight is None:
            gamma, zero_centered = torch.ones(hidden, dtype=x.dtype, device=x.device), False
        else:
            gamma, zero_centered = self.weight.reshape(hidden), self.zero_centered_gamma
            if gamma.dtype not in (x.dtype, torch.float32):
                gamma = gamma.to(x.dtype)
        y = rmsnorm(x.reshape(*x.shape[: x.dim() - n], hidden), gamma, eps, zero_centered)
        return y.view(x.shape)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"zero_centered_gamma={self.zero_centered_gamma}"
        )
