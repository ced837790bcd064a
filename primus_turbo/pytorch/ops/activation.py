"""Gated activations on the library's own CUDA kernels (kernels/activation/gated.cuh), forward and
backward:

- ``turbo.ops.swiglu(x)`` = ``silu(gate) * up`` and ``turbo.ops.geglu(x)`` = ``gelu(gate) * up``;
- ``turbo.ops.swiglu_with_probs(x, probs, row_mask)`` / ``geglu_with_probs``: the MoE expert
  variant, ``act(gate) * up * probs[row]`` with rows whose ``row_mask`` is 0 giving zeros.

``x`` is ``[..., 2H]`` = ``[gate | up]``: the first half goes through the activation, the second
half is the linear "up" projection (the convention of Primus-Turbo's AMD kernels and Megatron).
GeGLU's GELU is the exact (erf) one, ``torch.nn.functional.gelu(approximate="none")``, as there.
Arithmetic is float32; outputs have ``x``'s dtype.
"""

from typing import Optional

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.ops._checks import check_cuda_tensors

__all__ = ["swiglu", "geglu", "swiglu_with_probs", "geglu_with_probs"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_ACTS = {"swiglu": 0, "geglu": 1}  # the C API's act codes: 0 SiLU, 1 GELU


def _fwd_fake(x, probs, row_mask, act):
    return x.new_empty(x.shape[:-1] + (x.shape[-1] // 2,))


def _bwd_fake(dy, x, probs, row_mask, act, need_dprobs):
    n = probs.numel() if need_dprobs else 0
    return torch.empty_like(x), x.new_empty((n,), dtype=torch.float32)


# Native ops (csrc/bindings/torch/activation_ops.cpp): allocation and launch in one call each.
library.register_fake("gated_act_fwd", _fwd_fake)
library.register_fake("gated_act_bwd", _bwd_fake)
_fwd_op = native.ops.gated_act_fwd.default
_bwd_op = native.ops.gated_act_bwd.default


class GatedActFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, probs, row_mask, act: int):
        out = _fwd_op(x, probs, row_mask, act)
        ctx.save_for_backward(x, probs, row_mask)
        ctx.act = act
        return out

    @staticmethod
    def backward(ctx, dy):
        x, probs, row_mask = ctx.saved_tensors
        need_dprobs = probs is not None and ctx.needs_input_grad[1]
        dx, dprobs = _bwd_op(dy.contiguous(), x, probs, row_mask, ctx.act, need_dprobs)
        return dx, (dprobs if need_dprobs else None), None, None


def _check_x(op: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: argument 'x' must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"{op}: argument 'x' has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if x.dim() < 1 or x.shape[-1] < 2 or x.shape[-1] % 2:
        raise ValueError(
            f"{op}: argument 'x' has shape {tuple(x.shape)}; expected [..., 2H] with H >= 1 (gate and up halves)"
        )


@native.raises_python_errors
def _gated(op: str, x, probs=None, row_mask=None, with_probs: bool = False):
    _check_x(op, x)
    rows = x.numel() // x.shape[-1]
    tensors = {"x": x}
    if with_probs:
        if not isinstance(probs, torch.Tensor):
            raise TypeError(f"{op}: argument 'probs' must be a torch.Tensor, got {type(probs).__name__}")
        if probs.dtype != torch.float32:
            raise TypeError(f"{op}: argument 'probs' has dtype {probs.dtype}; expected torch.float32")
        if probs.numel() != rows:
            raise ValueError(
                f"{op}: argument 'probs' has shape {tuple(probs.shape)}; expected {rows} elements, one per row of 'x'"
            )
        tensors["probs"] = probs
        if row_mask is not None:
            if not isinstance(row_mask, torch.Tensor):
                raise TypeError(f"{op}: argument 'row_mask' must be a torch.Tensor or None, got {type(row_mask).__name__}")
            if row_mask.dtype not in (torch.int64, torch.int32, torch.bool):
                raise TypeError(f"{op}: argument 'row_mask' has dtype {row_mask.dtype}; expected torch.int64 (or int32/bool)")
            if row_mask.numel() != rows:
                raise ValueError(
                    f"{op}: argument 'row_mask' has shape {tuple(row_mask.shape)}; expected {rows} elements, one per row of 'x'"
                )
            tensors["row_mask"] = row_mask
    check_cuda_tensors(op, **tensors)
    if probs is not None:
        probs = probs.contiguous().view(-1)  # dprobs flows back to probs's shape through the view
    if row_mask is not None:
        row_mask = row_mask.to(torch.int64).contiguous().view(-1)
    act = _ACTS[op.split("_")[0]]
    if torch.is_grad_enabled() and (x.requires_grad or (probs is not None and probs.requires_grad)):
        out = GatedActFunction.apply(x.contiguous(), probs, row_mask, act)
    else:  # no autograd node to record: the native op alone
        out = _fwd_op(x.contiguous(), probs, row_mask, act)
    # The with-probs variants act on rows (tokens routed to experts): [rows, H], as the original.
    return out.view(rows, out.shape[-1]) if with_probs else out


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :H]) * x[..., H:]`` for ``x`` of shape ``[..., 2H]``; differentiable."""
    return _gated("swiglu", x)


def geglu(x: torch.Tensor) -> torch.Tensor:
    """``gelu(x[..., :H]) * x[..., H:]`` (exact erf GELU) for ``x`` of shape ``[..., 2H]``; differentiable."""
    return _gated("geglu", x)


def swiglu_with_probs(x: torch.Tensor, probs: torch.Tensor, row_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``silu(gate) * up * probs[row]`` (MoE experts: the routing probability folded into the
    activation). ``probs``: float32, one element per row of ``x`` (any shape); ``row_mask``: one
    element per row (int64, int32 or bool) or None; rows where it is 0 give zeros (padding rows).
    Returns ``[rows, H]`` whatever the rank of ``x`` (``[B, S, 2H]`` gives ``[B*S, H]``, as the
    original library). Differentiable in ``x`` and ``probs``."""
    return _gated("swiglu_with_probs", x, probs, row_mask, with_probs=True)


def geglu_with_probs(x: torch.Tensor, probs: torch.Tensor, row_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """As :func:`swiglu_with_probs` with the exact (erf) GELU."""
    return _gated("geglu_with_probs", x, probs, row_mask, with_probs=True)
