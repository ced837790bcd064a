"""MoE token permutation, forward and backward, on the library's CUDA kernels
(kernels/moe/permute.cuh, kernels/moe/route_map.cuh):

- turbo.ops.token_permute / token_unpermute: by a routing mask, with merging probabilities;
- turbo.ops.moe_permute / moe_unpermute: by a routing map or top-k expert indices, each expert's
  rows padded to a multiple, probabilities and FP8 scales carried along.

They move data and never round it: a permuted row is a bit copy of its token, and a merge
without probabilities is a sum in a fixed order (fp32)."""


import operator

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.ops._checks import check_cuda_tensors

__all__ = ["token_permute", "token_unpermute", "moe_permute", "moe_unpermute"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_EXPERTS = 1024


# ---- registered ops ----------------------------------------------------------------------------


def _permute_counted_cuda(tokens, routing_map, probs):
    """token_permute with num_out_tokens=-1: the output has as many rows as the mask routes, which
    takes one host sync to count."""
    if torch.cuda.is_current_stream_capturing():
        raise ValueError(
            "token_permute: num_out_tokens=-1 counts the routed tokens with a host sync, which a CUDA graph "
            "capture cannot do; pass num_out_tokens (e.g. num_tokens * topk)"
        )
    return _permute_op(tokens, routing_map, probs, int(routing_map.count_nonzero().item()))


def _permute_counted_fake(tokens, routing_map, probs):
    # A data-dependent row count: an unbacked size, so torch.compile traces it without a graph break.
    return _permute_fake(tokens, routing_map, probs, torch.library.get_ctx().new_dynamic_size())


def _permute_fake(tokens, routing_map, probs, num_out):
    pprobs = tokens.new_empty(
        (num_out if probs is not None else 0,), dtype=probs.dtype if probs is not None else torch.float32
    )
    return (
        tokens.new_empty((num_out, tokens.shape[1])),
        pprobs,
        tokens.new_empty(tuple(routing_map.shape), dtype=torch.int32),
    )


def _scatter_fake(tokens, row_id_map, num_out):
    return tokens.new_empty((num_out, tokens.shape[1]))


def _unpermute_fake(inp, row_id_map, merging_probs, permuted_probs):
    t, e = row_id_map.shape
    pg = (
        inp.new_empty((t, e), dtype=permuted_probs.dtype)
        if permuted_probs is not None
        else inp.new_empty((0,), dtype=torch.float32)
    )
    return inp.new_empty((t, inp.shape[1])), pg


def _unpermute_bwd_fake(grad_out, fwd_input, row_id_map, merging_probs):
    return torch.empty_like(fwd_input), torch.empty_like(merging_probs)


# Native ops (csrc/bindings/torch/moe_permute_ops.cpp): outputs, workspace and launch in one call.
library.register_fake("moe_token_permute", _permute_fake)
library.register_fake("moe_token_unpermute", _unpermute_fake)
_permute_op = native.ops.moe_token_permute.default
_unpermute_op = native.ops.moe_token_unpermute.default
_permute_counted_op = library.define_op(
    "moe_token_permute_counted(Tensor tokens, Tensor routing_map, Tensor? probs) -> (Tensor, Tensor, Tensor)",
    _permute_counted_cuda,
    _permute_counted_fake,
)
library.register_fake("moe_token_scatter", _scatter_fake)
library.register_fake("moe_token_unpermute_bwd", _unpermute_bwd_fake)
_scatter_op = native.ops.moe_token_scatter.default
_unpermute_bwd_op = native.ops.moe_token_unpermute_bwd.default
# With the C++ autograd (bindings/torch_autograd/moe_permute_autograd.cpp): a training call's
# forward and backward without Python in between (eager mode, a given output row count).
_permute_train = native.training_op("token_permute_train", _permute_fake)
_unpermute_train = native.training_op(
    "token_unpermute_train", lambda inp, rows, mp: _unpermute_fake(inp, rows, mp, None)[0]
)


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, routing_map, probs, num_out: int):
        if num_out < 0:
            out, pprobs, row_id_map = _permute_counted_op(tokens, routing_map, probs)
        else:
            out, pprobs, row_id_map = _permute_op(tokens, routing_map, probs, num_out)
        ctx.save_for_backward(row_id_map)
        ctx.with_probs = probs is not None
        # Shapes and dtypes of the differentiable outputs: a gradient that one of them did not get
        # is made here, only then (no zero-filled gradient for the map on every call).
        ctx.metas = (out.shape, out.dtype), (None if pprobs is None else (pprobs.shape, pprobs.dtype))
        ctx.mark_non_differentiable(row_id_map)
        ctx.set_materialize_grads(False)
        return out, pprobs, row_id_map

    @staticmethod
    def backward(ctx, grad_out, grad_pprobs, _):
        if grad_out is None and grad_pprobs is None:
            return None, None, None, None
        (row_id_map,) = ctx.saved_tensors
        out_meta, pp_meta = ctx.metas
        if grad_out is None:
            grad_out = row_id_map.new_zeros(out_meta[0], dtype=out_meta[1])
        pp = None
        if ctx.with_probs:
            pp = (
                grad_pprobs.contiguous() if grad_pprobs is not None
                else row_id_map.new_zeros(pp_meta[0], dtype=pp_meta[1])
            )
        grad_tokens, grad_probs = _unpermute_op(grad_out.contiguous(), row_id_map, None, pp)
        return grad_tokens, None, grad_probs if ctx.with_probs else None, None


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, row_id_map, merging_probs):
        out, _ = _unpermute_op(inp, row_id_map, merging_probs, None)
        ctx.save_for_backward(inp if merging_probs is not None else None, row_id_map, merging_probs)
        ctx.num_rows = inp.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad_out):
        inp, row_id_map, merging_probs = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        if merging_probs is None:
            return _scatter_op(grad_out, row_id_map, ctx.num_rows), None, None
        grad_in, grad_probs = _unpermute_bwd_op(grad_out, inp, row_id_map, merging_probs)
        return grad_in, None, grad_probs


