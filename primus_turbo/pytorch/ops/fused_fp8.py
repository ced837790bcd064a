"""RMSNorm and gated activations that also write their output quantized to FP8 in the same pass
(kernels/quantization/fused_fp8.cuh inside the norm and gated-activation kernels), so the next FP8
GEMM reads FP8 directly:

- ``turbo.ops.rmsnorm_fp8(x, gamma, ...)``, ``turbo.ops.rmsnorm_residual_fp8(x, residual, gamma, ...)``;
- ``turbo.ops.swiglu_fp8(x, ...)``, ``turbo.ops.geglu_fp8(x, ...)``.

Contract: the value quantized is the op's output *rounded to x's dtype*, so ``(q, scale_inv)`` is
bit-identical to ``turbo.ops.quantize_fp8(op(x), dtype, granularity, block_size=..., axis=-1)`` on
the unfused output: same scale (``FMT_MAX / max(amax, 1e-30)``, scale_inv stored), same rounding
(nearest even, saturating), same layouts (ROWWISE ``[..., 1]``, BLOCKWISE 1x128
``[..., ceil(H/128)]`` with a partial last block, ``...`` the output's leading dims: ``[M, 1]`` for
a 2-D output). Those are the layouts ``turbo.ops.gemm_fp8`` takes as a pre-quantized
``a=(q, scale_inv)`` (2-D q, ``trans_a=False``).

Autograd (straight-through quantization): q and scale_inv are not differentiable. With
``return_hp=True`` the high-precision output is returned as well and is differentiable; the
gradient arriving at it (the gradient with respect to the dequantized output) runs the plain op's
backward kernel, with the tensors the plain op saves (RMSNorm: x, gamma, rstd; gated: x).
"""

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity
from primus_turbo.pytorch.ops import activation as _act
from primus_turbo.pytorch.ops import normalization as _norm
from primus_turbo.pytorch.ops._checks import check_cuda_tensors, flag

__all__ = ["rmsnorm_fp8", "rmsnorm_residual_fp8", "swiglu_fp8", "geglu_fp8"]

ROWWISE, BLOCKWISE = 1, 2  # pt_quant_granularity codes (quantization.h)
BLOCK = 128
_FP8 = {Format.E4M3: torch.float8_e4m3fn, Format.E5M2: torch.float8_e5m2, Format.HYBRID: torch.float8_e4m3fn}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _config(op: str, config) -> tuple[int, torch.dtype]:
    """(granularity code, FP8 dtype) of a Float8QuantConfig (None: E4M3 rowwise). HYBRID is E4M3,
    the forward format."""
    if config is None:
        config = Float8QuantConfig(granularity=ScalingGranularity.ROWWISE)
    if not isinstance(config, Float8QuantConfig):
        raise TypeError(f"{op}: argument 'config' must be a Float8QuantConfig or None, got {type(config).__name__}")
    g = config.granularity
    if g == ScalingGranularity.ROWWISE:
        code = ROWWISE
    elif g == ScalingGranularity.BLOCKWISE:
        if config.block_size != BLOCK:
            raise ValueError(f"{op}: BLOCKWISE supports block_size=128 (1x128 blocks), got {config.block_size}")
        code = BLOCKWISE
    else:
        raise ValueError(
            f"{op}: granularity {g.name} is not supported; expected ROWWISE or BLOCKWISE (block_size=128): "
            "the scale must be known once a row is computed"
        )
    return code, _FP8[config.format]


def _scales_per_row(g: int, cols: int) -> int:
    return 1 if g == ROWWISE else _cdiv(cols, BLOCK)


def _vector_check(op: str, what: str, cols: int, dtype: torch.dtype) -> None:
    vec = 16 // torch.empty((), dtype=dtype).element_size()
    if cols % vec:
        raise ValueError(
            f"{op}: {what} is {cols}; it must be a multiple of {vec} for {dtype} (the FP8 output is written "
            "16 input bytes at a time)"
        )


