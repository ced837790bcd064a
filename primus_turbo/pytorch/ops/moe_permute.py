"""turbo.ops.token_permute / token_unpermute: MoE token permutation by a routing mask, forward
and backward, on the library's CUDA kernels (kernels/moe/permute.cuh). They move data and never
round it: a permuted row is a bit copy of its token, and a merge without probabilities is a sum."""


import torch

from primus_turbo._core import check, lib
from primus_turbo.pytorch.core import library
from primus_turbo.pytorch.core.tensor_bridge import current_stream_handle, device_guard, to_pt
from primus_turbo.pytorch.ops._checks import check_cuda_tensors

__all__ = ["token_permute", "token_unpermute"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_EXPERTS = 1024


def _opt(t):
    return to_pt(t) if t is not None else None


def _call(fn, *args, context: str) -> None:
    status = fn(*args)
    if status:
        check(status, context=context)


# ---- registered ops ----------------------------------------------------------------------------


def _permute_cuda(tokens, routing_map, probs, num_out: int):
    t, h = tokens.shape
    e = routing_map.shape[1]
    out = torch.empty((num_out, h), dtype=tokens.dtype, device=tokens.device)
    row_id_map = torch.empty((t, e), dtype=torch.int32, device=tokens.device)
    pprobs = torch.empty(
        (num_out if probs is not None else 0,),
        dtype=probs.dtype if probs is not None else torch.float32,
        device=tokens.device,
    )
    workspace = torch.empty((2 * e + 1,), dtype=torch.int32, device=tokens.device)
    rmap = routing_map.view(torch.uint8) if routing_map.dtype == torch.bool else routing_map
    with device_guard(tokens.device):
        _call(
            lib.pt_moe_permute,
            to_pt(tokens),
            to_pt(rmap),
            _opt(probs),
            to_pt(out),
            _opt(pprobs if probs is not None else None),
            to_pt(row_id_map),
            to_pt(workspace),
            current_stream_handle(tokens.device),
            context="token_permute",
        )
    return out, pprobs, row_id_map


def _permute_fake(tokens, routing_map, probs, num_out):
    pprobs = tokens.new_empty(
        (num_out if probs is not None else 0,), dtype=probs.dtype if probs is not None else torch.float32
    )
    return (
        tokens.new_empty((num_out, tokens.shape[1])),
        pprobs,
        tokens.new_empty(tuple(routing_map.shape), dtype=torch.int32),
    )


def _scatter_cuda(tokens, row_id_map, num_out: int):
    out = torch.zeros((num_out, tokens.shape[1]), dtype=tokens.dtype, device=tokens.device)
    with device_guard(tokens.device):
        _call(
            lib.pt_moe_permute,
            to_pt(tokens),
            None,
            None,
            to_pt(out),
            None,
            to_pt(row_id_map),
            None,
            current_stream_handle(tokens.device),
            context="token_unpermute backward",
        )
    return out


def _scatter_fake(tokens, row_id_map, num_out):
    return tokens.new_empty((num_out, tokens.shape[1]))


def _unpermute_cuda(inp, row_id_map, merging_probs, permuted_probs):
    t, e = row_id_map.shape
    out = torch.empty((t, inp.shape[1]), dtype=inp.dtype, device=inp.device)
    probs_grad = None
    if permuted_probs is not None:
        probs_grad = torch.empty((t, e), dtype=permuted_probs.dtype, device=inp.device)
    with device_guard(inp.device):
        _call(
            lib.pt_moe_unpermute,
            to_pt(inp),
            to_pt(row_id_map),
            _opt(merging_probs),
            to_pt(out),
            _opt(permuted_probs),
            _opt(probs_grad),
            current_stream_handle(inp.device),
            context="token_unpermute",
        )
    if probs_grad is None:
        probs_grad = inp.new_empty((0,), dtype=torch.float32)
    return out, probs_grad


def _unpermute_fake(inp, row_id_map, merging_probs, permuted_probs):
    t, e = row_id_map.shape
    pg = (
        inp.new_empty((t, e), dtype=permuted_probs.dtype)
        if permuted_probs is not None
        else inp.new_empty((0,), dtype=torch.float32)
    )
    return inp.new_empty((t, inp.shape[1])), pg


def _unpermute_bwd_cuda(grad_out, fwd_input, row_id_map, merging_probs):
    grad_in = torch.zeros_like(fwd_input)  # rows no token references (padding) get zero gradient
    grad_probs = torch.empty_like(merging_probs)
    with device_guard(grad_out.device):
        _call(
            lib.pt_moe_unpermute_bwd,
            to_pt(grad_out),
            to_pt(fwd_input),
            to_pt(row_id_map),
            to_pt(merging_probs),
            to_pt(grad_in),
            to_pt(grad_probs),
            current_stream_handle(grad_out.device),
            context="token_unpermute backward",
        )
    return grad_in, grad_probs


def _unpermute_bwd_fake(grad_out, fwd_input, row_id_map, merging_probs):
    return torch.empty_like(fwd_input), torch.empty_like(merging_probs)


_permute_op = library.define_op(
    "moe_token_permute(Tensor tokens, Tensor routing_map, Tensor? probs, int num_out) -> (Tensor, Tensor, Tensor)",
    _permute_cuda,
    _permute_fake,
)
_scatter_op = library.define_op(
    "moe_token_scatter(Tensor tokens, Tensor row_id_map, int num_out) -> Tensor", _scatter_cuda, _scatter_fake
)
_unpermute_op = library.define_op(
    "moe_token_unpermute(Tensor input, Tensor row_id_map, Tensor? merging_probs, Tensor? permuted_probs) -> (Tensor, Tensor)",
    _unpermute_cuda,
    _unpermute_fake,
)
_unpermute_bwd_op = library.define_op(
    "moe_token_unpermute_bwd(Tensor grad_output, Tensor fwd_input, Tensor row_id_map, Tensor merging_probs) -> (Tensor, Tensor)",
    _unpermute_bwd_cuda,
    _unpermute_bwd_fake,
)


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, routing_map, probs, num_out: int):
        out, pprobs, row_id_map = _permute_op(tokens, routing_map, probs, num_out)
        ctx.save_for_backward(row_id_map)
        ctx.with_probs = probs is not None
        ctx.mark_non_differentiable(row_id_map)
        return out, pprobs, row_id_map

    @staticmethod
    def backward(ctx, grad_out, grad_pprobs, _):
        (row_id_map,) = ctx.saved_tensors
        pp = grad_pprobs.contiguous() if ctx.with_probs else None
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


