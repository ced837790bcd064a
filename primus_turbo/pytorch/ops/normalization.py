"""turbo.ops.rmsnorm: RMSNorm over the last dimension, forward and backward, on the library's own
CUDA kernels (kernels/normalization/rmsnorm.cuh)."""

import math

import torch

from primus_turbo._core import check, lib
from primus_turbo.pytorch.core import library
from primus_turbo.pytorch.core.tensor_bridge import current_stream_handle, device_guard, to_pt
from primus_turbo.pytorch.ops._checks import check_cuda_tensors

__all__ = ["rmsnorm"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HIDDEN = 65536


def _check_args(x, gamma, eps) -> None:
    """Validates arguments (no device work); messages name the argument."""
    for name, t in (("x", x), ("gamma", gamma)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rmsnorm: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"rmsnorm: argument 'x' has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if gamma.dtype not in (x.dtype, torch.float32):
        raise TypeError(f"rmsnorm: argument 'gamma' has dtype {gamma.dtype}; expected {x.dtype} (the dtype of 'x') or float32")
    if x.dim() < 1:
        raise ValueError("rmsnorm: argument 'x' must have at least 1 dimension, got a scalar")
    hidden = x.shape[-1]
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"rmsnorm: argument 'x' has shape {tuple(x.shape)}; its last dimension must be 1 to {MAX_HIDDEN}")
    if gamma.dim() != 1 or gamma.shape[0] != hidden:
        raise ValueError(f"rmsnorm: argument 'gamma' has shape {tuple(gamma.shape)}; expected [{hidden}] (the last dimension of 'x')")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"rmsnorm: argument 'eps' must be a finite non-negative number, got {eps!r}")
    check_cuda_tensors("rmsnorm", x=x, gamma=gamma)


# ---- registered ops: x is [rows, hidden] and contiguous here ------------------------------------


def _fwd_cuda(x, gamma, eps: float, zero_centered: bool):
    y = torch.empty_like(x)
    rstd = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    if x.shape[0] == 0:
        return y, rstd
    with device_guard(x.device):
        status = lib.pt_rmsnorm_fwd(
            to_pt(x), to_pt(gamma), to_pt(y), to_pt(rstd), float(eps), int(zero_centered),
            current_stream_handle(x.device),
        )
    if status:
        check(status, context="rmsnorm forward")
    return y, rstd


def _fwd_fake(x, gamma, eps, zero_centered):
    return torch.empty_like(x), x.new_empty((x.shape[0],), dtype=torch.float32)


def _bwd_cuda(dy, x, gamma, rstd, zero_centered: bool):
    dx = torch.empty_like(x)
    dgamma = torch.empty_like(gamma)
    rows, hidden = x.shape
    ws = torch.empty(lib.pt_rmsnorm_bwd_workspace_bytes(rows, hidden), dtype=torch.uint8, device=x.device)
    with device_guard(x.device):
        status = lib.pt_rmsnorm_bwd(
            to_pt(dy), to_pt(x), to_pt(gamma), to_pt(rstd), to_pt(dx), to_pt(dgamma),
            ws.data_ptr() if ws.numel() else None, ws.numel(), int(zero_centered),
            current_stream_handle(x.device),
        )
    if status:
        check(status, context="rmsnorm backward")
    return dx, dgamma


def _bwd_fake(dy, x, gamma, rstd, zero_centered):
    return torch.empty_like(x), torch.empty_like(gamma)


_fwd_op = library.define(
    "rmsnorm_fwd(Tensor x, Tensor gamma, float eps, bool zero_centered) -> (Tensor, Tensor)", _fwd_cuda, _fwd_fake
)
_bwd_op = library.define(
    "rmsnorm_bwd(Tensor dy, Tensor x, Tensor gamma, Tensor rstd, bool zero_centered) -> (Tensor, Tensor)",
    _bwd_cuda,
    _bwd_fake,
)


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
        dx, dgamma = _bwd_op(dy.contiguous(), x, gamma, rstd, ctx.zero_centered)
        return dx, dgamma, None, None


def rmsnorm(x: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6, zero_centered: bool = False) -> torch.Tensor:
    """``x * rsqrt(mean(x**2, -1) + eps) * w`` with ``w = gamma`` (``1 + gamma`` when ``zero_centered``).

    Args:
        x: any shape ``[..., hidden]`` (hidden 1 to 65536), float32, float16 or bfloat16, on a CUDA
            device; a non-contiguous ``x`` is copied once.
        gamma: ``[hidden]``, ``x``'s dtype or float32.

    Statistics are float32, the output has ``x``'s dtype. Differentiable in ``x`` and ``gamma``;
    ``gamma``'s gradient is reduced in a fixed order, so backward is bitwise reproducible.
    """
    _check_args(x, gamma, eps)
    hidden = x.shape[-1]
    y = RmsNormFunction.apply(x.contiguous().reshape(-1, hidden), gamma.contiguous(), float(eps), bool(zero_centered))
    return y.view(x.shape)
