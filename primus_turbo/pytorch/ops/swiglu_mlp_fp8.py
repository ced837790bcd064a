"""``turbo.ops.swiglu_mlp_fp8``: a SwiGLU MLP (gate/up projection, SwiGLU, down projection) in FP8
as one differentiable op, so the quantizations of the tensors SwiGLU writes fuse with it.

TENSORWISE: the SwiGLU forward reports the amax of its output (gated_act_fwd_amax) and the down
projection's quantization reads it instead of running an amax pass of its own; the SwiGLU backward
does the same for the gradient the gate/up projection's backward quantizes (gated_act_bwd_amax).
The reported amax is the one an amax pass over the rounded output would find, so the values are
the unfused chain's (gemm_fp8, swiglu, gemm_fp8) bit for bit. Two passes over the largest
activations of the step (the SwiGLU output and its input gradient) are saved.

Other granularities, and shapes the native path does not take, run that unfused chain.
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity
from primus_turbo.pytorch.ops.activation import _bwd_fake as _act_bwd_fake
from primus_turbo.pytorch.ops.activation import _fwd_fake as _act_fwd_fake
from primus_turbo.pytorch.ops.activation import swiglu
from primus_turbo.pytorch.ops.gemm_fp8 import (
    _IN_DTYPES,
    _NATIVE_GRANULARITY,
    _bwd_fake,
    _check_config,
    _dtypes,
    _fwd_fake,
    _native_bwd,
    _native_fwd,
    gemm_fp8,
)

__all__ = ["swiglu_mlp_fp8"]

_TENSORWISE = _NATIVE_GRANULARITY[ScalingGranularity.TENSORWISE]
_SILU = 0  # the gated activation's act code


def _fwd_amax_fake(x, probs, row_mask, act):
    return _act_fwd_fake(x, probs, row_mask, act), x.new_empty((1,), dtype=torch.float32)


def _bwd_amax_fake(dy, x, probs, row_mask, act, need_dprobs):
    return (*_act_bwd_fake(dy, x, probs, row_mask, act, need_dprobs), x.new_empty((1,), dtype=torch.float32))


def _gemm_fwd_amax_fake(a, b, trans_a, trans_b, out_dtype, fwd_dtype, granularity, for_backward, a_amax):
    return _fwd_fake(a, b, trans_a, trans_b, out_dtype, fwd_dtype, granularity, for_backward)


def _gemm_bwd_amax_fake(grad, a_bwd, sa_bwd, b_bwd, sb_bwd, trans_a, trans_b, grad_dtype, granularity, a_dtype,
                        b_dtype, need_a, need_b, main_grad, grad_amax):
    return _bwd_fake(grad, a_bwd, sa_bwd, b_bwd, sb_bwd, trans_a, trans_b, grad_dtype, granularity, a_dtype,
                        b_dtype, need_a, need_b, main_grad)


# Native ops: csrc/bindings/torch/activation_ops.cpp and gemm_fp8_ops.cpp.
library.register_fake("gated_act_fwd_amax", _fwd_amax_fake)
library.register_fake("gated_act_bwd_amax", _bwd_amax_fake)
library.register_fake("gemm_fp8_fwd_amax", _gemm_fwd_amax_fake)
library.register_fake("gemm_fp8_bwd_amax", _gemm_bwd_amax_fake)
_swiglu_fwd = native.ops.gated_act_fwd_amax.default
_swiglu_bwd = native.ops.gated_act_bwd_amax.default
_gemm_fwd_amax = native.ops.gemm_fp8_fwd_amax.default
_gemm_bwd_amax = native.ops.gemm_fp8_bwd_amax.default


class SwigluMlpFp8Function(torch.autograd.Function):
    """TENSORWISE: x [M, H] -> gate/up [M, 2I] -> SwiGLU [M, I] -> down [M, H], each FP8 GEMM one
    native call per direction, the SwiGLU outputs' amaxes handed to the quantizations after them."""

    @staticmethod
    def forward(ctx, x, w_gate_up, w_down, fmt: Format):
        fwd_dtype, grad_dtype = _dtypes(fmt)
        h, x_bwd, sx_bwd, wgu_bwd, swgu_bwd = _native_fwd(x, w_gate_up, False, True, x.dtype, fwd_dtype,
                                                              _TENSORWISE, True)
        a, a_amax = _swiglu_fwd(h, None, None, _SILU)
        y, a_bwd, sa_bwd, wd_bwd, swd_bwd = _gemm_fwd_amax(a, w_down, False, True, x.dtype, fwd_dtype, _TENSORWISE,
                                                           True, a_amax)
        ctx.save_for_backward(h, x_bwd, sx_bwd, wgu_bwd, swgu_bwd, a_bwd, sa_bwd, wd_bwd, swd_bwd)
        ctx.grad_dtype = grad_dtype
        ctx.dtypes = (x.dtype, w_gate_up.dtype, w_down.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        h, x_bwd, sx_bwd, wgu_bwd, swgu_bwd, a_bwd, sa_bwd, wd_bwd, swd_bwd = ctx.saved_tensors
        x_dtype, wgu_dtype, wd_dtype = ctx.dtypes
        need_x, need_wgu, need_wd = ctx.needs_input_grad[:3]
        need_da = need_x or need_wgu  # the gradient through SwiGLU, wanted only below it
        da, dw_down = _native_bwd(dy.contiguous(), a_bwd, sa_bwd, wd_bwd, swd_bwd, False, True, ctx.grad_dtype,
                                  _TENSORWISE, h.dtype, wd_dtype, need_da, need_wd, None)
        if not need_da:
            return None, None, (dw_down if need_wd else None), None
        dh, _, dh_amax = _swiglu_bwd(da, h, None, None, _SILU, False)
        dx, dw_gate_up = _gemm_bwd_amax(dh, x_bwd, sx_bwd, wgu_bwd, swgu_bwd, False, True, ctx.grad_dtype,
                                        _TENSORWISE, x_dtype, wgu_dtype, need_x, need_wgu, None, dh_amax)
        return (dx if need_x else None), (dw_gate_up if need_wgu else None), (dw_down if need_wd else None), None


def _check(x, w_gate_up, w_down) -> None:
    for name, t in (("x", x), ("w_gate_up", w_gate_up), ("w_down", w_down)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"swiglu_mlp_fp8: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if w_gate_up.dim() != 2 or w_down.dim() != 2 or x.dim() < 1:
        raise ValueError(
            f"swiglu_mlp_fp8: expected x [..., H], w_gate_up [2I, H] and w_down [H, I]; got x {tuple(x.shape)}, "
            f"w_gate_up {tuple(w_gate_up.shape)}, w_down {tuple(w_down.shape)}"
        )
    hidden, inter2 = x.shape[-1], w_gate_up.shape[0]
    if w_gate_up.shape[1] != hidden or inter2 % 2 or tuple(w_down.shape) != (hidden, inter2 // 2):
        raise ValueError(
            f"swiglu_mlp_fp8: expected w_gate_up [2I, H] and w_down [H, I] for x [..., H={hidden}]; got w_gate_up "
            f"{tuple(w_gate_up.shape)}, w_down {tuple(w_down.shape)}"
        )
    if not (x.dtype == w_gate_up.dtype == w_down.dtype):
        raise TypeError(
            f"swiglu_mlp_fp8: x, w_gate_up and w_down must share a dtype; got {x.dtype}, {w_gate_up.dtype}, "
            f"{w_down.dtype}"
        )


def _fused(x2, w_gate_up, w_down, config) -> bool:
    """Whether the native TENSORWISE path takes this call (else the unfused chain runs)."""
    if config.granularity != ScalingGranularity.TENSORWISE or config.format == Format.E5M2:
        return False
    if x2.dtype not in _IN_DTYPES or not x2.is_cuda:
        return False
    m, hidden, inter = x2.shape[0], x2.shape[1], w_down.shape[1]
    return all(d > 0 and d % 16 == 0 for d in (m, hidden, inter))


@native.raises_python_errors
def swiglu_mlp_fp8(
    x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, config: Float8QuantConfig | None = None
) -> torch.Tensor:
    """``down(swiglu(gate_up(x)))`` with both projections in FP8 (:func:`gemm_fp8` with ``config``,
    default E4M3 tensorwise; HYBRID puts the gradients in E5M2).

    Args:
        x: ``[..., H]``, float16/bfloat16/float32, CUDA.
        w_gate_up: ``[2I, H]`` (``nn.Linear`` layout), the gate rows first, then the up rows, as
            :func:`swiglu` splits its input.
        w_down: ``[H, I]``.

    Differentiable in all three. Training calls with TENSORWISE and M, H and I positive multiples
    of 16 take the fused path (module docstring); the result equals the unfused chain's either way
    (for finite values: the SwiGLU kernels' amax ignores NaN, as the batched amax pass does).
    """
    _check(x, w_gate_up, w_down)
    config = _check_config(config)
    x2 = x.reshape(-1, x.shape[-1])
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (x, w_gate_up, w_down))
    if training and _fused(x2, w_gate_up, w_down, config):  # without a backward, only one pass is saved
        y = SwigluMlpFp8Function.apply(x2.contiguous(), w_gate_up, w_down, config.format)
    else:
        h = gemm_fp8(x2, w_gate_up, trans_b=True, config=config)
        y = gemm_fp8(swiglu(h), w_down, trans_b=True, config=config)
    return y.view(*x.shape[:-1], w_down.shape[0])