def _check_probs(op: str, name: str, p, shape) -> None:
    if not isinstance(p, torch.Tensor) or p.dtype not in _DTYPES:
        raise TypeError(f"{op}: argument '{name}' must be a float32, float16 or bfloat16 torch.Tensor")
    if tuple(p.shape) != tuple(shape):
        raise ValueError(f"{op}: argument '{name}' has shape {tuple(p.shape)}; expected {list(shape)}")


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
    if num_out_tokens == -1:
        num_out_tokens = int(routing_map.count_nonzero().item())
    out, pprobs, row_id_map = _Permute.apply(
        inp.contiguous(), routing_map.contiguous(), probs.contiguous() if probs is not None else None, num_out_tokens
    )
    return out, (pprobs if probs is not None else None), row_id_map


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
    if restore_shape is not None and tuple(restore_shape) != (row_id_map.shape[0], inp.shape[1]):
        raise ValueError(
            f"{op}: argument 'restore_shape' is {tuple(restore_shape)}; expected ({row_id_map.shape[0]}, {inp.shape[1]})"
        )
    extra = {"merging_probs": merging_probs} if merging_probs is not None else {}
    check_cuda_tensors(op, inp=inp, row_id_map=row_id_map, **extra)
    mp = merging_probs.contiguous() if merging_probs is not None else None
    return _Unpermute.apply(inp.contiguous(), row_id_map.contiguous(), mp)
