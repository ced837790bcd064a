"""turbo.modules.GroupedLinear: the expert layer of a mixture of experts on turbo.ops.grouped_gemm
(bf16/fp16) or, with an FP8 config, turbo.ops.grouped_gemm_fp8."""

import math
import operator
from typing import Optional

import torch
from torch import nn

from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity
from primus_turbo.pytorch.modules._weight_cache import QuantizedWeightCache
from primus_turbo.pytorch.ops.grouped_gemm import grouped_gemm
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import (
    cached_weight_native_ok,
    grouped_gemm_fp8,
    grouped_gemm_fp8_cached_weight,
    grouped_gemm_fp8_rows_cached,
)

__all__ = ["GroupedLinear"]


class GroupedLinear(QuantizedWeightCache, nn.Module):
    """``y[rows of g] = x[rows of g] @ weight[g]^T`` for ``group_num`` experts.

    ``weight`` is ``[group_num, out_features, in_features]`` (each expert laid out like
    ``torch.nn.Linear.weight``, initialized the same way). ``x`` is ``[tokens, in_features]`` with
    the tokens sorted by expert; ``group_lens`` (int64, on x's device) holds each expert's count.

    ``config``: a :class:`Float8QuantConfig` runs the three GEMMs per expert in FP8
    (``turbo.ops.grouped_gemm_fp8``; the weight stays in its high-precision dtype as the master
    copy). With ``cache_quantized_weight=True`` the layer keeps the weight's two FP8 copies (about
    the weight's size again in memory) and reuses them until the weight changes (its version
    counter moves, or any torch optimizer steps): with gradient accumulation or activation
    recomputation the experts' weights are quantized once per step instead of once per forward.
    Code that changes the weight through ``weight.data`` outside a torch optimizer calls
    :meth:`invalidate_weight_cache`. Eager training only: under ``torch.compile``, CUDA-graph
    capture and ``torch.inference_mode`` the weight is quantized per call, and so is a BLOCKWISE
    stack whose experts are not whole 128-row blocks (``out_features % 128``: the cached form keeps
    128 x 128 blocks inside one expert).
    """

    def __init__(
        self,
        group_num: int,
        in_features: int,
        out_features: int,
        device=None,
        dtype=None,
        config: Optional[Float8QuantConfig] = None,
        cache_quantized_weight: bool = False,
    ):
        super().__init__()
        if config is not None and not isinstance(config, Float8QuantConfig):
            raise TypeError(f"GroupedLinear: config must be a Float8QuantConfig or None, got {type(config).__name__}")
        if cache_quantized_weight and config is None:
            raise ValueError("GroupedLinear: cache_quantized_weight needs an FP8 config (the bf16 layer has no copy)")
        self.config = config
        self._init_weight_cache(cache_quantized_weight)
        sizes = {}
        for name, value in (("group_num", group_num), ("in_features", in_features), ("out_features", out_features)):
            try:
                if isinstance(value, bool):
                    raise TypeError
                sizes[name] = operator.index(value)  # ints, numpy and torch integers; never floats
            except TypeError:
                raise TypeError(f"GroupedLinear: {name} must be an int, got {value!r}") from None
        group_num, in_features, out_features = sizes["group_num"], sizes["in_features"], sizes["out_features"]
        if group_num < 1:
            raise ValueError(f"GroupedLinear: group_num must be at least 1, got {group_num}")
        if in_features < 0 or out_features < 0:
            raise ValueError(f"GroupedLinear: in_features and out_features must be >= 0, got {in_features}, {out_features}")
        self.group_num = group_num
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty((group_num, out_features, in_features), device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in self.weight.data:  # per expert, as torch.nn.Linear initializes its weight
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))

    def forward(
        self, x: torch.Tensor, group_lens: torch.Tensor, group_offs: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"GroupedLinear: input must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"GroupedLinear: input has shape {tuple(x.shape)}; expected [tokens, in_features={self.in_features}]"
            )
        if self.config is None:
            return grouped_gemm(x, self.weight, group_lens, group_offs, trans_b=True)
        if self._weight_cached_now() and cached_weight_native_ok(x, self.weight, self.config):
            # One native call a direction; the copies' kernel layouts are made once a step (ROWWISE:
            # both in one native pass, already in the kernels' form).
            rows = self._rows_copies()
            if rows is not None:
                return grouped_gemm_fp8_rows_cached(x, self.weight, *rows, group_lens, group_offs, self.config)
            data, data_t = self._cached_copies()
            return grouped_gemm_fp8_cached_weight(x, self.weight, data, data_t, group_lens, group_offs, self.config)
        return grouped_gemm_fp8(x, self.weight_operand(), group_lens, group_offs, trans_b=True, config=self.config)

    def _weight_cache_applies(self) -> bool:
        # BLOCKWISE: an expert's 128 x 128 weight blocks may not reach into the next expert, so a
        # stack whose experts are not whole 128-row blocks is quantized per call (as without the cache).
        g = self.config.granularity if self.config is not None else None
        return g != ScalingGranularity.BLOCKWISE or self.weight.shape[1] % 128 == 0

    def extra_repr(self) -> str:
        extra = f", config={self.config}" if self.config is not None else ""
        if self.cache_quantized_weight:
            extra += ", cache_quantized_weight=True"
        return f"group_num={self.group_num}, in_features={self.in_features}, out_features={self.out_features}{extra}"