def _check_tokens(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}; expected float32, float16 or bfloat16")
    if t.dim() != 2:
        raise ValueError(f"{op}: argument '{name}' has shape {tuple(t.shape)}; expected [num_tokens, hidden]")


def _shape_pair(op: str, shape) -> tuple:
    """``restore_shape`` as a (num_tokens, hidden) pair of ints, or a TypeError naming it."""
    try:
        pair = tuple(shape)
        if len(pair) != 2 or any(isinstance(d, bool) for d in pair):
            raise TypeError
        return tuple(operator.index(d) for d in pair)  # ints and numpy ints; never floats
    except TypeError:
        raise TypeError(
            f"{op}: argument 'restore_shape' must be a (num_tokens, hidden) pair of ints, got {shape!r}"
        ) from None


def _check_probs(op: str, name: str, p, shape) -> None:
    if not isinstance(p, torch.Tensor) or p.dtype not in _DTYPES:
        raise TypeError(f"{op}: argument '{name}' must be a float32, float16 or bfloat16 torch.Tensor")
    if tuple(p.shape) != tuple(shape):
        raise ValueError(f"{op}: argument '{name}' has shape {tuple(p.shape)}; expected {list(shape)}")


@native.raises_python_errors
def token_permute(
    inp: torch.Tensor,
    probs: torch.Tensor | None = None,
    routing_map: torch.Tensor | None = None,
    topk_indices: torch.Tensor | None = None,
    num_out_tokens: int = -1,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Groups the copies of ``inp``'s tokens by expert; returns ``(output, permuted_probs, row_id_map)``.

    Args:
        inp: ``[num_tokens, hidden]`` float32, float16 or bfloat16.
        probs: optional ``[num_tokens, num_experts]`` routing probabilities; ``permuted_probs[r]`` is the
            probability of output row ``r`` (None without ``probs``).
        routing_map: ``[num_tokens, num_experts]`` bool / uint8 / int32 mask (non-zero: routed), at most
            1024 experts.
        topk_indices: not supported (pass a mask; see ``routing_map``).
        num_out_tokens: rows of ``output``. Copies past it are dropped, rows past the routed total are
            zero. ``-1`` counts the mask on the host (one device synchronization): pass
            ``num_tokens * topk`` (or the capacity) to keep the call graph-capturable.

    ``output`` rows hold experts in order, tokens in order within an expert; ``row_id_map[t, e]``
    is the row of token ``t``'s copy for expert ``e`` or -1. Differentiable in ``inp`` and ``probs``.
    """
    op = "token_permute"
    if topk_indices is not None:
        raise NotImplementedError(
            f"{op}: topk_indices is not supported; pass routing_map (a [num_tokens, num_experts] mask)"
        )
    if routing_map is None:
        raise ValueError(f"{op}: argument 'routing_map' is required")
    _check_tokens(op, "inp", inp)
    if not isinstance(routing_map, torch.Tensor) or routing_map.dtype not in (
        torch.bool,
        torch.uint8,
        torch.int32,
        torch.int64,
    ):
        raise TypeError(f"{op}: argument 'routing_map' must be a bool, uint8, int32 or int64 torch.Tensor")
    if routing_map.dim() != 2 or routing_map.shape[0] != inp.shape[0] or not 1 <= routing_map.shape[1] <= MAX_EXPERTS:
        raise ValueError(
            f"{op}: argument 'routing_map' has shape {tuple(routing_map.shape)}; expected [{inp.shape[0]}, num_experts] "
            f"with 1 to {MAX_EXPERTS} experts"
        )
    if probs is not None:
        _check_probs(op, "probs", probs, routing_map.shape)
    if isinstance(num_out_tokens, bool) or not isinstance(num_out_tokens, int) or num_out_tokens < -1:
        raise ValueError(
            f"{op}: argument 'num_out_tokens' must be an int >= 0, or -1 to count the mask; got {num_out_tokens!r}"
        )
    check_cuda_tensors(op, inp=inp, routing_map=routing_map, **({"probs": probs} if probs is not None else {}))
    if routing_map.dtype == torch.int64:
        routing_map = routing_map.to(torch.int32)
    grad = torch.is_grad_enabled() and (inp.requires_grad or (probs is not None and probs.requires_grad))
    if not grad and num_out_tokens >= 0:  # no autograd node to record: the native op alone
        out, pprobs, row_id_map = _permute_op(inp, routing_map, probs, num_out_tokens)
        return out, (pprobs if probs is not None else None), row_id_map
    if num_out_tokens >= 0 and native.eager_cpp_autograd():
        out, pprobs, row_id_map = _permute_train(inp, routing_map, probs, num_out_tokens)
        return out, (pprobs if probs is not None else None), row_id_map
    out, pprobs, row_id_map = _Permute.apply(
        inp.contiguous(), routing_map.contiguous(), probs.contiguous() if probs is not None else None, num_out_tokens
    )
    return out, (pprobs if probs is not None else None), row_id_map


@native.raises_python_errors
def token_unpermute(
    inp: torch.Tensor,
    row_id_map: torch.Tensor,
    merging_probs: torch.Tensor | None = None,
    restore_shape: torch.Size | None = None,
    map_type: str = "mask",
    probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Restores token order: ``out[t] = sum_e (merging_probs[t, e] *) inp[row_id_map[t, e]]``.

    Args:
        inp: ``[num_rows, hidden]`` permuted tokens (e.g. expert outputs).
        row_id_map: from :func:`token_permute`.
        merging_probs: optional ``[num_tokens, num_experts]`` weights of the merge (``probs`` is an alias).
        restore_shape: optional ``(num_tokens, hidden)``, checked against ``row_id_map`` and ``inp``.
        map_type: ``"mask"`` (the only map this library builds).

    The sum runs in float32 in expert order (bitwise reproducible). Differentiable in ``inp`` and
    ``merging_probs``.
    """
    op = "token_unpermute"
    if probs is not None:
        if merging_probs is not None:
            raise ValueError(f"{op}: pass merging_probs or probs (its alias), not both")
        merging_probs = probs
    if map_type != "mask":
        raise ValueError(f"{op}: argument 'map_type' is {map_type!r}; only 'mask' is supported")
    _check_tokens(op, "inp", inp)
    if not isinstance(row_id_map, torch.Tensor) or row_id_map.dtype != torch.int32 or row_id_map.dim() != 2:
        raise TypeError(f"{op}: argument 'row_id_map' must be the int32 [num_tokens, num_experts] map of token_permute")
    if not 1 <= row_id_map.shape[1] <= MAX_EXPERTS:
        raise ValueError(f"{op}: argument 'row_id_map' has {row_id_map.shape[1]} experts; expected 1 to {MAX_EXPERTS}")
    if merging_probs is not None:
        _check_probs(op, "merging_probs", merging_probs, row_id_map.shape)
    if restore_shape is not None and _shape_pair(op, restore_shape) != (row_id_map.shape[0], inp.shape[1]):
        raise ValueError(
            f"{op}: argument 'restore_shape' is {tuple(restore_shape)}; expected ({row_id_map.shape[0]}, {inp.shape[1]})"
        )
    extra = {"merging_probs": merging_probs} if merging_probs is not None else {}
    check_cuda_tensors(op, inp=inp, row_id_map=row_id_map, **extra)
    mp = merging_probs.contiguous() if merging_probs is not None else None
    if not (torch.is_grad_enabled() and (inp.requires_grad or (mp is not None and mp.requires_grad))):
        return _unpermute_op(inp, row_id_map, mp, None)[0]  # no autograd node to record
    if native.eager_cpp_autograd():
        return _unpermute_train(inp, row_id_map, mp)
    return _Unpermute.apply(inp.contiguous(), row_id_map.contiguous(), mp)


# ---- moe_permute / moe_unpermute ----------------------------------------------------------------

_FP8_TOKENS = tuple(
    d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None), torch.uint8) if d is not None
)