def _hp_or_empty(x: torch.Tensor, shape, return_hp: bool) -> torch.Tensor:
    # Absent outputs are distinct empty tensors (a custom op's outputs must not alias).
    return x.new_empty(shape) if return_hp else x.new_empty((0,))


# ---- native ops (csrc/bindings/torch/fused_fp8_ops.cpp): outputs as their fake implementations ----


def _norm_outputs(x, residual, g: int, fp8_dtype, return_hp: bool):
    rows, hidden = x.shape
    q = x.new_empty((rows, hidden), dtype=fp8_dtype)
    s = x.new_empty((rows, _scales_per_row(g, hidden)), dtype=torch.float32)
    y = _hp_or_empty(x, (rows, hidden), return_hp)
    s_out = x.new_empty((rows, hidden)) if residual is not None else x.new_empty((0,))
    rstd = x.new_empty((rows,), dtype=torch.float32)
    return q, s, y, s_out, rstd


def _norm_fwd_fake(x, residual, gamma, eps, zero_centered, granularity, fp8_dtype, return_hp):
    return _norm_outputs(x, residual, granularity, fp8_dtype, return_hp)


def _gated_outputs(x, g: int, fp8_dtype, return_hp: bool):
    rows, cols = x.shape[0], x.shape[1] // 2
    q = x.new_empty((rows, cols), dtype=fp8_dtype)
    s = x.new_empty((rows, _scales_per_row(g, cols)), dtype=torch.float32)
    return q, s, _hp_or_empty(x, (rows, cols), return_hp)


def _gated_fwd_fake(x, probs, row_mask, act, granularity, fp8_dtype, return_hp):
    return _gated_outputs(x, granularity, fp8_dtype, return_hp)


library.register_fake("rmsnorm_fp8_fwd", _norm_fwd_fake)
_norm_fwd_op = native.ops.rmsnorm_fp8_fwd.default
library.register_fake("gated_act_fp8_fwd", _gated_fwd_fake)
_gated_fwd_op = native.ops.gated_act_fp8_fwd.default


# ---- autograd ----------------------------------------------------------------------------------


class RmsNormFp8Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, eps: float, zero_centered: bool, g: int, fp8_dtype, return_hp: bool):
        q, s, y, _, rstd = _norm_fwd_op(x, None, gamma, eps, zero_centered, g, fp8_dtype, return_hp)
        ctx.mark_non_differentiable(q, s)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, gamma, rstd)
        ctx.zero_centered = zero_centered
        return q, s, y

    @staticmethod
    def backward(ctx, dq, ds, dy):
        if dy is None:  # only the FP8 output was used: nothing flows back
            return None, None, None, None, None, None, None
        x, gamma, rstd = ctx.saved_tensors
        dx, dgamma = _norm._bwd_op(dy.contiguous(), x, gamma, rstd, ctx.zero_centered)
        return dx, dgamma, None, None, None, None, None


class RmsNormResidualFp8Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, gamma, eps: float, zero_centered: bool, g: int, fp8_dtype, return_hp: bool):
        q, s, y, s_out, rstd = _norm_fwd_op(x, residual, gamma, eps, zero_centered, g, fp8_dtype, return_hp)
        ctx.mark_non_differentiable(q, s)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(s_out, gamma, rstd)
        ctx.zero_centered = zero_centered
        return q, s, y, s_out

    @staticmethod
    def backward(ctx, dq, ds, dy, dsum):
        if dy is None and dsum is None:
            return (None,) * 8
        s_out, gamma, rstd = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(s_out)
        dx, dgamma = _norm._res_bwd_op(
            dy.contiguous(), None if dsum is None else dsum.contiguous(), s_out, gamma, rstd, ctx.zero_centered
        )
        return dx, dx, dgamma, None, None, None, None, None


