"""Low-precision formats and quantization configurations (FP8 / FP4)."""

from dataclasses import dataclass
from enum import Enum
from typing import Optional

import torch

__all__ = [
    "Format",
    "ScalingGranularity",
    "ScaleDtype",
    "ScalingStrategy",
    "ScalingRecipe",
    "Float8QuantConfig",
    "Float4QuantConfig",
    "float8_e4m3",
    "float8_e5m2",
    "float4_e2m1fn_x2",
    "is_fp8_dtype",
]

# The torch dtypes the formats map to on NVIDIA GPUs (OCP FP8 "fn" variants).
float8_e4m3 = torch.float8_e4m3fn
float8_e5m2 = torch.float8_e5m2
float4_e2m1fn_x2 = getattr(torch, "float4_e2m1fn_x2", None)


class Format(Enum):
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    HYBRID = "hybrid"  # forward and wgrad E4M3, dgrad's output gradient E5M2
    E2M1_X2 = "e2m1_x2"  # FP4, two values per byte


class ScalingGranularity(Enum):
    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"
    BLOCKWISE = "blockwise"
    MX_BLOCKWISE = "mx_blockwise"


class ScaleDtype(Enum):
    FP32 = "fp32"
    E8M0 = "e8m0"


class ScalingStrategy(Enum):
    DYNAMIC = "dynamic"  # scales computed from the current tensor


@dataclass
class ScalingRecipe:
    """FP4 training recipe switches (arXiv 2509.25149)."""

    use_2d_block: bool = False  # 2-D (32x32) block scales, so a transposed weight reuses them
    use_sr: bool = False  # stochastic rounding (for gradients)
    use_rht: bool = False  # random Hadamard transform on the wgrad operands
    rowwise: bool = True
    colwise: bool = False
    # The original library's pre-shuffled scale / data layouts for its AMD kernels. Accepted so code
    # written against it constructs; the quantize ops here refuse True (no Hopper kernel reads them).
    shuffle_scale: bool = False
    shuffle_out: bool = False

    def __post_init__(self):
        for name in ("use_2d_block", "use_sr", "use_rht", "rowwise", "colwise", "shuffle_scale", "shuffle_out"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"ScalingRecipe: {name} must be a bool, got {getattr(self, name)!r}")


@dataclass
class Float8QuantConfig:
    """How an FP8 op quantizes and multiplies. ``fast_accum``: the forward GEMM (``out = a @ b``)
    may accumulate in the tensor cores' fast mode, without promoting its partial sums to FP32 every
    few K steps, as the forward GEMMs of torchao's and TransformerEngine's default recipes do; the
    dgrad and wgrad GEMMs always accumulate in full FP32. A permission, not a request: taken by the
    cuBLASLt GEMMs of TENSORWISE and ROWWISE on the native dense paths (``gemm_fp8``,
    ``Float8Linear``, ``swiglu_mlp_fp8``) and by the ROWWISE and TENSORWISE grouped GEMMs
    (``grouped_gemm_fp8``, ``GroupedLinear``: the row-scaled kernel, scales applied after the
    product); block-scaled GEMMs always promote, and so do the composed paths (QuantizedTensor
    operands without native copies, pre-quantized tuples, E5M2, the experimental FP8 grouped wgrad,
    and a cached ``GroupedLinear`` under ``torch.compile``)."""

    format: Format = Format.E4M3
    granularity: ScalingGranularity = ScalingGranularity.TENSORWISE
    strategy: ScalingStrategy = ScalingStrategy.DYNAMIC
    scale_dtype: ScaleDtype = ScaleDtype.FP32
    block_size: Optional[int] = None
    fast_accum: bool = False

    def __post_init__(self):
        if not isinstance(self.fast_accum, bool):
            raise TypeError(f"Float8QuantConfig: fast_accum must be a bool, got {self.fast_accum!r}")
        if not isinstance(self.format, Format) or self.format == Format.E2M1_X2:
            raise ValueError(f"Float8QuantConfig: format must be E4M3, E5M2 or HYBRID, got {self.format}")
        if not isinstance(self.granularity, ScalingGranularity):
            raise ValueError(f"Float8QuantConfig: unknown granularity {self.granularity!r}")
        if self.strategy != ScalingStrategy.DYNAMIC:
            raise ValueError(f"Float8QuantConfig: strategy {self.strategy} is not supported; expected DYNAMIC")
        g = self.granularity
        if self.block_size is not None and (isinstance(self.block_size, bool) or not isinstance(self.block_size, int)):
            raise TypeError(f"Float8QuantConfig: block_size must be an int or None, got {self.block_size!r}")
        if g == ScalingGranularity.BLOCKWISE:
            if self.block_size is None:
                raise ValueError("Float8QuantConfig: BLOCKWISE granularity needs block_size (e.g. 128)")
            if self.block_size <= 0 or self.block_size % 16:
                raise ValueError(f"Float8QuantConfig: block_size={self.block_size} must be a positive multiple of 16")
            if self.scale_dtype != ScaleDtype.FP32:
                raise ValueError("Float8QuantConfig: BLOCKWISE granularity uses FP32 scales")
        elif g == ScalingGranularity.MX_BLOCKWISE:
            if self.block_size != 32:
                raise ValueError(f"Float8QuantConfig: MX_BLOCKWISE needs block_size=32, got {self.block_size}")
            if self.scale_dtype != ScaleDtype.E8M0:
                raise ValueError("Float8QuantConfig: MX_BLOCKWISE needs scale_dtype=E8M0")
        else:
            if self.block_size is not None:
                raise ValueError(f"Float8QuantConfig: block_size is only meaningful for BLOCKWISE/MX_BLOCKWISE, not {g.name}")
            if self.scale_dtype != ScaleDtype.FP32:
                raise ValueError(f"Float8QuantConfig: {g.name} granularity uses FP32 scales")