def _moe_permute_fake(tokens, expert_map, probs, scaling_factor, num_experts, pad_multiple, num_out, probs_topk):
    t, h = tokens.shape
    e, p = num_experts, max(pad_multiple, 0)
    if t == 0:
        m = 0
    elif num_out > 0:
        m = num_out
    else:
        m = torch.library.get_ctx().new_dynamic_size()
    s = scaling_factor.shape[1] if scaling_factor is not None else 0
    return (
        tokens.new_empty((m, h)),
        tokens.new_empty((t + p, 2 * e + 1), dtype=torch.int32),
        tokens.new_empty((e,), dtype=torch.int64),
        tokens.new_empty((1,), dtype=torch.int32),
        tokens.new_empty((1,), dtype=torch.int32),
        tokens.new_empty((m if scaling_factor is not None else 0, s), dtype=torch.float32),
        tokens.new_empty((m if probs is not None else 0,), dtype=probs.dtype if probs is not None else torch.float32),
    )


def _moe_gather_fake(src, row_id_map, src_probs, num_tokens, num_experts, probs_width):
    probs = (
        src.new_empty((num_tokens, probs_width), dtype=src_probs.dtype)
        if src_probs is not None
        else src.new_empty((0,), dtype=torch.float32)
    )
    return src.new_empty((num_tokens, src.shape[1])), probs