class GatedFp8Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, probs, row_mask, act: int, g: int, fp8_dtype, return_hp: bool):
        q, s, out = _gated_fwd_op(x, probs, row_mask, act, g, fp8_dtype, return_hp)
        ctx.mark_non_differentiable(q, s)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, probs, row_mask)
        ctx.act = act
        return q, s, out

    @staticmethod
    def backward(ctx, dq, ds, dout):
        if dout is None:
            return (None,) * 7
        x, probs, row_mask = ctx.saved_tensors
        need_dprobs = probs is not None and ctx.needs_input_grad[1]
        dx, dprobs = _act._bwd_op(dout.contiguous(), x, probs, row_mask, ctx.act, need_dprobs)
        return dx, (dprobs if need_dprobs else None), None, None, None, None, None


# ---- public ops -----------------------------------------------------------------------------------


def _norm_common(op: str, x, gamma, eps, config, like_x: dict):
    _norm._check_args(op, x, eps, {"gamma": gamma}, like_x)
    g, fp8_dtype = _config(op, config)
    _vector_check(op, "hidden (the last dimension of 'x')", x.shape[-1], x.dtype)
    return g, fp8_dtype


def _scales_like(s, shape):
    """Per-row scales with the output's leading dims, as quantize_fp8 along -1 returns them."""
    return s.view(*shape[:-1], s.shape[-1]) if s.dim() == 2 and len(shape) != 2 else s


def _result(q, s, hp, shape, hp_shape, return_hp: bool):
    q, s = q.view(shape), _scales_like(s, shape)
    return (q, s, hp.view(hp_shape)) if return_hp else (q, s)


def rmsnorm_fp8(
    x: torch.Tensor,
    gamma: torch.Tensor,
    eps: float = 1e-6,
    zero_centered: bool = False,
    config: Float8QuantConfig | None = None,
    return_hp: bool = False,
):
    """``turbo.ops.rmsnorm(x, gamma, eps, zero_centered)`` quantized to FP8 in the same pass.

    Returns ``(q, scale_inv)``, or ``(q, scale_inv, y)`` with ``return_hp``: q has x's shape and
    the FP8 dtype of ``config.format`` (E4M3; E5M2; HYBRID is E4M3); scale_inv is float32
    ``[..., 1]`` (ROWWISE) or ``[..., ceil(hidden/128)]`` (BLOCKWISE, block_size=128), ``...``
    x's leading dimensions (as ``quantize_fp8`` along -1); y is the rmsnorm output in x's dtype. ``config`` None means E4M3
    ROWWISE. Bit-identical to ``quantize_fp8(rmsnorm(x, gamma), ..., axis=-1)``.

    hidden must be a multiple of 8 (float16/bfloat16) or 4 (float32). Differentiable through y
    only (straight-through: y's gradient is the dequantized output's).
    """
    op = "rmsnorm_fp8"
    return_hp = flag(op, "return_hp", return_hp)
    g, fp8_dtype = _norm_common(op, x, gamma, eps, config, {})
    q, s, y = RmsNormFp8Function.apply(
        _norm._rows(x), gamma.contiguous(), float(eps), bool(zero_centered), g, fp8_dtype, return_hp,
    )
    return _result(q, s, y, x.shape, x.shape, return_hp)


def rmsnorm_residual_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    gamma: torch.Tensor,
    eps: float = 1e-6,
    zero_centered: bool = False,
    config: Float8QuantConfig | None = None,
    return_hp: bool = False,
):
    """``turbo.ops.rmsnorm_residual`` with the normalized output quantized to FP8 in the same pass.

    Returns ``(q, scale_inv, s)`` or, with ``return_hp``, ``(q, scale_inv, y, s)``: s = x + residual
    (x's dtype, the next residual stream, differentiable), the rest as :func:`rmsnorm_fp8`."""
    op = "rmsnorm_residual_fp8"
    return_hp = flag(op, "return_hp", return_hp)
    g, fp8_dtype = _norm_common(op, x, gamma, eps, config, {"residual": residual})
    q, sc, y, s = RmsNormResidualFp8Function.apply(
        _norm._rows(x), _norm._rows(residual), gamma.contiguous(), float(eps), bool(zero_centered), g, fp8_dtype,
        return_hp,
    )
    q, sc, s = q.view(x.shape), _scales_like(sc, x.shape), s.view(x.shape)
    return (q, sc, y.view(x.shape), s) if return_hp else (q, sc, s)


