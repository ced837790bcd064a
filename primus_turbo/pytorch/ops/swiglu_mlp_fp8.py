"""``turbo.ops.swiglu_mlp_fp8``: a SwiGLU MLP (gate/up projection, SwiGLU, down projection) in FP8
as one differentiable op, so the quantizations of the tensors SwiGLU writes fuse with it.

TENSORWISE, one native call per direction (csrc/bindings/torch/swiglu_mlp_fp8_ops.cpp): the SwiGLU
forward reports the amax of its output and the down projection's quantization reads it instead of
running an amax pass of its own; the SwiGLU backward does the same for the gradient the gate/up
projection's backward quantizes.
The reported amax is the one an amax pass over the rounded output would find, so the values are
the unfused chain's (gemm_fp8, swiglu, gemm_fp8) bit for bit. Two passes over the largest
activations of the step (the SwiGLU output and its input gradient) are saved.

Other granularities, and shapes the native path does not take, run that unfused chain.
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor, QuantizedTensorPair
from primus_turbo.pytorch.ops import _quantized_operands as _qo
from primus_turbo.pytorch.ops._checks import check_cuda_tensors
from primus_turbo.pytorch.ops.activation import _bwd_fake as _act_bwd_fake
from primus_turbo.pytorch.ops.activation import _fwd_fake as _act_fwd_fake
from primus_turbo.pytorch.ops.activation import swiglu
from primus_turbo.pytorch.ops.gemm_fp8 import (
    _IN_DTYPES,
    _NATIVE_GRANULARITY,
    _check_config,
    _dtypes,
    _fwd_fake,
    gemm_fp8,
    native_weight_copies,
)

__all__ = ["swiglu_mlp_fp8"]

_TENSORWISE = _NATIVE_GRANULARITY[ScalingGranularity.TENSORWISE]


def _fwd_amax_fake(x, probs, row_mask, act):
    return _act_fwd_fake(x, probs, row_mask, act), x.new_empty((1,), dtype=torch.float32)


def _bwd_amax_fake(dy, x, probs, row_mask, act, need_dprobs):
    return (*_act_bwd_fake(dy, x, probs, row_mask, act, need_dprobs), x.new_empty((1,), dtype=torch.float32))


def _mlp_fwd_fake(x, w_gate_up, w_down, fwd_dtype, fast_accum=False, for_backward=True):
    h, *gate_up_copies = _fwd_fake(x, w_gate_up, False, True, x.dtype, fwd_dtype, _TENSORWISE, for_backward)
    a = h.new_empty((h.shape[0], h.shape[1] // 2))
    y, *down_copies = _fwd_fake(a, w_down, False, True, x.dtype, fwd_dtype, _TENSORWISE, for_backward)
    return y, h, *gate_up_copies, *down_copies


def _infer_fake(x, w_gate_up, w_down, fwd_dtype, fast_accum=False):
    return _mlp_fwd_fake(x, w_gate_up, w_down, fwd_dtype, for_backward=False)[0]


def _mlp_bwd_fake(dy, h, x_bwd, sx_bwd, wgu_bwd, swgu_bwd, a_bwd, sa_bwd, wd_bwd, swd_bwd, grad_dtype, need_x,
                  need_w_gate_up, need_w_down):
    m, hidden, inter = dy.shape[0], dy.shape[1], a_bwd.shape[0]
    grads = ((need_x, (m, hidden)), (need_w_gate_up, (2 * inter, hidden)), (need_w_down, (hidden, inter)))
    return tuple(h.new_empty(shape) if need else library.placeholder(h) for need, shape in grads)


def _train_fake(x, w_gate_up, w_down, fwd_dtype, grad_dtype, fast_accum=False):
    return _infer_fake(x, w_gate_up, w_down, fwd_dtype)


# Native ops: csrc/bindings/torch/activation_ops.cpp and swiglu_mlp_fp8_ops.cpp.
library.register_fake("gated_act_fwd_amax", _fwd_amax_fake)
library.register_fake("gated_act_bwd_amax", _bwd_amax_fake)
library.register_fake("swiglu_mlp_fp8", _infer_fake)
library.register_fake("swiglu_mlp_fp8_fwd", _mlp_fwd_fake)
library.register_fake("swiglu_mlp_fp8_bwd", _mlp_bwd_fake)


def _mlp_fwd_qw_fake(x, wgu_q, wgu_s, wd_q, wd_s, fwd_dtype, fast_accum=False):
    y, h, x_bwd, sx_bwd, _, _, a_bwd, sa_bwd, _, _ = _mlp_fwd_fake(x, wgu_q.to(x.dtype), wd_q.to(x.dtype), fwd_dtype)
    return y, h, x_bwd, sx_bwd, a_bwd, sa_bwd


library.register_fake("swiglu_mlp_fp8_fwd_qw", _mlp_fwd_qw_fake)
_swiglu_fwd = native.ops.gated_act_fwd_amax.default
_swiglu_bwd = native.ops.gated_act_bwd_amax.default
_native_infer = native.ops.swiglu_mlp_fp8.default
_native_fwd = native.ops.swiglu_mlp_fp8_fwd.default
_native_bwd = native.ops.swiglu_mlp_fp8_bwd.default
_native_fwd_qw = native.ops.swiglu_mlp_fp8_fwd_qw.default
# With the C++ autograd (bindings/torch_autograd/swiglu_mlp_fp8_autograd.cpp): forward and backward
# of a training call without Python in between.
_native_train = native.training_op("swiglu_mlp_fp8_train", _train_fake)


class SwigluMlpFp8Function(torch.autograd.Function):
    """TENSORWISE: x [M, H] -> gate/up [M, 2I] -> SwiGLU [M, I] -> down [M, H], one native call per
    direction (swiglu_mlp_fp8_fwd / _bwd), the SwiGLU outputs' amaxes handed to the quantizations
    after them inside it."""

    @staticmethod
    def forward(ctx, x, w_gate_up, w_down, fmt: Format, fast_accum: bool = False):
        fwd_dtype, ctx.grad_dtype = _dtypes(fmt)
        y, *saved = _native_fwd(x, w_gate_up, w_down, fwd_dtype, fast_accum)
        ctx.save_for_backward(*saved)
        return y

    @staticmethod
    def backward(ctx, dy):
        need_x, need_wgu, need_wd = ctx.needs_input_grad[:3]
        dx, dwgu, dwd = _native_bwd(dy, *ctx.saved_tensors, ctx.grad_dtype, need_x, need_wgu, need_wd)
        return (dx if need_x else None), (dwgu if need_wgu else None), (dwd if need_wd else None), None, None


class SwigluMlpFp8QuantizedWeightsFunction(torch.autograd.Function):
    """SwigluMlpFp8Function with both weights given as TENSORWISE FP8 copies (a layer's per-step
    weight cache): the forward quantizes x and the SwiGLU output alone (swiglu_mlp_fp8_fwd_qw), the
    backward reads the weights' copies along 2I and H. The weights' gradients are the
    high-precision gradients of the tensors they stand for (straight-through)."""

    @staticmethod
    def forward(ctx, x, w_gate_up, w_down, wgu_copies, wd_copies, fmt: Format, fast_accum: bool = False):
        fwd_dtype, ctx.grad_dtype = _dtypes(fmt)
        (wgu_fwd, wgu_bwd), (wd_fwd, wd_bwd) = wgu_copies, wd_copies
        y, h, x_bwd, sx_bwd, a_bwd, sa_bwd = _native_fwd_qw(x, *wgu_fwd[:2], *wd_fwd[:2], fwd_dtype, fast_accum)
        ctx.save_for_backward(h, x_bwd, sx_bwd, *wgu_bwd[:2], a_bwd, sa_bwd, *wd_bwd[:2])
        return y

    @staticmethod
    def backward(ctx, dy):
        need_x, need_wgu, need_wd = ctx.needs_input_grad[:3]
        dx, dwgu, dwd = _native_bwd(dy, *ctx.saved_tensors, ctx.grad_dtype, need_x, need_wgu, need_wd)
        return (dx if need_x else None), (dwgu if need_wgu else None), (dwd if need_wd else None), None, None, None, None


def _weight_copies(x2, weights, config):
    """Each pre-quantized weight's (forward, dgrad) copies for the native training path
    (``native_weight_copies``), or None when either weight is not one it takes."""
    copies = [native_weight_copies(x2, w, w_t, True, config, True) for w, w_t in weights]
    return None if any(c is None for c in copies) else copies


def _operand(w, w_t):
    """A weight as gemm_fp8 takes it: its pair of copies when pre-quantized, else the tensor."""
    return QuantizedTensorPair(w, w_t) if isinstance(w, QuantizedTensor) else w


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
    check_cuda_tensors("swiglu_mlp_fp8", x=x, w_gate_up=w_gate_up, w_down=w_down)


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

    Either weight may be pre-quantized, a :class:`QuantizedTensor` or :class:`QuantizedTensorPair`
    as :func:`gemm_fp8` takes it, e.g. ``Float8Linear``'s per-step weight cache
    (``layer.weight_operand()`` with ``cache_quantized_weight=True``): with both TENSORWISE pairs
    (E4M3) the fused path reads their copies instead of quantizing the weights (the copies' scales
    are the cache's, so the product equals the fused path's on the same copies); otherwise the
    unfused chain reads them.

    Differentiable in all three. Calls with TENSORWISE and M, H and I positive multiples of 16 take
    the fused path (module docstring; one native call, and one for the backward); the result equals
    the unfused chain's either way (for finite values: the SwiGLU kernels' amax ignores NaN, as the
    batched amax pass does).
    """
    config = _check_config(config)
    weights = None
    if _qo.is_quantized(w_gate_up) or _qo.is_quantized(w_down):
        weights = (_qo.split_pair("swiglu_mlp_fp8", "w_gate_up", w_gate_up, config),
                   _qo.split_pair("swiglu_mlp_fp8", "w_down", w_down, config))
        w_gate_up, w_down = weights[0][0], weights[1][0]
    _check(x, w_gate_up, w_down)
    x2 = x.reshape(-1, x.shape[-1])
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (x, w_gate_up, w_down))
    if weights is not None:
        copies = _weight_copies(x2, weights, config) if training and _fused(x2, w_gate_up, w_down, config) else None
        if copies is not None:
            y = SwigluMlpFp8QuantizedWeightsFunction.apply(x2, w_gate_up, w_down, *copies, config.format,
                                                           config.fast_accum)
        else:  # the unfused chain, each GEMM reading its weight's copies
            h = gemm_fp8(x2, _operand(*weights[0]), trans_b=True, config=config)
            y = gemm_fp8(swiglu(h), _operand(*weights[1]), trans_b=True, config=config)
    elif not _fused(x2, w_gate_up, w_down, config):
        h = gemm_fp8(x2, w_gate_up, trans_b=True, config=config)
        y = gemm_fp8(swiglu(h), w_down, trans_b=True, config=config)
    elif not training:  # one call, no backward copies
        y = _native_infer(x2, w_gate_up, w_down, _dtypes(config.format)[0], config.fast_accum)
    elif native.eager_cpp_autograd():
        y = _native_train(x2, w_gate_up, w_down, *_dtypes(config.format), fast_accum=config.fast_accum)
    else:
        y = SwigluMlpFp8Function.apply(x2, w_gate_up, w_down, config.format, config.fast_accum)
    return y.view(*x.shape[:-1], w_down.shape[0])
