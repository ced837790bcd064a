"""turbo.modules.Float8Linear: torch.nn.Linear with its three matmuls in FP8 (turbo.ops.gemm_fp8)."""


import torch
from torch import nn

from primus_turbo.pytorch.core.low_precision import Float8QuantConfig
from primus_turbo.pytorch.modules.linear import Linear
from primus_turbo.pytorch.ops.gemm_fp8 import gemm_fp8

__all__ = ["Float8Linear"]


class Float8Linear(Linear):
    """``y = x @ weight^T + bias`` where the forward, dgrad and wgrad GEMMs run in FP8.

    Parameters stay in their high-precision dtype (the master copy the optimizer updates); each
    step quantizes the input, the weight and the output gradient per ``config`` (default E4M3
    tensorwise). With BLOCKWISE the weight uses 128x128 blocks and activations 1x128. Works under
    ``torch.compile(fullgraph=True)``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        config: Float8QuantConfig | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if config is not None and not isinstance(config, Float8QuantConfig):
            raise TypeError(f"Float8Linear: config must be a Float8QuantConfig or None, got {type(config).__name__}")
        self.config = config if config is not None else Float8QuantConfig()

    @classmethod
    def from_float(cls, linear: nn.Linear, config: Float8QuantConfig | None = None) -> "Float8Linear":
        """A Float8Linear sharing ``linear``'s parameters (no copy)."""
        return super().from_float(linear, config=config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"Float8Linear: input's last dimension is {x.shape[-1]}; expected in_features={self.in_features}"
            )
        leading = x.shape[:-1]
        out = gemm_fp8(x.reshape(-1, self.in_features), self.weight, trans_b=True, config=self.config)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*leading, self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, config={self.config}"
