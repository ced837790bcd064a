"""turbo.ops.gemm_fp4: bf16/fp16 in -> MXFP4 (E2M1 + E8M0 per 32) -> GEMM -> out_dtype, forward
and backward, with the FP4 training recipe of arXiv 2509.25149.

Hopper has no FP4 tensor cores: this is an emulation. Each MXFP4 operand is expanded to E4M3
(every E2M1 value is exact there) with its four per-32 E8M0 scales of a 128-deep K block restated
as one power of two, and the 1x128 x 1x128 block-scaled FP8 GEMM runs (see ``_mx_blocks`` and
docs/ARCHITECTURE.md). The numerics are those of MXFP4 (the GEMM reproduces the product of the
dequantized FP4 operands up to FP32 accumulation); the speed is that of FP8 plus the expansion,
so it is slower than the FP8 GEMM, not faster.

The recipe, by operand role (``op(a)`` ``[M, K]``, ``op(b)`` ``[K, N]``, ``b`` the weight)::

    forward  out     = op(a)   along K, 1-D       x op(b)^T along K, 32x32 2-D blocks
    dgrad    d op(a) = grad    along N, SR        x op(b)   along N, the same 32x32 blocks
    wgrad    d op(b) = op(a)^T along M, RHT       x grad^T  along M, RHT + SR

2-D weight blocks make the weight's two copies share scales (the backward multiplies by the same
quantized weight as the forward); the random Hadamard transform (16-point, fixed signs, applied
to both wgrad operands along the reduction dim, so it cancels in the product) spreads outliers
before the 32-element scaling; stochastic rounding makes the gradient quantization unbiased.
"""

import dataclasses
import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.core.low_precision import Float4QuantConfig, ScalingGranularity, ScalingRecipe
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor
from primus_turbo.pytorch.ops import _mx_blocks
from primus_turbo.pytorch.ops import _quantized_operands as _qo
from primus_turbo.pytorch.ops._checks import check_cuda_tensors, flag
from primus_turbo.pytorch.ops.gemm_fp8 import BLOCK_1x128, check_hp_operands, dgrad_operands, fp8_mm, wgrad_operands
from primus_turbo.pytorch.ops.quantization import quantize_fp4_unpadded

__all__ = ["gemm_fp4", "FP4_TRAINING_RECIPE"]

_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_E8M0 = getattr(torch, "float8_e8m0fnu", torch.uint8)
_MX = ScalingGranularity.MX_BLOCKWISE

# The recipe gemm_fp4 applies unless the config selects another (see gemm_fp4).
FP4_TRAINING_RECIPE = ScalingRecipe(use_2d_block=True, use_sr=True, use_rht=True)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Built once: torch.compile does not trace dataclass construction.
_RECIPES = {
    (d, r, s): ScalingRecipe(use_2d_block=d, use_rht=r, use_sr=s)
    for d in (False, True) for r in (False, True) for s in (False, True)
}
_DEFAULT_CONFIG = Float4QuantConfig()


_FIXED_SEED = 0x5EED
_sr_calls = [0]


def _seed(sr: bool) -> int:
    """A new stochastic-rounding seed per eager call; a constant inside a compiled graph (the seed
    is a scalar argument of the quantize op, fixed when traced)."""
    if not sr:
        return 0
    if torch.compiler.is_compiling():
        return _FIXED_SEED
    _sr_calls[0] += 1
    return _sr_calls[0]


def _q(x, axis, two_d=False, rht=False, sr=False):
    """x quantized to MXFP4 along `axis` (0: stored transposed), as packed q and E8M0 scales."""
    recipe = _RECIPES[(two_d, rht, sr)]
    return quantize_fp4_unpadded(x, granularity=_MX, axis=axis, scaling_recipe=recipe, seed=_seed(sr))


def fp4_mm(qa, sa, qb, sb, out_dtype) -> torch.Tensor:
    """out[R, C] = A [R, K] @ B [C, K]^T for K-major MXFP4 operands (packed q [rows, K/2], E8M0
    scales [rows, ceil(K/32)] or 2-D [ceil(rows/32), ceil(K/32)])."""
    a8, a_s = _mx_blocks.mx_fp4_to_1x128(qa, sa)
    b8, b_s = _mx_blocks.mx_fp4_to_1x128(qb, sb)
    return fp8_mm(a8, a_s, BLOCK_1x128, b8, b_s, BLOCK_1x128, out_dtype)