@dataclass
class Float4QuantConfig:
    """MXFP4 configuration. ``use_gradient_sr``: stochastic rounding of the output gradient's
    quantization (None follows the recipe, see ``turbo.ops.gemm_fp4``; True/False overrides its
    ``use_sr``). ``use_preshuffle``: the original library's pre-shuffled weight layout for its AMD
    kernels; accepted for code written against it and without effect here, since the Hopper path
    restates every MXFP4 operand for the FP8 block-scaled kernel when it quantizes it."""

    format: Format = Format.E2M1_X2
    granularity: ScalingGranularity = ScalingGranularity.MX_BLOCKWISE
    strategy: ScalingStrategy = ScalingStrategy.DYNAMIC
    scale_dtype: ScaleDtype = ScaleDtype.E8M0
    block_size: int = 32
    # None -> ScalingRecipe(), set in __post_init__ (a default_factory cannot be traced by dynamo,
    # and a config is often built inside a compiled function).
    scaling_recipe: Optional[ScalingRecipe] = None
    scaling_recipe_for_trans: Optional[ScalingRecipe] = None
    use_gradient_sr: Optional[bool] = None
    use_preshuffle: bool = False

    def __post_init__(self):
        if self.use_gradient_sr is not None and not isinstance(self.use_gradient_sr, bool):
            raise ValueError(f"Float4QuantConfig: use_gradient_sr must be a bool or None, got {self.use_gradient_sr!r}")
        if not isinstance(self.use_preshuffle, bool):
            raise ValueError(f"Float4QuantConfig: use_preshuffle must be a bool, got {self.use_preshuffle!r}")
        if self.scaling_recipe is None:
            self.scaling_recipe = ScalingRecipe()
        for name in ("scaling_recipe", "scaling_recipe_for_trans"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, ScalingRecipe):
                raise TypeError(f"Float4QuantConfig: {name} must be a ScalingRecipe or None, got {value!r}")
        if self.strategy != ScalingStrategy.DYNAMIC:
            raise ValueError(f"Float4QuantConfig: strategy {self.strategy} is not supported; expected DYNAMIC")
        if self.format != Format.E2M1_X2:
            raise ValueError(f"Float4QuantConfig: format must be E2M1_X2, got {self.format}")
        if self.granularity != ScalingGranularity.MX_BLOCKWISE:
            raise ValueError(f"Float4QuantConfig: granularity must be MX_BLOCKWISE, got {self.granularity}")
        if self.scale_dtype != ScaleDtype.E8M0:
            raise ValueError(f"Float4QuantConfig: scale_dtype must be E8M0, got {self.scale_dtype}")
        if self.block_size != 32:
            raise ValueError(f"Float4QuantConfig: block_size must be 32, got {self.block_size}")


# Every torch FP8 storage dtype, the AMD "fnuz" variants included (code written for the original
# checks its own dtypes with this; none of them is FP4 or E8M0).
_FP8_DTYPES = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)


def is_fp8_dtype(dtype: torch.dtype) -> bool:
    """Whether dtype is an FP8 storage dtype (E4M3 or E5M2, either encoding)."""
    return dtype in _FP8_DTYPES
