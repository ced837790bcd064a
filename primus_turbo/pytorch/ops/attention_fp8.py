"""turbo.ops.flash_attn_fp8_func and flash_attn_varlen_fp8_func: flash attention with q, k and v
quantized to FP8 (E4M3) blockwise, forward and backward.

The forward is one native op (csrc/bindings/torch/attention_ops.cpp, ``attention_fp8_fwd``): it
quantizes each block of 64 or 128 rows of every head of q, k and v with its own float32 scale, then
runs our Hopper FP8 kernel (kernels/attention/attn_fwd_fp8_sm90.cuh), which applies the scales
inside (q and k's in the softmax exponent, v's on the probabilities). Everything the 16-bit
functions take is taken: causal and sliding windows, GQA/MQA, sinks, packed sequences, strided
views. The backward differentiates the FP8 forward's output on the dequantized q, k and v it
computed with (straight through the quantization): by default the 16-bit attention backward of the
configured backend (faster today, docs/PERFORMANCE.md). With PRIMUS_TURBO_ATTN_FP8_BWD=1, at head
dims 64, 96 and 128 and unless the backend is forced to CUDNN, it is one native op
(``attention_fp8_bwd``) on our FP8 backward kernels (kernels/attention/attn_bwd_fp8_sm90.cuh: q, k,
v and dout in E4M3, P and dS in E4M3 per block), deterministic.
"""

import os

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity
from primus_turbo.pytorch.ops import attention as _attn

__all__ = ["flash_attn_fp8_func", "flash_attn_varlen_fp8_func"]

#: (head dim of q and k, head dim of v) pairs the FP8 kernel is built for.
FP8_HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 128))
_DEFAULT_BLOCK = 64  # rows per scale without a config (the original library's default)
#: (head dim of q and k, head dim of v) pairs of the FP8 backward kernel; others take the 16-bit one.
FP8_BWD_HEAD_DIMS = ((64, 64), (96, 96), (128, 128))
# Opt-in: the FP8 backward runs 0.62-0.86x the 16-bit (cuDNN) one on an H100 (PERFORMANCE.md).
_FP8_BWD = os.environ.get("PRIMUS_TURBO_ATTN_FP8_BWD", "0") == "1"


_OP = "flash_attn_fp8 forward"  # the native op's name in its messages


def check_fp8_args(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, scale_rows=_DEFAULT_BLOCK):
    """The native op's checks and messages, for fake tensors and wrong argument types: the FP8
    limits first (so an unsupported head dim names FP8's set), then the 16-bit problem's."""
    if scale_rows not in (64, 128):
        raise ValueError(f"{_OP}: argument 'scale_rows' (the quantization block) is {scale_rows}; expected 64 or 128")
    if isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor) and q.dim() and v.dim():
        if (q.shape[-1], v.shape[-1]) not in FP8_HEAD_DIMS:
            raise NotImplementedError(
                f"{_OP}: FP8 attention supports head dims 64, 96 and 128 (q/k and v alike) and 192 for q/k with "
                f"128 for v; got {q.shape[-1]}/{v.shape[-1]}: use flash_attn_func (16-bit) for this shape"
            )
    _attn._check_args(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, op=_OP)


def _fwd_fake(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, scale_rows, dequantized):
    check_fp8_args(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, scale_rows)
    out, lse = _attn.forward_outputs(q, v, cu_q is not None)
    copies = (t.new_empty(t.shape) if dequantized else library.placeholder(t) for t in (q, k, v))
    return out, lse, *copies


def _bwd_fake(dout, q, k, v, out, lse, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr):
    if (q.shape[-1], v.shape[-1]) not in FP8_BWD_HEAD_DIMS:
        raise NotImplementedError(
            f"flash_attn_fp8 backward: the FP8 attention backward supports head dims 64, 96 and 128 (q/k and v "
            f"alike); got {q.shape[-1]}/{v.shape[-1]}"
        )
    return _attn._bwd_fake(dout, q, k, v, out, lse, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, 0, False)


library.register_fake("attention_fp8_fwd", _fwd_fake)
library.register_fake("attention_fp8_bwd", _bwd_fake)
_fwd_op = native.ops.attention_fp8_fwd.default
_bwd_op = native.ops.attention_fp8_bwd.default


def fp8_backward(q, v, backend: int) -> bool:
    """Whether the backward runs our FP8 kernels: asked for (PRIMUS_TURBO_ATTN_FP8_BWD=1), their
    head dims, and a backend other than a forced CUDNN (which keeps cuDNN's 16-bit backward)."""
    return _FP8_BWD and (q.shape[-1], v.shape[-1]) in FP8_BWD_HEAD_DIMS and backend != _attn.BACKEND_CUDNN