def _axis(dim: int) -> int:
    """quantize_fp4's axis for a reduction over dim ``dim`` of a 2-D tensor as stored."""
    return -1 if dim == 1 else 0


def _fp4_read(name: str, src: QuantizedTensor, dim: int, rht: bool):
    """``(q, scale_inv)`` of an FP4 QuantizedTensor read over its dim ``dim`` with the Hadamard
    setting ``rht`` (the transform must be on both operands of a GEMM or on neither), or None when
    it was quantized otherwise."""
    if not _mx_blocks.is_fp4(src.qdata) or src.qdata.dim() != 2:
        raise TypeError(f"gemm_fp4: pre-quantized '{name}' must be a 2-D FP4 QuantizedTensor, got {src!r}")
    if src.is_grouped_tensor and src.quantized_axis == 0:
        raise ValueError(f"gemm_fp4: pre-quantized '{name}' is a padded per-group copy; pass grouped tokens to "
                         "grouped_gemm_fp4")
    src_rht = bool(src.scaling_recipe is not None and src.scaling_recipe.use_rht)
    return (src.qdata, src.scale_inv) if src.quantized_axis == dim and src_rht == rht else None


def _fp4_copy(name: str, x, x_t, dim: int, forward: bool, two_d=False, rht=False, sr=False):
    """``(q, scale_inv)`` of operand ``name`` reduced over its dim ``dim``: quantized here from a
    high-precision tensor, or read from a QuantizedTensor (``_fp4_read``; for the backward the
    pair's other copy ``x_t`` first). A backward copy no QuantizedTensor provides is quantized
    from the dequantized values; a forward one raises."""
    if not isinstance(x, QuantizedTensor):
        return _q(x, _axis(dim), two_d=two_d, rht=rht, sr=sr)
    if not forward:
        return _qo.backward_copy(x, x_t, lambda src: _fp4_read(name, src, dim, rht),
                                 lambda src: _q(src.dequantize(), _axis(dim), two_d=two_d, rht=rht, sr=sr))
    got = _fp4_read(name, x, dim, rht)
    if got is None:
        raise ValueError(
            f"gemm_fp4: pre-quantized '{name}' is quantized along dim {x.quantized_axis}"
            f"{' with the Hadamard transform' if rht != bool(x.scaling_recipe and x.scaling_recipe.use_rht) else ''}; "
            f"the forward GEMM reads it along its dim {dim} (K)"
        )
    return got


class GemmFp4Function(torch.autograd.Function):
    """op(a) @ op(b) in MXFP4; either operand a high-precision tensor (quantized here per the
    recipe) or a QuantizedTensor (``a_t`` / ``b_t``: the copies its backward GEMM reads)."""

    @staticmethod
    def forward(ctx, a, b, a_t, b_t, trans_a: bool, trans_b: bool, out_dtype, two_d: bool, rht: bool, sr: bool):
        # Forward operands, both along K: op(a) [M, K/2] and op(b)^T [N, K/2].
        qa, sa = _fp4_copy("a", a, None, 0 if trans_a else 1, True)
        qb, sb = _fp4_copy("b", b, None, 1 if trans_b else 0, True, two_d=two_d)
        out = fp4_mm(qa, sa, qb, sb, out_dtype)
        ctx.trans_a, ctx.trans_b, ctx.rht, ctx.sr = trans_a, trans_b, rht, sr
        ctx.a_dtype, ctx.b_dtype = a.dtype, b.dtype
        # Backward copies: op(b) [K, N/2] along N (dgrad), op(a)^T [K, M/2] along M (wgrad).
        none = qa.new_empty(0)
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        qbn, sbn = _fp4_copy("b", b, b_t, 0 if trans_b else 1, False, two_d=two_d) if need_a else (none, none)
        qam, sam = _fp4_copy("a", a, a_t, 1 if trans_a else 0, False, rht=rht) if need_b else (none, none)
        ctx.save_for_backward(qbn, sbn, qam, sam)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qbn, sbn, qam, sam = ctx.saved_tensors
        g = grad_out.contiguous()
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            # d op(a) [M, K] = grad [M, N] @ op(b) [K, N]^T, both along N.
            qg, sg = _q(g, -1, sr=ctx.sr)
            x, y = dgrad_operands(ctx.trans_a, (qg, sg), (qbn, sbn))
            grad_a = fp4_mm(*x, *y, ctx.a_dtype)
        if ctx.needs_input_grad[1]:
            # d op(b) [K, N] = op(a)^T [K, M] @ grad^T [N, M]^T, both along M.
            qgm, sgm = _q(g, 0, rht=ctx.rht, sr=ctx.sr)
            x, y = wgrad_operands(ctx.trans_b, (qam, sam), (qgm, sgm))
            grad_b = fp4_mm(*x, *y, ctx.b_dtype)
        return grad_a, grad_b, None, None, None, None, None, None, None, None


