"""Operators: ``turbo.ops.*``."""

from primus_turbo.pytorch.ops.activation import geglu, geglu_with_probs, swiglu, swiglu_with_probs  # noqa: F401
from primus_turbo.pytorch.ops.attention import flash_attn_func, flash_attn_varlen_func  # noqa: F401
from primus_turbo.pytorch.ops.attention_fp8 import flash_attn_fp8_func, flash_attn_varlen_fp8_func  # noqa: F401
from primus_turbo.pytorch.ops.attention_usp import (  # noqa: F401
    flash_attn_fp8_usp_func,
    flash_attn_usp_func,
    flash_attn_varlen_usp_func,
)
from primus_turbo.pytorch.ops.gemm import gemm  # noqa: F401
from primus_turbo.pytorch.ops.grouped_gemm import grouped_gemm  # noqa: F401
from primus_turbo.pytorch.ops.moe_permute import (  # noqa: F401
    moe_permute,
    moe_unpermute,
    token_permute,
    token_unpermute,
)
from primus_turbo.pytorch.ops.normalization import layernorm, rmsnorm, rmsnorm_residual  # noqa: F401
from primus_turbo.pytorch.ops.rope import rope, rope_cos_sin  # noqa: F401
from primus_turbo.pytorch.ops.gemm_fp8 import gemm_fp8  # noqa: F401
from primus_turbo.pytorch.ops.moe_routing import (  # noqa: F401
    fused_group_topk_routing_with_aux_score,
    indices_to_multihot,
    tokens_per_expert_to_mask,
)
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_gemm_fp8  # noqa: F401
from primus_turbo.pytorch.ops.gemm_fp4 import gemm_fp4  # noqa: F401
from primus_turbo.pytorch.ops.grouped_gemm_fp4 import grouped_gemm_fp4  # noqa: F401
from primus_turbo.pytorch.ops.quantization import (  # noqa: F401
    dequantize_fp4,
    dequantize_fp8,
    quantize_fp4,
    quantize_fp4_with_trans,
    quantize_fp8,
    quantize_fp8_with_trans,
)
from primus_turbo.pytorch.ops.grouped_quantization import (  # noqa: F401
    grouped_dequantize_fp4,
    grouped_dequantize_fp8,
    grouped_quantize_fp4,
    grouped_quantize_fp4_with_trans,
    grouped_quantize_fp8,
    grouped_quantize_fp8_with_trans,
)
from primus_turbo.pytorch.ops.fused_fp8 import geglu_fp8, rmsnorm_fp8, rmsnorm_residual_fp8, swiglu_fp8  # noqa: F401
from primus_turbo.pytorch.ops.swiglu_mlp_fp8 import swiglu_mlp_fp8  # noqa: F401

__all__ = [
    "flash_attn_func",
    "flash_attn_fp8_func",
    "flash_attn_usp_func",
    "flash_attn_fp8_usp_func",
    "flash_attn_varlen_usp_func",
    "flash_attn_varlen_fp8_func",
    "flash_attn_varlen_func",
    "gemm",
    "grouped_gemm",
    "gemm_fp8",
    "rmsnorm",
    "rmsnorm_residual",
    "layernorm",
    "swiglu",
    "geglu",
    "swiglu_with_probs",
    "geglu_with_probs",
    "rope",
    "rope_cos_sin",
    "token_permute",
    "token_unpermute",
    "moe_permute",
    "moe_unpermute",
    "quantize_fp8",
    "quantize_fp8_with_trans",
    "dequantize_fp8",
    "quantize_fp4",
    "quantize_fp4_with_trans",
    "dequantize_fp4",
    "grouped_quantize_fp8",
    "grouped_quantize_fp8_with_trans",
    "grouped_dequantize_fp8",
    "grouped_quantize_fp4",
    "grouped_quantize_fp4_with_trans",
    "grouped_dequantize_fp4",
    "fused_group_topk_routing_with_aux_score",
    "indices_to_multihot",
    "tokens_per_expert_to_mask",
    "rmsnorm_fp8",
    "rmsnorm_residual_fp8",
    "swiglu_fp8",
    "swiglu_mlp_fp8",
    "geglu_fp8",
    "grouped_gemm_fp8",
    "gemm_fp4",
    "grouped_gemm_fp4",
]
