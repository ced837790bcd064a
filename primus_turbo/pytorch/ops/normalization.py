"""Normalizations over the last dimension on the library's own CUDA kernels
(kernels/normalization/norm.cuh), forward and backward:

- ``turbo.ops.rmsnorm(x, gamma)``;
- ``turbo.ops.rmsnorm_residual(x, residual, gamma)``: ``(rmsnorm(x + residual), x + residual)`` in
  one pass (the pre-norm transformer block's residual add and norm);
- ``turbo.ops.layernorm(x, gamma, beta)``.

Statistics are float32, outputs have ``x``'s dtype. The parameter gradients are reduced in a fixed
order, so the backward is bitwise reproducible.
"""

import math

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.ops._checks import check_cuda_tensors

__all__ = ["rmsnorm", "rmsnorm_residual", "layernorm"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HIDDEN = 65536


def _check_args(op: str, x, eps, params: dict, like_x: dict = None) -> None:
    """Validates arguments (no device work); messages name the argument. params: [hidden] weights
    (x's dtype or float32); like_x: tensors of x's shape and dtype."""
    like_x = like_x or {}
    for name, t in {"x": x, **like_x, **params}.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"{op}: argument 'x' has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if x.dim() < 1:
        raise ValueError(f"{op}: argument 'x' must have at least 1 dimension, got a scalar")
    hidden = x.shape[-1]
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"{op}: argument 'x' has shape {tuple(x.shape)}; its last dimension must be 1 to {MAX_HIDDEN}")
    for name, t in like_x.items():
        if t.shape != x.shape:
            raise ValueError(f"{op}: argument '{name}' has shape {tuple(t.shape)}; expected the shape of 'x' {tuple(x.shape)}")
        if t.dtype != x.dtype:
            raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}; expected {x.dtype} (the dtype of 'x')")
    first = None
    for name, t in params.items():
        if t.dtype not in (x.dtype, torch.float32):
            raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}; expected {x.dtype} (the dtype of 'x') or float32")
        if first is not None and t.dtype != first.dtype:
            raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}; expected the dtype of the other weight ({first.dtype})")
        first = t
        if t.dim() != 1 or t.shape[0] != hidden:
            raise ValueError(f"{op}: argument '{name}' has shape {tuple(t.shape)}; expected [{hidden}] (the last dimension of 'x')")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{op}: argument 'eps' must be a finite non-negative number, got {eps!r}")
    check_cuda_tensors(op, x=x, **like_x, **params)