def _moe_scatter_fake(src, row_id_map, src_probs, num_rows, num_experts):
    probs = src.new_empty(
        (num_rows if src_probs is not None else 0,), dtype=src_probs.dtype if src_probs is not None else torch.float32
    )
    return src.new_empty((num_rows, src.shape[1])), probs


# Native (csrc/bindings/torch/moe_permute_ops.cpp): map build, sizing and scatter in one call; the
# gather (moe_unpermute, moe_permute's backward) and scatter (moe_unpermute's backward) likewise.
library.register_fake("moe_index_permute", _moe_permute_fake)
_moe_permute_op = native.ops.moe_index_permute.default
library.register_fake("moe_index_gather", _moe_gather_fake)
library.register_fake("moe_index_scatter", _moe_scatter_fake)
_moe_gather_op = native.ops.moe_index_gather.default
_moe_scatter_op = native.ops.moe_index_scatter.default
# Their C++ autograd (moe_permute_autograd.cpp) for eager training calls; 16-bit / fp32 tokens.
_moe_permute_train = native.training_op(
    "moe_permute_train",
    lambda tokens, emap, probs, e, pad, num_out, topk, width: _moe_permute_fake(
        tokens, emap, probs, None, e, pad, num_out, topk
    ),
)
_moe_unpermute_train = native.training_op("moe_unpermute_train", _moe_gather_fake)