def _native_fwd_fake(a, b, trans_a, trans_b, out_dtype, two_d, rht, need_a, need_b):
    out_dtype, m, k, n = check_hp_operands(
        "gemm_fp4", a, b, trans_a, trans_b, out_dtype, "expanded FP8 rows are read 16 bytes at a time",
        "its transposed operands have rows of length M and N; the Hadamard transform works on groups of 16 along M",
    )
    none = (library.placeholder(a), library.placeholder(a))
    u8 = dict(dtype=torch.uint8)
    qbn, sbn = ((a.new_empty((k, n // 2), **u8), a.new_empty((_cdiv(k, 32) if two_d else k, _cdiv(n, 32)), **u8))
                if need_a else none)
    qam, sam = (a.new_empty((k, m // 2), **u8), a.new_empty((k, _cdiv(m, 32)), **u8)) if need_b else none
    return a.new_empty((m, n), dtype=out_dtype), qbn, sbn, qam, sam


def _native_bwd_fake(grad_out, qbn, sbn, qam, sam, trans_a, trans_b, rht, sr, seed_dgrad, seed_wgrad, a_dtype,
                     b_dtype, need_a, need_b):
    m, n, none = grad_out.shape[0], grad_out.shape[1], library.placeholder(grad_out)
    k_a, k_b = qbn.shape[0], qam.shape[0]
    grad_a = grad_out.new_empty((k_a, m) if trans_a else (m, k_a), dtype=a_dtype) if need_a else none
    grad_b = grad_out.new_empty((n, k_b) if trans_b else (k_b, n), dtype=b_dtype) if need_b else none
    return grad_a, grad_b


# Native ops (csrc/bindings/torch/gemm_fp4_ops.cpp): quantization, restatement and GEMM per direction.
library.register_fake("gemm_fp4_fwd", _native_fwd_fake)
library.register_fake("gemm_fp4_bwd", _native_bwd_fake)
_native_fwd = native.ops.gemm_fp4_fwd.default
_native_bwd = native.ops.gemm_fp4_bwd.default


class NativeGemmFp4Function(torch.autograd.Function):
    """GemmFp4Function's math on high-precision operands with each direction one native call."""

    @staticmethod
    def forward(ctx, a, b, trans_a: bool, trans_b: bool, out_dtype, two_d: bool, rht: bool, sr: bool):
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        out, qbn, sbn, qam, sam = _native_fwd(a, b, trans_a, trans_b, out_dtype, two_d, rht, need_a, need_b)
        ctx.save_for_backward(qbn, sbn, qam, sam)
        ctx.args = (trans_a, trans_b, rht, sr)
        ctx.a_dtype, ctx.b_dtype = a.dtype, b.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        sr = ctx.args[3]
        seeds = (_seed(sr and need_a), _seed(sr and need_b))
        grad_a, grad_b = _native_bwd(grad_out, *ctx.saved_tensors, *ctx.args, *seeds, ctx.a_dtype, ctx.b_dtype,
                                     need_a, need_b)
        return grad_a if need_a else None, grad_b if need_b else None, None, None, None, None, None, None


def _check_config(config, op: str = "gemm_fp4") -> Float4QuantConfig:
    if config is None:
        return _DEFAULT_CONFIG
    if not isinstance(config, Float4QuantConfig):
        raise TypeError(f"{op}: config must be a Float4QuantConfig or None, got {type(config).__name__}")
    for name in ("scaling_recipe", "scaling_recipe_for_trans"):
        r = getattr(config, name)
        if r is not None and not isinstance(r, ScalingRecipe):
            raise TypeError(f"{op}: config.{name} must be a ScalingRecipe, got {type(r).__name__}")
    return config


def recipe_of(config: Float4QuantConfig) -> ScalingRecipe:
    """The recipe switches gemm_fp4 applies for a config (see gemm_fp4's docstring); a set
    ``config.use_gradient_sr`` overrides the recipe's stochastic rounding of the gradient."""
    if config.scaling_recipe_for_trans is not None:
        recipe = config.scaling_recipe_for_trans
    elif config.scaling_recipe is not None and (
        config.scaling_recipe.use_2d_block or config.scaling_recipe.use_rht or config.scaling_recipe.use_sr
    ):
        recipe = config.scaling_recipe
    else:
        recipe = FP4_TRAINING_RECIPE
    sr = getattr(config, "use_gradient_sr", None)
    if sr is None or sr == recipe.use_sr:
        return recipe
    return dataclasses.replace(recipe, use_sr=sr)


def _prequantized(x, name: str, trans: bool, must_trans: bool):
    if len(x) != 2:
        raise TypeError(f"gemm_fp4: pre-quantized '{name}' must be a pair (q, scale_inv), got {len(x)} items")
    q, s = x
    if not isinstance(q, torch.Tensor) or not _mx_blocks.is_fp4(q) or q.dim() != 2:
        raise TypeError(
            f"gemm_fp4: pre-quantized '{name}' must be (q, scale_inv) with q a 2-D packed FP4 tensor "
            "(torch.float4_e2m1fn_x2 or uint8), as quantize_fp4 returns it"
        )
    if bool(trans) != must_trans:
        raise ValueError(
            f"gemm_fp4: a pre-quantized '{name}' must be stored K-major (trans_{name}={must_trans}): quantize "
            f"op({name}) along K"
        )
    if not isinstance(s, torch.Tensor) or s.dtype not in (_E8M0, torch.uint8):
        raise TypeError(f"gemm_fp4: pre-quantized '{name}' scale_inv must be an E8M0 tensor (torch.float8_e8m0fnu)")
    rows, k = q.shape[0], 2 * q.shape[1]
    kb = _cdiv(k, 32)
    if s.dim() != 2 or s.shape[1] != kb or s.shape[0] not in (rows, _cdiv(rows, 32)):
        raise ValueError(
            f"gemm_fp4: pre-quantized '{name}' scale_inv has shape {tuple(s.shape)}; expected {[rows, kb]} "
            f"(or {[_cdiv(rows, 32), kb]} for 32x32 blocks) for q of shape {tuple(q.shape)}"
        )
    return q.contiguous(), s.contiguous(), k


def _forward_prequantized(a, b, trans_a, trans_b, out_dtype):
    qa, sa, ka = _prequantized(a, "a", trans_a, False)
    qb, sb, kb = _prequantized(b, "b", trans_b, True)
    if ka != kb:
        raise ValueError(f"gemm_fp4: inner dimensions do not match: a holds K={ka}, b holds K={kb}")
    if ka % 16:
        raise ValueError(f"gemm_fp4: K={ka} must be a multiple of 16 (expanded FP8 rows are read 16 bytes at a time)")
    if out_dtype is None:
        raise ValueError("gemm_fp4: out_dtype is required when 'a' is pre-quantized")
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"gemm_fp4: out_dtype {out_dtype} is not supported; expected float32, float16 or bfloat16")
    check_cuda_tensors("gemm_fp4", a=qa, b=qb, a_scale_inv=sa, b_scale_inv=sb)
    return fp4_mm(qa, sa, qb, sb, out_dtype)


Operand = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


@native.raises_python_errors
def gemm_fp4(
    a: Operand,
    b: Operand,
    trans_a: bool = False,
    trans_b: bool = False,
    out_dtype: torch.dtype | None = None,
    config: Float4QuantConfig | None = None,
) -> torch.Tensor:
    """``op(a) @ op(b)`` in MXFP4 (E2M1 values, one E8M0 scale per 32 along K), written as
    ``out_dtype`` (default ``a.dtype``); differentiable, with the FP4 training recipe of
    arXiv 2509.25149 (see the module docstring). Emulated on Hopper through the FP8 tensor cores:
    MXFP4 accuracy, FP8 speed minus the expansion (docs/ARCHITECTURE.md).

    Args:
        a: activation ``[M, K]`` (``[K, M]`` with ``trans_a``), float16/bfloat16/float32, CUDA.
        b: weight ``[K, N]`` (``[N, K]`` with ``trans_b``), same dtype as ``a``.
        config: :class:`Float4QuantConfig` (MX_BLOCKWISE, E8M0, block_size 32). The recipe's
            switches (``use_2d_block``: 32x32 weight blocks; ``use_rht``: Hadamard transform of the
            wgrad operands; ``use_sr``: stochastic rounding of the output gradient) are read from
            ``config.scaling_recipe_for_trans`` when given, else from ``config.scaling_recipe`` when
            it sets any of them, else :data:`FP4_TRAINING_RECIPE` (all three on). Pass
            ``scaling_recipe_for_trans=ScalingRecipe()`` for plain MXFP4. Stochastic rounding draws a
            new seed per eager call; under torch.compile or CUDA-graph capture the seed is fixed at
            trace / capture time.

    QuantizedTensor operands (forward and backward): an FP4 :class:`QuantizedTensor` quantized along
    its GEMM's K (``quantize_fp4`` layouts; ``b`` e.g. from ``create_quantized_weight(w, FP4,
    Float4QuantConfig(), need_weight_transpose_cache=True)`` as a :class:`QuantizedTensorPair` with
    ``trans_b=True``) is read as it is; the backward reads the pair's other copy when it matches the
    recipe (the wgrad operand of ``a`` needs the recipe's Hadamard setting), else quantizes the
    dequantized values. Gradients reach a QuantizedTensor as high-precision tensors.

    Pre-quantized tuples (forward only): ``a=(q, scale_inv)`` with ``q [M, K/2]`` and ``trans_a=False``,
    ``b=(q, scale_inv)`` with ``q [N, K/2]`` and ``trans_b=True``, as ``quantize_fp4(x, axis=-1)``
    returns them (``b`` may use 32x32 blocks); ``out_dtype`` is then required.

    Shapes: K must be a multiple of 16 (the expanded FP8 operand rows are read 16 bytes at a time);
    for the backward, M and N as well (the transposed copies have rows of length M and N, and the
    Hadamard transform runs in groups of 16 along M). A last partial block of 32 (K = 48, ...) gets
    its own scale: no padding of the caller's data. Violations raise ``ValueError`` before any work.
    """
    config = _check_config(config)
    trans_a, trans_b = flag("gemm_fp4", "trans_a", trans_a), flag("gemm_fp4", "trans_b", trans_b)
    if _qo.is_quantized(a) or _qo.is_quantized(b):
        return _gemm_fp4_quantized(a, b, trans_a, trans_b, out_dtype, config)
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)):
            raise TypeError("gemm_fp4: pass both 'a' and 'b' pre-quantized, or neither")
        return _forward_prequantized(a, b, trans_a, trans_b, out_dtype)
    # The common case first: plain 2-D CUDA operands of sizes the kernels take go to one native call
    # per direction (it checks dtypes, shapes and devices with the messages below).
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_cuda and a.dim() == 2 and b.dim() == 2:
        m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
        n = b.shape[0] if trans_b else b.shape[1]
        training = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
        if m and n and k and not (k % 16 or (training and (m % 16 or n % 16))):
            r = recipe_of(config)
            out_dtype = a.dtype if out_dtype is None else out_dtype
            if not training:  # the product alone: no backward copies (and no M, N alignment)
                return _native_fwd(a, b, trans_a, trans_b, out_dtype, bool(r.use_2d_block), False, False, False)[0]
            return NativeGemmFp4Function.apply(
                a, b, trans_a, trans_b, out_dtype, bool(r.use_2d_block), bool(r.use_rht), bool(r.use_sr),
            )
    out_dtype, m, k, n = check_hp_operands(
        "gemm_fp4", a, b, trans_a, trans_b, out_dtype,
        "expanded FP8 rows are read 16 bytes at a time",
        "its transposed operands have rows of length M and N; the Hadamard transform works on groups of 16 along M",
    )
    if m == 0 or n == 0 or k == 0:
        return ((a.t() if trans_a else a) @ (b.t() if trans_b else b)).to(out_dtype)
    r = recipe_of(config)
    return GemmFp4Function.apply(
        a.contiguous(), b.contiguous(), None, None, trans_a, trans_b, out_dtype,
        bool(r.use_2d_block), bool(r.use_rht), bool(r.use_sr),
    )


def _gemm_fp4_quantized(a, b, trans_a: bool, trans_b: bool, out_dtype, config):
    """gemm_fp4 with QuantizedTensor / QuantizedTensorPair operands (either or both)."""
    a, a_t, b, b_t, out_dtype = _qo.dense_operands("gemm_fp4", a, b, trans_a, trans_b, out_dtype, config)
    r = recipe_of(config)
    a = a if isinstance(a, QuantizedTensor) else a.contiguous()
    b = b if isinstance(b, QuantizedTensor) else b.contiguous()
    return GemmFp4Function.apply(
        a, b, a_t, b_t, trans_a, trans_b, out_dtype, bool(r.use_2d_block), bool(r.use_rht), bool(r.use_sr)
    )
