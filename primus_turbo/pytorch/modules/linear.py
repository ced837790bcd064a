"""turbo.modules.Linear: a drop-in torch.nn.Linear whose matmuls run on turbo.ops.gemm."""

import math

import torch
from torch import nn

from primus_turbo.pytorch.ops.gemm import gemm

__all__ = ["Linear"]


def _check_input(name: str, x) -> None:
    """A Linear's input: a tensor of at least one dimension (named errors, not torch's)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: input must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError(f"{name}: input must have at least 1 dimension (the features), got a scalar")


class Linear(nn.Module):
    """``y = x @ weight^T + bias`` with ``weight`` of shape ``[out_features, in_features]``.

    Same parameters, initialization and numerics as ``torch.nn.Linear``; inputs may have any
    number of leading dimensions.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    @classmethod
    def from_float(cls, linear: nn.Module, **kwargs) -> "Linear":
        """A module of this class sharing ``linear``'s parameters (no copy: optimizer state, state
        dict and checkpoints stay valid). kwargs go to the constructor (e.g. Float8Linear's config)."""
        if not isinstance(linear, (nn.Linear, Linear)):
            raise TypeError(f"{cls.__name__}.from_float: expected an nn.Linear, got {type(linear).__name__}")
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                      dtype=linear.weight.dtype, **kwargs)
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_features
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        name = type(self).__name__
        _check_input(name, x)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{name}: input's last dimension is {x.shape[-1]}; expected in_features={self.in_features}")
        leading = x.shape[:-1]
        out = self._matmul(x.reshape(-1, self.in_features))
        if self.bias is not None:
            out = out + self.bias
        return out.view(*leading, self.out_features)

    def _matmul(self, x2d: torch.Tensor) -> torch.Tensor:
        """x2d [rows, in_features] @ weight^T (subclasses pick the GEMM)."""
        return gemm(x2d, self.weight, trans_b=True)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