class _MoePermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, expert_map, probs, scaling_factor, num_experts, pad_multiple, num_out, probs_topk, width):
        outs = _moe_permute_op(tokens, expert_map, probs, scaling_factor, num_experts, pad_multiple, num_out, probs_topk)
        ctx.save_for_backward(outs[1])
        ctx.num_tokens, ctx.num_experts, ctx.width = tokens.shape[0], num_experts, width
        ctx.with_probs = probs is not None
        ctx.byte_tokens = tokens.dtype in _FP8_TOKENS
        ctx.out_meta = outs[0].shape, outs[0].dtype
        ctx.mark_non_differentiable(*outs[1:6])
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the five integer outputs
        return outs

    @staticmethod
    def backward(ctx, g_out, _map, _tpe, _ovf, _nd, _scales, g_probs):
        if ctx.byte_tokens:
            raise NotImplementedError("moe_permute: the backward of FP8 (1-byte) tokens is not supported")
        if g_out is None and g_probs is None:
            return (None,) * 9
        (row_id_map,) = ctx.saved_tensors
        if g_out is None:
            g_out = row_id_map.new_zeros(ctx.out_meta[0], dtype=ctx.out_meta[1])
        gp = g_probs.contiguous() if ctx.with_probs and g_probs is not None else None
        grad_tokens, grad_probs = _moe_gather_op(
            g_out.contiguous(), row_id_map, gp, ctx.num_tokens, ctx.num_experts, ctx.width
        )
        return grad_tokens, None, grad_probs if gp is not None else None, None, None, None, None, None, None


class _MoeUnpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, row_id_map, permuted_probs, num_tokens, num_experts, width):
        out, probs = _moe_gather_op(inp, row_id_map, permuted_probs, num_tokens, num_experts, width)
        ctx.save_for_backward(row_id_map)
        ctx.num_rows, ctx.num_experts = inp.shape[0], num_experts
        ctx.with_probs = permuted_probs is not None
        ctx.out_meta = out.shape, out.dtype
        ctx.set_materialize_grads(False)  # no zero-filled gradient for an unused output
        return out, probs

    @staticmethod
    def backward(ctx, g_out, g_probs):
        if g_out is None and g_probs is None:
            return (None,) * 6
        (row_id_map,) = ctx.saved_tensors
        if g_out is None:
            g_out = row_id_map.new_zeros(ctx.out_meta[0], dtype=ctx.out_meta[1])
        gp = g_probs.contiguous() if ctx.with_probs and g_probs is not None else None
        grad_in, grad_pp = _moe_scatter_op(g_out.contiguous(), row_id_map, gp, ctx.num_rows, ctx.num_experts)
        return grad_in, None, grad_pp if gp is not None else None, None, None, None


def _int_arg(op: str, name: str, v, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f"{lo} to {hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{op}: argument '{name}' must be an int {rng}; got {v!r}")
    return v


def _float_probs(op: str, name: str, p, shape) -> None:
    if not isinstance(p, torch.Tensor) or p.dtype not in _DTYPES:
        raise TypeError(f"{op}: argument '{name}' must be a float32, float16 or bfloat16 torch.Tensor")
    if tuple(p.shape) != tuple(shape):
        raise ValueError(f"{op}: argument '{name}' has shape {tuple(p.shape)}; expected {list(shape)}")