# ---- native ops (csrc/bindings/torch/norm_ops.cpp): x is [..., hidden], any strides (a
# non-contiguous x is copied once); outputs are contiguous with x's shape, statistics [rows] --------


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[rows, hidden] contiguous view (a copy when the input is not contiguous); the FP8-emitting
    norms (fused_fp8.py) still take their input in this form."""
    return t.contiguous().reshape(-1, t.shape[-1])


def _like(x):
    return x.new_empty(x.shape)


def _fake_stat(x):
    return x.new_empty((x.numel() // x.shape[-1] if x.shape[-1] else 0,), dtype=torch.float32)


def _fwd_fake(x, gamma, eps, zero_centered):
    _check_args("rmsnorm", x, eps, {"gamma": gamma})
    return _like(x), _fake_stat(x)


def _bwd_fake(dy, x, gamma, rstd, zero_centered):
    return _like(x), torch.empty_like(gamma)


def _res_fwd_fake(x, residual, gamma, eps, zero_centered):
    _check_args("rmsnorm_residual", x, eps, {"gamma": gamma}, {"residual": residual})
    return _like(x), _like(x), _fake_stat(x)


def _res_bwd_fake(dy, dsum, s, gamma, rstd, zero_centered):
    return _like(s), torch.empty_like(gamma)


def _ln_fwd_fake(x, gamma, beta, eps):
    _check_args("layernorm", x, eps, {"gamma": gamma, "beta": beta})
    return _like(x), _fake_stat(x), _fake_stat(x)


def _ln_bwd_fake(dy, x, gamma, mean, rstd):
    return _like(x), torch.empty_like(gamma), torch.empty_like(gamma)


for _name, _fake in (
    ("rmsnorm_fwd", _fwd_fake),
    ("rmsnorm_bwd", _bwd_fake),
    ("rmsnorm_residual_fwd", _res_fwd_fake),
    ("rmsnorm_residual_bwd", _res_bwd_fake),
    ("layernorm_fwd", _ln_fwd_fake),
    ("layernorm_bwd", _ln_bwd_fake),
):
    library.register_fake(_name, _fake)
_fwd_op = native.ops.rmsnorm_fwd.default
_bwd_op = native.ops.rmsnorm_bwd.default
_res_fwd_op = native.ops.rmsnorm_residual_fwd.default
_res_bwd_op = native.ops.rmsnorm_residual_bwd.default
_ln_fwd_op = native.ops.layernorm_fwd.default
_ln_bwd_op = native.ops.layernorm_bwd.default
# With the C++ autograd (bindings/torch_autograd/norm_autograd.cpp): a training call's forward and
# backward without Python in between (eager mode; torch.compile traces the Python functions).
_rms_train = native.training_op("rmsnorm_train", lambda x, gamma, eps, zc: _fwd_fake(x, gamma, eps, zc)[0])
_res_train = native.training_op(
    "rmsnorm_residual_train", lambda x, residual, gamma, eps, zc: _res_fwd_fake(x, residual, gamma, eps, zc)[:2]
)
_ln_train = native.training_op("layernorm_train", lambda x, gamma, beta, eps: _ln_fwd_fake(x, gamma, beta, eps)[0])


class RmsNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, eps: float, zero_centered: bool):
        y, rstd = _fwd_op(x, gamma, eps, zero_centered)
        ctx.save_for_backward(x, gamma, rstd)
        ctx.zero_centered = zero_centered
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gamma, rstd = ctx.saved_tensors
        dx, dgamma = _bwd_op(dy, x, gamma, rstd, ctx.zero_centered)
        return dx, dgamma, None, None


class RmsNormResidualFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, gamma, eps: float, zero_centered: bool):
        y, s, rstd = _res_fwd_op(x, residual, gamma, eps, zero_centered)
        ctx.save_for_backward(s, gamma, rstd)
        ctx.set_materialize_grads(False)  # an unused s costs no zero-filled gradient read
        ctx.zero_centered = zero_centered
        return y, s

    @staticmethod
    def backward(ctx, dy, dsum):
        s, gamma, rstd = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(s)
        ds, dgamma = _res_bwd_op(dy, dsum, s, gamma, rstd, ctx.zero_centered)
        # d(x + residual)/dx = d/dresidual = 1: both inputs receive ds.
        return ds, ds, dgamma, None, None


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, beta, eps: float):
        y, mean, rstd = _ln_fwd_op(x, gamma, beta, eps)
        ctx.save_for_backward(x, gamma, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gamma, mean, rstd = ctx.saved_tensors
        dx, dgamma, dbeta = _ln_bwd_op(dy, x, gamma, mean, rstd)
        return dx, dgamma, dbeta, None


@native.raises_python_errors
def rmsnorm(x: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6, zero_centered: bool = False) -> torch.Tensor:
    """``x * rsqrt(mean(x**2, -1) + eps) * w`` with ``w = gamma`` (``1 + gamma`` when ``zero_centered``).

    Args:
        x: any shape ``[..., hidden]`` (hidden 1 to 65536), float32, float16 or bfloat16, on a CUDA
            device; a non-contiguous ``x`` is copied once.
        gamma: ``[hidden]``, ``x``'s dtype or float32.

    Statistics are float32, the output has ``x``'s dtype. Differentiable in ``x`` and ``gamma``;
    ``gamma``'s gradient is reduced in a fixed order, so backward is bitwise reproducible.
    """
    if type(eps) is not float or not isinstance(x, torch.Tensor) or not isinstance(gamma, torch.Tensor):
        _check_args("rmsnorm", x, eps, {"gamma": gamma})  # names a bad argument's type or value
    if torch.is_grad_enabled() and (x.requires_grad or gamma.requires_grad):
        if native.eager_cpp_autograd():
            return _rms_train(x, gamma, eps, bool(zero_centered))
        return RmsNormFunction.apply(x, gamma, eps, bool(zero_centered))
    return _fwd_op(x, gamma, eps, bool(zero_centered))[0]


@native.raises_python_errors
def rmsnorm_residual(
    x: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6, zero_centered: bool = False
):
    """``(rmsnorm(s, gamma, eps), s)`` with ``s = x + residual`` (rounded to ``x``'s dtype, as the
    unfused add), in one pass over memory. ``residual``: ``x``'s shape and dtype; the rest as
    :func:`rmsnorm`. Differentiable in ``x``, ``residual`` and ``gamma`` through both outputs."""
    if type(eps) is not float or not all(isinstance(t, torch.Tensor) for t in (x, residual, gamma)):
        _check_args("rmsnorm_residual", x, eps, {"gamma": gamma}, {"residual": residual})
    if torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad or gamma.requires_grad):
        if _res_train is not None and native.eager_cpp_autograd():
            return _res_train(x, residual, gamma, eps, bool(zero_centered))
        return RmsNormResidualFunction.apply(x, residual, gamma, eps, bool(zero_centered))
    y, s, _ = _res_fwd_op(x, residual, gamma, eps, bool(zero_centered))
    return y, s


def _layernorm_weights(x, gamma, beta, eps):
    """layernorm's gamma and beta with None made 1 and 0 (in the other weight's dtype, else x's),
    after the checks that name a bad argument."""
    like = gamma if isinstance(gamma, torch.Tensor) else beta if isinstance(beta, torch.Tensor) else None
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        _check_args("layernorm", x, eps, {})  # names x (not the gamma / beta it would default)
    dtype = like.dtype if like is not None else x.dtype
    if gamma is None:
        gamma = torch.ones(x.shape[-1], dtype=dtype, device=x.device)
    if beta is None:
        beta = torch.zeros(x.shape[-1], dtype=dtype, device=x.device)
    if type(eps) is not float or not isinstance(gamma, torch.Tensor) or not isinstance(beta, torch.Tensor):
        _check_args("layernorm", x, eps, {"gamma": gamma, "beta": beta})
    return gamma, beta


@native.raises_python_errors
def layernorm(x: torch.Tensor, gamma=None, beta=None, eps: float = 1e-5) -> torch.Tensor:
    """``(x - mean) * rsqrt(var + eps) * gamma + beta`` over the last dimension (biased variance,
    float32 statistics), like ``torch.nn.functional.layer_norm(x, x.shape[-1:], gamma, beta, eps)``.

    Args:
        x: ``[..., hidden]`` (hidden 1 to 65536), float32, float16 or bfloat16, on a CUDA device; a
            non-contiguous ``x`` is copied once.
        gamma, beta: ``[hidden]``, ``x``'s dtype or float32 (both the same), or None (1 and 0).
    """
    if not (isinstance(x, torch.Tensor) and isinstance(gamma, torch.Tensor) and isinstance(beta, torch.Tensor)
            and type(eps) is float):
        gamma, beta = _layernorm_weights(x, gamma, beta, eps)  # defaults, or a bad argument named
    if torch.is_grad_enabled() and (x.requires_grad or gamma.requires_grad or beta.requires_grad):
        if native.eager_cpp_autograd():
            return _ln_train(x, gamma, beta, eps)
        return LayerNormFunction.apply(x, gamma, beta, eps)
    return _ln_fwd_op(x, gamma, beta, eps)[0]