class FlashAttnFp8Function(torch.autograd.Function):
    """The backward differentiates what the forward computed, on the dequantized q, k, v the native
    op hands back (saved instead of the inputs, so no more memory): our FP8 backward where
    fp8_backward says so, else the 16-bit backward."""

    @staticmethod
    def forward(ctx, q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, scale_rows, backend, det):
        out, lse, qd, kd, vd = _fwd_op(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, scale_rows, True)
        ctx.save_for_backward(qd, kd, vd, out, lse, sink, cu_q, cu_k)
        ctx.args = (max_q, max_k, scale, wl, wr, backend, det)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zero-filled gradient for lse on every backward
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 14
        qd, kd, vd, out, lse, sink, cu_q, cu_k = ctx.saved_tensors
        max_q, max_k, scale, wl, wr, backend, _det = ctx.args
        if not fp8_backward(qd, vd, backend):
            return *_attn.attention_grads(ctx, dout), *(None,) * 10
        dq, dk, dv, dsink = _bwd_op(dout, qd, kd, vd, out, lse, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr)
        return dq, dk, dv, (dsink if sink is not None else None), *(None,) * 10


def block_rows(op, fp8_config) -> int:
    """Rows per quantization scale from the config: BLOCKWISE E4M3 (HYBRID's forward format) in
    blocks of 64 or 128 rows."""
    if fp8_config is None:
        return _DEFAULT_BLOCK
    if not isinstance(fp8_config, Float8QuantConfig):
        raise TypeError(f"{op}: argument 'fp8_config' must be a Float8QuantConfig or None, got {type(fp8_config).__name__}")
    if fp8_config.granularity != ScalingGranularity.BLOCKWISE:
        raise ValueError(
            f"{op}: argument 'fp8_config' has granularity {fp8_config.granularity.name}; FP8 attention quantizes "
            "blockwise (ScalingGranularity.BLOCKWISE)"
        )
    if fp8_config.format == Format.E5M2:
        raise ValueError(f"{op}: argument 'fp8_config' has format E5M2; FP8 attention uses E4M3 (format E4M3 or HYBRID)")
    if fp8_config.block_size not in (64, 128):
        raise ValueError(
            f"{op}: argument 'fp8_config' has block_size={fp8_config.block_size}; FP8 attention takes 64 or 128 rows"
        )
    return fp8_config.block_size


def _attention_fp8(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, rows, return_lse, deterministic):
    args = (q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, rows)
    if _attn.needs_grad(q, k, v, sink):  # the backend setting only matters to the backward
        out, lse = FlashAttnFp8Function.apply(*args, _attn.backend_code(), bool(deterministic))
    else:
        out, lse = _fwd_op(*args, False)[:2]
    return (out, lse) if return_lse else out


@native.raises_python_errors
def flash_attn_fp8_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    bias=None,
    alibi_slopes=None,
    deterministic=False,
    return_lse=False,
    return_attn_probs=False,
    fp8_config=None,
    sink=None,
):
    """:func:`flash_attn_func` with q, k and v quantized to FP8 (E4M3) blockwise.

    Args:
        fp8_config: ``Float8QuantConfig(granularity=BLOCKWISE, block_size=64 or 128)``, format E4M3
            or HYBRID; None means blocks of 64 rows. Each block of rows of each head gets its own
            scale (amax / 448).
        The rest as :func:`flash_attn_func` (``fp8_config`` comes before ``sink``, where the
        original library's signature has it). Head dims 64, 96, 128 and MLA's 192 (q/k) with 128
        (v); Hopper only.

    The backward is the 16-bit attention backward of this forward's output and log-sum-exp on the
    dequantized q, k and v (straight through the quantization), with respect to q, k, v and sink;
    ``deterministic`` applies to it.
    """
    op = "flash_attn_fp8_func"
    rows = block_rows(op, fp8_config)
    scale, wl, wr, sink = _attn._common_args(
        op, q, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes, return_attn_probs, sink
    )
    if not (_attn._tensors(q, k, v, sink) and q.dim() == 4 and k.dim() == 4):
        check_fp8_args(q, k, v, sink, None, None, 0, 0, scale, wl, wr)
    return _attention_fp8(
        q, k, v, sink, None, None, q.shape[1], k.shape[1], scale, wl, wr, rows, return_lse, deterministic
    )


@native.raises_python_errors
def flash_attn_varlen_fp8_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    bias=None,
    alibi_slopes=None,
    deterministic=False,
    return_lse=False,
    return_attn_probs=False,
    fp8_config=None,
    sink=None,
):
    """:func:`flash_attn_varlen_func` (packed sequences) with FP8 q, k and v, as
    :func:`flash_attn_fp8_func`. Blocks of rows start at each sequence's first token."""
    op = "flash_attn_varlen_fp8_func"
    rows = block_rows(op, fp8_config)
    scale, wl, wr, sink = _attn._common_args(
        op, q, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes, return_attn_probs, sink
    )
    cu_q, cu_k, max_q, max_k = _attn.packed_offsets(op, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if not _attn._tensors(q, k, v, sink, cu_q, cu_k):
        check_fp8_args(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr)
    return _attention_fp8(q, k, v, sink, cu_q, cu_k, max_q, max_k, scale, wl, wr, rows, return_lse, deterministic)