@native.raises_python_errors
def moe_permute(
    tokens: torch.Tensor,
    expert_map: torch.Tensor,
    *,
    num_local_experts: int,
    num_topk: int = 0,
    pad_multiple: int = 0,
    num_permuted_tokens: int = -1,
    scaling_factor: torch.Tensor | None = None,
    probs: torch.Tensor | None = None,
    probs_layout: str = "topk",
    scales_per_token: int = 0,
    use_fp8: bool = False,
):
    """Groups the routed copies of ``tokens`` by expert, each expert's rows padded to a multiple.

    Returns ``(permuted_tokens, row_id_map, tokens_per_expert, overflow_flag, num_dispatched_tokens,
    permuted_scaling_factor, permuted_probs)``.

    Args:
        tokens: ``[num_tokens, hidden]`` float32 / float16 / bfloat16, or with ``use_fp8`` 1-byte
            float8_e4m3fn / float8_e5m2 / uint8 (hidden a multiple of 16).
        expert_map: a ``[num_tokens, num_local_experts]`` bool routing map, or ``[num_tokens, num_topk]``
            int32/int64 expert indices (values outside ``[0, num_local_experts)`` are no route, e.g. -1
            for a dropped one; a repeated expert counts once).
        num_local_experts: experts (1 to 1024).
        num_topk: columns of an index ``expert_map``; the width of ``probs`` for ``probs_layout="topk"``.
        pad_multiple: each expert's block of rows is padded with zero rows to a multiple of it (0: none).
        num_permuted_tokens: rows of ``permuted_tokens``. Slots past it are dropped (``overflow_flag``
            = 1), rows past the used ones are zero. ``<= 0``: the exact count, read on the host (one
            device synchronization; not under CUDA graph capture). No synchronization when given:
            ``num_tokens * topk`` (``+ num_local_experts * (pad_multiple - 1)`` with padding) always fits.
            With no tokens the output has no rows, whatever this says (as the original library).
        scaling_factor: ``[num_tokens, scales_per_token]`` float32 scales of FP8 tokens, carried to
            ``permuted_scaling_factor`` (used only with ``use_fp8``).
        probs: ``[num_tokens, num_topk]`` (``probs_layout="topk"``, index map) or ``[num_tokens,
            num_local_experts]`` (``"routing_map"``); ``permuted_probs[row]`` is the probability of the
            row (0 for padding rows).
        probs_layout: ``"topk"`` (requires ``num_topk > 0``) or ``"routing_map"``.

    Rows hold expert 0's tokens in token order, its padding rows, then expert 1, ...;
    ``tokens_per_expert`` (int64) counts each block's rows with padding. ``num_dispatched_tokens``
    (int32 [1]) counts tokens with at least one route. Differentiable in ``tokens`` and ``probs``:
    the backward sums a token's row gradients in a fixed order (fp32) and gathers the probability
    gradients (FP8 tokens have no backward).

    ``row_id_map`` is ``moe_unpermute``'s handle, ``[num_tokens + pad_multiple, 2 * experts + 1]``
    int32: a token's row holds its ``n`` destination rows plus one, then at column ``experts`` their
    probability columns, and ``n`` in the last column. Entries past a token's ``n`` are left
    unwritten (writing them would add ``8 * experts`` bytes per token); they are unspecified.
    """
    op = "moe_permute"
    if probs_layout not in ("routing_map", "topk"):
        raise ValueError(f"{op}: probs_layout must be 'routing_map' or 'topk', got {probs_layout!r}")
    if probs is not None and probs_layout == "topk" and (
        isinstance(num_topk, bool) or not isinstance(num_topk, int) or num_topk <= 0
    ):
        raise ValueError(f"{op}: probs_layout='topk' requires num_topk > 0")
    e = _int_arg(op, "num_local_experts", num_local_experts, 1, MAX_EXPERTS)
    _int_arg(op, "num_topk", num_topk, 0, MAX_EXPERTS)
    _int_arg(op, "pad_multiple", pad_multiple, 0)
    if isinstance(num_permuted_tokens, bool) or not isinstance(num_permuted_tokens, int):
        raise ValueError(f"{op}: argument 'num_permuted_tokens' must be an int; got {num_permuted_tokens!r}")
    _int_arg(op, "scales_per_token", scales_per_token, 0)
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{op}: argument 'tokens' must be a torch.Tensor, got {type(tokens).__name__}")
    if use_fp8:
        if tokens.dtype not in _FP8_TOKENS:
            raise TypeError(f"{op}: argument 'tokens' has dtype {tokens.dtype}; use_fp8 expects float8_e4m3fn, "
                            "float8_e5m2 or uint8")
    elif tokens.dtype not in _DTYPES:
        hint = " (pass use_fp8=True for quantized tokens)" if tokens.dtype in _FP8_TOKENS else ""
        raise TypeError(f"{op}: argument 'tokens' has dtype {tokens.dtype}; expected float32, float16 or bfloat16{hint}")
    if tokens.dim() != 2:
        raise ValueError(f"{op}: argument 'tokens' has shape {tuple(tokens.shape)}; expected [num_tokens, hidden]")
    t, h = tokens.shape
    if use_fp8 and h % 16:
        raise ValueError(f"{op}: FP8 tokens need a hidden size that is a multiple of 16; got {h}")
    if not isinstance(expert_map, torch.Tensor) or expert_map.dtype not in (torch.bool, torch.int32, torch.int64):
        raise TypeError(f"{op}: argument 'expert_map' must be a bool routing map or int32/int64 expert indices")
    is_mask = expert_map.dtype == torch.bool
    want = [t, e] if is_mask else [t, num_topk]
    if expert_map.dim() != 2 or list(expert_map.shape) != want or (not is_mask and num_topk < 1):
        what = "[num_tokens, num_local_experts]" if is_mask else "[num_tokens, num_topk] with num_topk >= 1"
        raise ValueError(f"{op}: argument 'expert_map' has shape {tuple(expert_map.shape)}; expected {what} = {want}")
    probs_topk = probs is not None and probs_layout == "topk"
    if probs is not None:
        if probs_topk and is_mask:
            raise ValueError(f"{op}: probs_layout='topk' needs expert indices in expert_map; a bool routing map takes "
                             "probs_layout='routing_map' ([num_tokens, num_local_experts] probs)")
        _float_probs(op, "probs", probs, (t, num_topk if probs_topk else e))
    scales = None
    if scaling_factor is not None and not isinstance(scaling_factor, torch.Tensor):
        raise TypeError(
            f"{op}: argument 'scaling_factor' must be a float32 torch.Tensor or None, "
            f"got {type(scaling_factor).__name__}"
        )
    if use_fp8 and scaling_factor is not None:
        if scales_per_token <= 0:
            raise ValueError(f"{op}: scales_per_token must be > 0 when use_fp8=True and scaling_factor is given")
        if not isinstance(scaling_factor, torch.Tensor) or scaling_factor.dtype != torch.float32:
            raise TypeError(f"{op}: argument 'scaling_factor' must be a float32 torch.Tensor")
        if tuple(scaling_factor.shape) != (t, scales_per_token):
            raise ValueError(f"{op}: argument 'scaling_factor' has shape {tuple(scaling_factor.shape)}; expected "
                             f"[{t}, {scales_per_token}] (num_tokens x scales_per_token)")
        scales = scaling_factor.contiguous()
    bound = t * (e if is_mask else num_topk) + e * max(pad_multiple - 1, 0)
    if max(bound, num_permuted_tokens) >= 2**31 - 1:
        raise ValueError(f"{op}: up to {max(bound, num_permuted_tokens)} permuted rows; at most 2**31 - 2 are supported")
    extra = {"probs": probs} if probs is not None else {}
    if scales is not None:
        extra["scaling_factor"] = scales
    check_cuda_tensors(op, tokens=tokens, expert_map=expert_map, **extra)
    tokens = tokens.contiguous()
    if use_fp8 and tokens.storage_offset() % 16:
        tokens = tokens.clone()  # 16-byte aligned rows
    width = num_topk if probs_topk else e
    args = (tokens, expert_map.contiguous(), probs.contiguous() if probs is not None else None, scales, e,
            pad_multiple, num_permuted_tokens, probs_topk)
    needs_grad = torch.is_grad_enabled() and (tokens.requires_grad or (probs is not None and probs.requires_grad))
    # Without a gradient to compute, the native op alone (no autograd.Function around it).
    if not needs_grad:
        outs = _moe_permute_op(*args)
    elif scales is None and not use_fp8 and native.eager_cpp_autograd():
        outs = _moe_permute_train(args[0], args[1], args[2], e, pad_multiple, num_permuted_tokens, probs_topk, width)
    else:
        outs = _MoePermute.apply(*args, width)
    out, row_id_map, tpe, overflow, nd, pscales, pprobs = outs
    return (
        out,
        row_id_map,
        tpe,
        overflow,
        nd,
        pscales if scales is not None else None,
        pprobs if probs is not None else None,
    )


