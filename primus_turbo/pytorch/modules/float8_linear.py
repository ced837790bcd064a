"""turbo.modules.Float8Linear: torch.nn.Linear with its three matmuls in FP8 (turbo.ops.gemm_fp8)."""

import torch
from torch import nn

from primus_turbo.pytorch.core.low_precision import Float8QuantConfig
from primus_turbo.pytorch.modules._weight_cache import QuantizedWeightCache
from primus_turbo.pytorch.modules.linear import Linear
from primus_turbo.pytorch.ops.gemm_fp8 import cached_weight_native_ok, gemm_fp8, gemm_fp8_cached_weight

__all__ = ["Float8Linear"]


class Float8Linear(QuantizedWeightCache, Linear):
    """``y = x @ weight^T + bias`` where the forward, dgrad and wgrad GEMMs run in FP8.

    Parameters stay in their high-precision dtype (the master copy the optimizer updates); each
    step quantizes the input, the weight and the output gradient per ``config`` (default E4M3
    tensorwise). With BLOCKWISE the weight uses 128x128 blocks and activations 1x128. Works under
    ``torch.compile(fullgraph=True)``.

    Quantized weights: ``weight`` may be a :class:`QuantizedTensor` (e.g. set by a trainer that
    quantizes once per step), used as it is. With ``cache_quantized_weight=True`` the layer keeps
    the weight's two FP8 copies (along K for the forward, along N for the dgrad; about the
    weight's size again in memory) and reuses them until the weight changes (its version counter
    moves, or any torch optimizer steps): with gradient accumulation or activation recomputation
    the weight is quantized once per step instead of once per forward. Code that changes the weight
    through ``weight.data`` outside a torch optimizer (which leaves the version counter as it was),
    or edits ``config`` in place, calls :meth:`invalidate_weight_cache`. Eager training only:
    under ``torch.compile``, CUDA-graph capture and ``torch.inference_mode`` the weight is
    quantized per call, and so is the weight of a layer whose ``in_features`` or
    ``out_features`` is not a multiple of 16 (FP8 rows are read 16 bytes at a time). Any number of
    input rows works either way.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        config: Float8QuantConfig | None = None,
        device=None,
        dtype=None,
        cache_quantized_weight: bool = False,
    ):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._init_fp8(config, cache_quantized_weight)

    def _init_fp8(self, config, cache_quantized_weight: bool) -> None:
        if config is not None and not isinstance(config, Float8QuantConfig):
            raise TypeError(f"Float8Linear: config must be a Float8QuantConfig or None, got {type(config).__name__}")
        self.config = config if config is not None else Float8QuantConfig()
        self._init_weight_cache(cache_quantized_weight)

    @classmethod
    def from_float(
        cls,
        linear: nn.Module,
        config: Float8QuantConfig | None = None,
        inplace: bool = True,
        cache_quantized_weight: bool = False,
    ) -> "Float8Linear":
        """``linear`` (an ``nn.Linear`` or ``turbo.modules.Linear``) as a Float8Linear: with
        ``inplace`` (the default, as the original library) the module itself changes class and is
        returned; otherwise a new module sharing its parameters (no copy)."""
        if not inplace:
            return super().from_float(linear, config=config, cache_quantized_weight=cache_quantized_weight)
        if not isinstance(linear, (nn.Linear, Linear)):
            raise TypeError(f"Float8Linear.from_float: expected an nn.Linear, got {type(linear).__name__}")
        if type(linear) not in (nn.Linear, Linear):  # a subclass's forward / a parametrization would be lost
            raise TypeError(
                f"Float8Linear.from_float: inplace=True converts an nn.Linear itself, not a "
                f"{type(linear).__name__} (a subclass or a parametrized layer); pass inplace=False"
            )
        linear.__class__ = cls
        linear._init_fp8(config, cache_quantized_weight)
        return linear

    def _weight_cache_applies(self) -> bool:
        # The FP8 copies are rows of 16 bytes: a layer with other feature counts quantizes per call
        # (padded inside gemm_fp8).
        return self.in_features % 16 == 0 and self.out_features % 16 == 0

    def _matmul(self, x2d: torch.Tensor) -> torch.Tensor:
        if self._weight_cached_now() and cached_weight_native_ok(x2d, self.weight, self.config):
            # One native call a direction, reading this step's copies.
            out = gemm_fp8_cached_weight(x2d, self.weight, *self._cached_copies(), self.config)
            if out is not None:
                return out
        return gemm_fp8(x2d, self.weight_operand(), trans_b=True, config=self.config)

    def extra_repr(self) -> str:
        cache = ", cache_quantized_weight=True" if getattr(self, "cache_quantized_weight", False) else ""
        return f"{super().extra_repr()}, config={self.config}{cache}"