def _gated_fp8(op: str, x, config, return_hp: bool, probs, row_mask):
    _act._check_x(op, x)
    return_hp = flag(op, "return_hp", return_hp)
    g, fp8_dtype = _config(op, config)
    cols = x.shape[-1] // 2
    _vector_check(op, "H (half the last dimension of 'x')", cols, x.dtype)
    rows = x.numel() // x.shape[-1]
    tensors = {"x": x}
    if probs is not None:
        if not isinstance(probs, torch.Tensor):
            raise TypeError(f"{op}: argument 'probs' must be a torch.Tensor or None, got {type(probs).__name__}")
        if probs.dtype != torch.float32:
            raise TypeError(f"{op}: argument 'probs' has dtype {probs.dtype}; expected torch.float32")
        if probs.numel() != rows:
            raise ValueError(
                f"{op}: argument 'probs' has shape {tuple(probs.shape)}; expected {rows} elements, one per row of 'x'"
            )
        tensors["probs"] = probs
        probs = probs.contiguous().view(-1)  # dprobs flows back to probs's shape through the view
    if row_mask is not None:
        if probs is None:
            raise ValueError(f"{op}: argument 'row_mask' needs 'probs' (the MoE expert variant)")
        if not isinstance(row_mask, torch.Tensor) or row_mask.dtype not in (torch.int64, torch.int32, torch.bool):
            raise TypeError(f"{op}: argument 'row_mask' must be an int64 (or int32/bool) tensor or None")
        if row_mask.numel() != rows:
            raise ValueError(
                f"{op}: argument 'row_mask' has shape {tuple(row_mask.shape)}; expected {rows} elements, one per row"
            )
        tensors["row_mask"] = row_mask
        row_mask = row_mask.to(torch.int64).contiguous().view(-1)
    check_cuda_tensors(op, **tensors)
    out_shape = x.shape[:-1] + (cols,)
    q, s, out = GatedFp8Function.apply(
        x.contiguous().reshape(-1, x.shape[-1]), probs, row_mask, _act._ACTS[op.split("_")[0]], g, fp8_dtype,
        return_hp,
    )
    return _result(q, s, out, out_shape, out_shape, return_hp)


def swiglu_fp8(
    x: torch.Tensor,
    config: Float8QuantConfig | None = None,
    return_hp: bool = False,
    probs: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
):
    """``turbo.ops.swiglu(x)`` quantized to FP8 in the same pass: ``(q, scale_inv)`` or, with
    ``return_hp``, ``(q, scale_inv, out)``. x ``[..., 2H]`` = ``[gate | up]``; q ``[..., H]``;
    scale_inv ``[..., 1]`` (ROWWISE) or ``[..., ceil(H/128)]`` (BLOCKWISE, block_size=128), ``...``
    x's leading dimensions. H must be a
    multiple of 8 (float16/bfloat16) or 4 (float32). Config, contract and autograd as
    :func:`rmsnorm_fp8`. With ``probs`` (float32, one per row) and optionally ``row_mask``: the MoE
    variant, ``turbo.ops.swiglu_with_probs(x, probs, row_mask)`` quantized (masked rows: q = 0
    and the scale of an all-zero row); differentiable in ``probs`` too (through ``out``)."""
    return _gated_fp8("swiglu_fp8", x, config, return_hp, probs, row_mask)


def geglu_fp8(
    x: torch.Tensor,
    config: Float8QuantConfig | None = None,
    return_hp: bool = False,
    probs: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
):
    """As :func:`swiglu_fp8` with the exact (erf) GELU: ``turbo.ops.geglu(x)`` quantized to FP8."""
    return _gated_fp8("geglu_fp8", x, config, return_hp, probs, row_mask)