@native.raises_python_errors
def moe_unpermute(
    permuted_tokens: torch.Tensor,
    row_id_map: torch.Tensor,
    num_dispatched_tokens_tensor: torch.Tensor,
    *,
    restore_shape,
    num_local_experts: int,
    permuted_probs: torch.Tensor | None = None,
    probs_topk_stride: int = 0,
    pad_multiple: int = 0,
):
    """Sums each token's permuted rows back: returns ``(unpermuted_tokens, unpermuted_probs)``.

    ``unpermuted_tokens[t] = sum of permuted_tokens[row]`` over token ``t``'s rows in ``row_id_map``
    (from :func:`moe_permute`), in fp32 and expert order (bitwise reproducible); padding rows are
    skipped, tokens without a route get zeros. With ``permuted_probs`` (``[rows]``),
    ``unpermuted_probs`` (``[num_tokens, probs_topk_stride or num_local_experts]``) carries each
    row's probability back to its column, zero elsewhere; else it is None.

    Args:
        restore_shape: ``(num_tokens, hidden)``, the shape of the tokens ``moe_permute`` took.
        num_dispatched_tokens_tensor: the int32 ``[1]`` count from ``moe_permute`` (checked; the map
            alone decides which rows are read).
        probs_topk_stride: 0 (probabilities per expert) or the ``num_topk`` of a ``probs_layout="topk"``
            permute; must match the permute.
        pad_multiple: 0, or the permute's value (its padding rows are found from ``row_id_map``).

    Differentiable in ``permuted_tokens`` and ``permuted_probs``: the backward copies each token's
    gradient to its rows (padding and unused rows get zero).
    """
    op = "moe_unpermute"
    e = _int_arg(op, "num_local_experts", num_local_experts, 1, MAX_EXPERTS)
    _int_arg(op, "probs_topk_stride", probs_topk_stride, 0, MAX_EXPERTS)
    _int_arg(op, "pad_multiple", pad_multiple, 0)
    _check_tokens(op, "permuted_tokens", permuted_tokens)
    if not isinstance(row_id_map, torch.Tensor) or row_id_map.dtype != torch.int32 or row_id_map.dim() != 2:
        raise TypeError(f"{op}: argument 'row_id_map' must be the int32 2-D map of moe_permute")
    if row_id_map.shape[1] != 2 * e + 1:
        raise ValueError(f"{op}: argument 'row_id_map' has shape {tuple(row_id_map.shape)}; expected "
                         f"[num_tokens + pad_multiple, {2 * e + 1}] for {e} experts")
    try:
        t, h = (operator.index(v) for v in restore_shape)  # never a float, truncated
    except (TypeError, ValueError):
        raise ValueError(f"{op}: argument 'restore_shape' must be (num_tokens, hidden); got {restore_shape!r}") from None
    if h != permuted_tokens.shape[1] or t < 0 or t > row_id_map.shape[0]:
        raise ValueError(f"{op}: argument 'restore_shape' is {tuple(restore_shape)}; expected (num_tokens, "
                         f"{permuted_tokens.shape[1]}) with num_tokens <= {row_id_map.shape[0]} (rows of row_id_map)")
    pad_rows = row_id_map.shape[0] - t
    if pad_multiple not in (0, pad_rows):
        raise ValueError(f"{op}: argument 'pad_multiple' is {pad_multiple}, but row_id_map has {pad_rows} padding rows "
                         f"for {t} tokens; pass the permute's pad_multiple (or 0)")
    if (
        not isinstance(num_dispatched_tokens_tensor, torch.Tensor)
        or num_dispatched_tokens_tensor.dtype != torch.int32
        or num_dispatched_tokens_tensor.numel() != 1
    ):
        raise TypeError(f"{op}: argument 'num_dispatched_tokens_tensor' must be the int32 [1] tensor of moe_permute")
    if permuted_probs is not None:
        _float_probs(op, "permuted_probs", permuted_probs, (permuted_tokens.shape[0],))
    extra = {"permuted_probs": permuted_probs} if permuted_probs is not None else {}
    check_cuda_tensors(op, permuted_tokens=permuted_tokens, row_id_map=row_id_map, **extra)
    width = probs_topk_stride if probs_topk_stride > 0 else e
    args = (
        permuted_tokens.contiguous(),
        row_id_map.contiguous(),
        permuted_probs.contiguous() if permuted_probs is not None else None,
        t,
        e,
        width,
    )
    needs_grad = torch.is_grad_enabled() and (
        permuted_tokens.requires_grad or (permuted_probs is not None and permuted_probs.requires_grad)
    )
    if not needs_grad:
        out, probs = _moe_gather_op(*args)
    elif native.eager_cpp_autograd():
        out, probs = _moe_unpermute_train(*args)
    else:
        out, probs = _MoeUnpermute.apply(*args)
    return out, (probs if permuted_probs is not None else None)
