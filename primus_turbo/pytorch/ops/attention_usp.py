"""``turbo.ops.flash_attn_usp_func`` (and its FP8 and varlen forms): context-parallel attention
over a 2-D mesh of ranks, Ulysses (all-to-all over heads) times ring (K/V passed around), exact
(blocks merged by log-sum-exp).

Each rank holds a shard of the sequence, ``[B, S, H, D]``. By default the global sequence is the
ranks' shards in the order (ring rank, Ulysses rank): the shard of the rank at ring position ``r``
and Ulysses position ``u`` holds tokens ``[(r * U + u) * S, (r * U + u + 1) * S)``, as a mesh built
``init_device_mesh(.., (ring, ulysses))`` numbers them (:func:`shard_positions` gives any rank's
positions, for either order).

Forward on each rank:
  1. Ulysses: one all-to-all over the Ulysses group (q, k and v in one buffer) trades heads for
     sequence: ``[B, S, H, D]`` -> ``[B, U * S, H / U, D]``, the ring position's chunk of the sequence.
  2. Ring: R steps. At step j the rank holds the K/V chunk of ring position ``r - j`` and runs the
     attention kernel (``flash_attn_func``'s native op, our kernels or cuDNN) of its queries against
     it, while the next chunk is already on its way (NCCL send/receive on their own stream). With
     ``causal``, chunks from later positions are skipped and the rank's own chunk is causal; earlier
     ones are seen whole. Partial results are merged in float32 by their log-sum-exp.
  3. Ulysses again: the output back to ``[B, S, H, Dv]``.
The backward mirrors it: the Ulysses exchanges are differentiable steps whose backward is the
inverse exchange, and the ring's backward runs, at every step, the attention backward of its block
against the merged output and log-sum-exp (so each block's share is exact); dQ is summed locally in
float32, and each chunk's dK/dV sum travels with it around the ring and one more hop home.
With a ring of one rank the local call is ``flash_attn_func`` itself (``flash_attn_fp8_func`` for
``flash_attn_fp8_usp_func``, ``flash_attn_varlen_func`` for ``flash_attn_varlen_usp_func``), with
everything it takes.

Contiguous chunks leave causal work unbalanced over the ring (position 0 computes one block, the
last R). ``seq_layout="zigzag"`` takes shards in the load-balanced order instead (each ring position
holds chunk r and chunk 2R-1-r of 2R; :func:`shard_positions`): every step then computes half a
block on every rank. Sliding windows are taken when the ring has one rank (Ulysses only), where the
whole sequence is in one call.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from primus_turbo.pytorch.core import native
from primus_turbo.pytorch.ops.attention import (
    _bwd_op,
    _common_args,
    _fwd_op,
    backend_code,
    flash_attn_func,
    flash_attn_varlen_func,
)
from primus_turbo.pytorch.ops.attention_fp8 import flash_attn_fp8_func

__all__ = ["flash_attn_usp_func", "flash_attn_fp8_usp_func", "flash_attn_varlen_usp_func", "mesh_groups",
           "shard_positions"]

_OP = "flash_attn_usp_func"
_LAYOUTS = ("contiguous", "zigzag")


# ---- the two exchanges --------------------------------------------------------------------------


def _group_size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _all_to_all(send: torch.Tensor, group) -> torch.Tensor:
    """send ``[n, L]``: row i goes to the group's rank i; returns the rows received, by sender."""
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv


def _exchange(tensors, group, to_rows, from_rows):
    """One all-to-all over ``group`` for several tensors: ``to_rows(t)`` lays each out as ``[U, n]``
    (row i goes to the group's rank i), the rows are sent side by side in one buffer, and
    ``from_rows(rows, t)`` turns each tensor's ``[U, n]`` received rows (by sender) into its result."""
    u = _group_size(group)
    recv = _all_to_all(torch.cat([to_rows(t, u) for t in tensors], dim=1), group)
    out, at = [], 0
    for t in tensors:
        n = t.numel() // u
        out.append(from_rows(recv[:, at:at + n], t, u))
        at += n
    return out


def seq_to_heads(tensors, group):
    """Ulysses' forward exchange of ``[B, S, H_i, D_i]`` shards (one all-to-all for all of them):
    ``[B, U * S, H_i / U, D_i]``, the Ulysses ranks' shards in rank order, head group ``u`` of each."""
    if _group_size(group) == 1:
        return list(tensors)

    def to_rows(t, u):
        b, s, h, d = t.shape
        return t.reshape(b, s, u, h // u, d).permute(2, 0, 1, 3, 4).reshape(u, -1)

    def from_rows(rows, t, u):
        b, s, h, d = t.shape
        return rows.reshape(u, b, s, h // u, d).permute(1, 0, 2, 3, 4).reshape(b, u * s, h // u, d)

    return _exchange(tensors, group, to_rows, from_rows)


def heads_to_seq(tensors, group):
    """The inverse of :func:`seq_to_heads`: ``[B, U * S, H_i / U, D_i]`` -> ``[B, S, H_i, D_i]``."""
    if _group_size(group) == 1:
        return list(tensors)

    def to_rows(t, u):
        b, us, hl, d = t.shape
        return t.reshape(b, u, us // u, hl, d).permute(1, 0, 2, 3, 4).reshape(u, -1)

    def from_rows(rows, t, u):
        b, us, hl, d = t.shape
        return rows.reshape(u, b, us // u, hl, d).permute(1, 2, 0, 3, 4).reshape(b, us // u, u * hl, d)

    return _exchange(tensors, group, to_rows, from_rows)


def lse_heads_to_seq(lse: torch.Tensor, group) -> torch.Tensor:
    """The log-sum-exp ``[B, H / U, U * S]`` of the local heads -> the caller's ``[B, H, S]``."""
    if _group_size(group) == 1:
        return lse

    def to_rows(t, u):
        b, hl, us = t.shape
        return t.reshape(b, hl, u, us // u).permute(2, 0, 1, 3).reshape(u, -1)

    def from_rows(rows, t, u):
        b, hl, us = t.shape
        return rows.reshape(u, b, hl, us // u).permute(1, 0, 2, 3).reshape(b, u * hl, us // u)

    return _exchange((lse,), group, to_rows, from_rows)[0]


class _Ring:
    """A rank's place in the ring group and the one exchange it does: send a buffer to the next
    position while receiving the previous position's."""

    def __init__(self, group):
        self.group, self.size = group, _group_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)
        if self.size > 1:
            self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
            self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def shift(self, buf: torch.Tensor):
        recv = torch.empty_like(buf)
        ops = [dist.P2POp(dist.isend, buf, self.next, self.group), dist.P2POp(dist.irecv, recv, self.prev, self.group)]
        return recv, dist.batch_isend_irecv(ops)

    def block(self, step: int, causal: bool, zigzag: bool, seq: int):
        """What step computes: None (nothing of the chunk held is visible), or (the query rows,
        the key rows, the window's right side) of the local [B, seq, ..] tensors. Contiguous
        shards: earlier chunks whole, the own chunk causal, later ones skipped. Zigzag (the local
        sequence is chunk r then chunk 2R-1-r, both halves of seq): the own pair causal; an
        earlier position's pair, its first half seen by every query; a later one's, whole but
        seen by the second half of the queries only. Either way half a block each step."""
        src = (self.rank - step) % self.size
        every = slice(None)
        if not causal:
            return every, every, -1
        if src == self.rank:
            return every, every, 0
        if not zigzag:
            return (every, every, -1) if src < self.rank else None
        half = seq // 2
        return (every, slice(0, half), -1) if src < self.rank else (slice(half, None), every, -1)


def _wait(requests) -> None:
    for r in requests:
        r.wait()


def _held_chunks(ring: _Ring, kv: torch.Tensor):
    """Yields (step, the packed K/V chunk held at that step), R steps; the next step's chunk is
    already on its way while the caller works on this one."""
    for step in range(ring.size):
        last = step + 1 == ring.size
        if not last:
            kv_next, pending = ring.shift(kv)
        yield step, kv
        if not last:
            _wait(pending)
            kv = kv_next


def _pack(tensors, dtype=None) -> torch.Tensor:
    return torch.cat([t.reshape(-1) if dtype is None else t.reshape(-1).to(dtype) for t in tensors])


def _unpack(buf: torch.Tensor, likes):
    out, at = [], 0
    for t in likes:
        out.append(buf[at:at + t.numel()].view(t.shape))
        at += t.numel()
    return out


# ---- the single-device kernels (replaced by a float reference in the CPU tests) -----------------


def block_forward(q, k, v, scale, wl, wr, code):
    """(out, lse [B, H, Sq] float32) of q against one K/V chunk."""
    return _fwd_op(q, k, v, None, None, None, q.shape[1], k.shape[1], scale, wl, wr, code)


def local_attention(q, k, v, scale, wl, wr, deterministic):
    """(out, lse) of the whole (Ulysses-gathered) sequence when the ring has one rank: the
    differentiable flash_attn_func."""
    return flash_attn_func(q, k, v, softmax_scale=scale, window_size=(wl, wr), deterministic=deterministic,
                           return_lse=True)


def local_varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, deterministic):
    """(out [T, H, Dv], lse [H, T]) of the whole packed batch: the differentiable
    flash_attn_varlen_func."""
    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, window_size=(wl, wr),
                                  deterministic=deterministic, return_lse=True)


def block_backward(dout, q, k, v, out, lse, scale, wl, wr, code, deterministic):
    """(dq, dk, dv) of one block given the merged out and lse."""
    dq, dk, dv, _ = _bwd_op(dout, q, k, v, out, lse, None, None, None, q.shape[1], k.shape[1], scale, wl, wr, code,
                            deterministic)
    return dq, dk, dv


# ---- the ring ----------------------------------------------------------------------------------


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    """Sums run in float32 (float64 for float64 tensors, which the CPU tests' reference blocks use)."""
    return torch.promote_types(t.dtype, torch.float32)


def _merge(acc, lse_acc, out, lse):
    """Float32 running output and log-sum-exp with one more block's."""
    new = torch.logaddexp(lse_acc, lse)
    keep = torch.exp(lse_acc - new).transpose(1, 2).unsqueeze(-1)  # [B, S, H, 1]
    add = torch.exp(lse - new).transpose(1, 2).unsqueeze(-1)
    return acc * keep + out.to(acc.dtype) * add, new


def ring_forward(ring: _Ring, q, k, v, scale, causal, zigzag, code):
    acc = lse_acc = None
    for step, kv in _held_chunks(ring, _pack((k, v))):
        plan = ring.block(step, causal, zigzag, q.shape[1])
        if plan is None:
            continue
        rows, keys, wr = plan
        kk, vv = _unpack(kv, (k, v))
        out, lse = block_forward(q[:, rows], kk[:, keys], vv[:, keys], scale, -1, wr, code)
        if acc is None:  # step 0: the own chunk, every row
            acc, lse_acc = out.to(_acc_dtype(out)), lse.clone()
        else:
            acc[:, rows], lse_acc[:, :, rows] = _merge(acc[:, rows], lse_acc[:, :, rows], out, lse)
    return acc.to(q.dtype), lse_acc


def ring_backward(ring: _Ring, dout, q, k, v, out, lse, scale, causal, zigzag, code, deterministic):
    acc_dtype = _acc_dtype(q)
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    acc_recv = acc_pending = None
    for step, kv in _held_chunks(ring, _pack((k, v))):
        plan = ring.block(step, causal, zigzag, q.shape[1])
        share = None
        if plan is not None:
            rows, keys, wr = plan
            kk, vv = _unpack(kv, (k, v))
            dq_j, dk_j, dv_j = block_backward(dout[:, rows], q[:, rows], kk[:, keys], vv[:, keys], out[:, rows],
                                              lse[:, :, rows].contiguous(), scale, -1, wr, code, deterministic)
            dq[:, rows] += dq_j
            share = (dk_j, dv_j, keys)
        # The running dK/dV of the chunk held now: from the previous position (started empty at step 0).
        if acc_pending is not None:
            _wait(acc_pending)
            acc = acc_recv
        else:
            acc = torch.zeros(kv.numel(), dtype=acc_dtype, device=kv.device)
        if share is not None:  # this rank's share, into the keys it covered
            dk_j, dv_j, keys = share
            dk_acc, dv_acc = _unpack(acc, (k, v))
            dk_acc[:, keys] += dk_j
            dv_acc[:, keys] += dv_j
        acc_recv, acc_pending = ring.shift(acc)  # after the last step: one hop home
    _wait(acc_pending)
    dk, dv = (t.to(like.dtype) for t, like in zip(_unpack(acc_recv, (k, v)), (k, v)))
    return dq.to(q.dtype), dk, dv


# ---- autograd and the entry points ---------------------------------------------------------------


class _SeqToHeads(torch.autograd.Function):
    """:func:`seq_to_heads` as a differentiable step: its backward is the inverse exchange."""

    @staticmethod
    def forward(ctx, group, *tensors):
        ctx.group = group  # gradients of unused outputs come as zeros (materialized by autograd)
        return tuple(seq_to_heads(tensors, group))

    @staticmethod
    def backward(ctx, *grads):
        return None, *heads_to_seq(grads, ctx.group)


class _HeadsToSeq(torch.autograd.Function):
    """:func:`heads_to_seq` of one tensor as a differentiable step."""

    @staticmethod
    def forward(ctx, group, t):
        ctx.group = group
        return heads_to_seq((t,), group)[0]

    @staticmethod
    def backward(ctx, grad):
        return None, seq_to_heads((grad.contiguous(),), ctx.group)[0]


class RingAttnFunction(torch.autograd.Function):
    """The ring steps over the Ulysses-local tensors ``[B, U * S, H / U, D]``."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, zigzag, deterministic, ring):
        code = backend_code()
        out, lse = ring_forward(ring, q, k, v, scale, causal, zigzag, code)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (scale, causal, zigzag, code, deterministic, ring)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 8
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, zigzag, code, deterministic, ring = ctx.args
        dq, dk, dv = ring_backward(ring, dout.contiguous(), q, k, v, out, lse, scale, causal, zigzag, code,
                                   deterministic)
        return dq, dk, dv, *(None,) * 5


def _usp(attention, q, k, v, return_lse, ulysses_group):
    """Ulysses around ``attention(q, k, v) -> (out, lse)`` of the local heads. Fewer K/V heads than
    Ulysses ranks (MQA, narrow GQA): each K/V head is repeated to one a rank first (rank u's query
    heads all read repeated head u, which is their own K/V head); autograd sums the repeats'
    gradients."""
    u = _group_size(ulysses_group)
    if u == 1:
        return _finish(attention(q, k, v), return_lse)
    if k.shape[2] < u:
        k, v = (t.repeat_interleave(u // k.shape[2], dim=2) for t in (k, v))
    ql, kl, vl = _SeqToHeads.apply(ulysses_group, q, k, v)
    out, lse = attention(ql, kl, vl)
    out = _HeadsToSeq.apply(ulysses_group, out)
    return _finish((out, lse_heads_to_seq(lse.detach(), ulysses_group) if return_lse else None), return_lse)


def _finish(result, return_lse):
    return result if return_lse else result[0]


def _check(op, q, k, v, ulysses_group, ring_group, window, causal, same_tokens=True):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{op}: argument '{name}' must be a 4-D tensor [B, S, H, D] (this rank's shard)")
    if (same_tokens and k.shape[:2] != q.shape[:2]) or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"{op}: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} must share B and S (each rank "
            "holds the same tokens of q, k and v), and k and v their heads"
        )
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"{op}: argument '{name}' is {t.dtype} on {t.device}; q is {q.dtype} on {q.device} (the "
                            "exchanges send q, k and v as one buffer)")
    for name, group in (("ulysses_group", ulysses_group), ("ring_group", ring_group)):
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"{op}: argument '{name}' must be a torch.distributed ProcessGroup or None")
        if group is not None and not dist.is_initialized():
            raise RuntimeError(f"{op}: argument '{name}' given but torch.distributed is not initialized")
        if group is not None and dist.get_rank(group) < 0:
            raise ValueError(f"{op}: this rank is not a member of argument '{name}'")
    u = _group_size(ulysses_group)
    if q.shape[2] % u:
        raise ValueError(f"{op}: argument 'q' has {q.shape[2]} heads, not a multiple of the Ulysses group's {u} ranks")
    hkv = k.shape[2]
    if (hkv % u if hkv >= u else u % hkv) or q.shape[2] % hkv:
        raise ValueError(f"{op}: argument 'k' has {hkv} heads; with {q.shape[2]} query heads and {u} Ulysses ranks "
                         "they must divide the query heads and be a multiple or a divisor of the Ulysses size")
    if _group_size(ring_group) > 1 and window != (-1, 0 if causal else -1):
        raise NotImplementedError(
            f"{op}: argument 'window_size' is not supported with more than one ring rank (use Ulysses alone)"
        )
    if os.environ.get("PRIMUS_TURBO_CHECK_USP_SHAPES", "0") not in ("", "0"):
        _check_same_on_every_rank(op, (q, k, v), ulysses_group, ring_group)


def _check_same_on_every_rank(op, tensors, *groups) -> None:
    """With PRIMUS_TURBO_CHECK_USP_SHAPES=1: every rank of both groups passed the same shapes and
    dtypes (the exchanges assume it; a rank that differs would otherwise hang the collective or
    corrupt the result). Costs a gather and a host synchronization per call; debug only."""
    mine = tuple((tuple(t.shape), str(t.dtype)) for t in tensors)
    for group in groups:
        if _group_size(group) == 1:
            continue
        seen = [None] * _group_size(group)
        dist.all_gather_object(seen, mine, group=group)
        if any(other != mine for other in seen):
            raise ValueError(f"{op}: the ranks passed different q, k, v shapes or dtypes (every rank must pass the "
                             f"same): {seen}")


def _entry(op, q, k, v, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes, return_attn_probs,
           ulysses_group, ring_group, ulysses_only: str = "", same_tokens: bool = True):
    """The entry points' shared checks: (softmax scale, window left, window right). ulysses_only
    names what a ring of more than one rank does not take yet (NotImplementedError)."""
    scale, wl, wr, _ = _common_args(op, q, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes,
                                    return_attn_probs, None)
    _check(op, q, k, v, ulysses_group, ring_group, (wl, wr), bool(causal), same_tokens)
    if ulysses_only and _group_size(ring_group) > 1:
        raise NotImplementedError(f"{op}: argument 'ring_group' must have one rank ({ulysses_only} over a ring is not "
                                  "implemented; use ulysses_group)")
    return scale, wl, wr


def _check_layout(op, seq_layout) -> None:
    if seq_layout not in _LAYOUTS:
        raise ValueError(f"{op}: argument 'seq_layout' is {seq_layout!r}; expected one of {_LAYOUTS}")


def _zigzag(op, seq_layout, q, ulysses_group, ring_group) -> bool:
    _check_layout(op, seq_layout)
    zigzag = seq_layout == "zigzag" and _group_size(ring_group) > 1
    if zigzag and (q.shape[1] * _group_size(ulysses_group)) % 2:
        raise ValueError(f"{op}: seq_layout 'zigzag' needs an even number of tokens per ring position (q has "
                         f"{q.shape[1]} a rank, {_group_size(ulysses_group)} Ulysses ranks)")
    return zigzag


def mesh_groups(ring_size: int, ulysses_size: int):
    """This rank's (ulysses_group, ring_group) of a (ring x Ulysses) mesh over the default process
    group, global rank = ring position * ulysses_size + Ulysses position (the order of
    :func:`shard_positions`). Every rank must call it (it creates every group, in one order)."""
    world = dist.get_world_size()
    for name, n in (("ring_size", ring_size), ("ulysses_size", ulysses_size)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"mesh_groups: argument '{name}' must be a positive int, got {n!r}")
    if ring_size * ulysses_size != world:
        raise ValueError(f"mesh_groups: ring_size x ulysses_size = {ring_size} x {ulysses_size} must equal the "
                         f"world size {world}")
    rank = dist.get_rank()
    mine = {}
    for r in range(ring_size):
        group = dist.new_group([r * ulysses_size + u for u in range(ulysses_size)])
        if rank // ulysses_size == r:
            mine["ulysses"] = group
    for u in range(ulysses_size):
        group = dist.new_group([r * ulysses_size + u for r in range(ring_size)])
        if rank % ulysses_size == u:
            mine["ring"] = group
    return mine["ulysses"], mine["ring"]


def shard_positions(seqlen: int, ring_size: int, ring_rank: int, ulysses_size: int = 1, ulysses_rank: int = 0,
                    seq_layout: str = "contiguous") -> torch.Tensor:
    """The global token positions (int64, ascending within each chunk) that the rank at
    (``ring_rank``, ``ulysses_rank``) holds for :func:`flash_attn_usp_func` over a sequence of
    ``seqlen`` tokens: ``x[:, shard_positions(...)]`` is its shard. ``"contiguous"``: block
    ``ring_rank * ulysses_size + ulysses_rank`` of ``ring_size * ulysses_size`` equal blocks.
    ``"zigzag"``: the sequence cut into ``2 * ring_size`` chunks; ring position r holds chunk r
    followed by chunk ``2 * ring_size - 1 - r``, split in order over its Ulysses ranks."""
    _check_layout("shard_positions", seq_layout)
    if not (0 <= ring_rank < ring_size and 0 <= ulysses_rank < ulysses_size):
        raise ValueError(f"shard_positions: ring_rank {ring_rank} / ulysses_rank {ulysses_rank} out of range for a "
                         f"ring of {ring_size} x Ulysses {ulysses_size}")
    parts = (2 if seq_layout == "zigzag" and ring_size > 1 else 1) * ring_size * ulysses_size
    if seqlen % parts:
        raise ValueError(f"shard_positions: seqlen {seqlen} does not split into {parts} equal parts ({seq_layout}, "
                         f"ring {ring_size} x Ulysses {ulysses_size})")
    per_ring = seqlen // ring_size
    shard = per_ring // ulysses_size
    if seq_layout == "zigzag" and ring_size > 1:
        c = seqlen // (2 * ring_size)
        pair = torch.cat([torch.arange(ring_rank * c, (ring_rank + 1) * c),
                          torch.arange((2 * ring_size - 1 - ring_rank) * c, (2 * ring_size - ring_rank) * c)])
    else:
        pair = torch.arange(ring_rank * per_ring, (ring_rank + 1) * per_ring)
    return pair[ulysses_rank * shard:(ulysses_rank + 1) * shard]


@native.raises_python_errors
def flash_attn_usp_func(
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
    ulysses_group=None,
    ring_group=None,
    *,
    seq_layout: str = "contiguous",
):
    """Attention over a sequence sharded across ranks (module docstring): Ulysses over
    ``ulysses_group`` (all-to-all of heads), ring over ``ring_group`` (K/V passed around), the
    exact result of :func:`flash_attn_func` on the whole sequence, for this rank's shard.

    Args:
        q, k, v: this rank's shard ``[B, S, H, D]`` (``[B, S, Hkv, Dv]`` for v), every rank the same
            shape. ``H`` a multiple of the Ulysses group's size; ``Hkv`` a multiple or a divisor
            of it (fewer K/V heads than Ulysses ranks are repeated to one a rank before the
            exchange). Head dims and dtypes as :func:`flash_attn_func`.
        causal: causal over the global sequence (shard order in the module docstring).
        window_size: only with a ring of one rank (NotImplementedError otherwise).
        deterministic: each block's backward is; the ring sums in a fixed order, so the whole is.
        return_lse: also the float32 log-sum-exp ``[B, H, S]`` of this rank's queries.
        ulysses_group, ring_group: process groups (None: one rank on that axis); with both None
            this is :func:`flash_attn_func`.
        seq_layout: which tokens each rank holds (:func:`shard_positions`): ``"contiguous"``
            (default, the original library's order) or ``"zigzag"`` (the ring's 2R chunks paired
            first with last, as Megatron-LM shards for context parallelism), which balances causal
            work over the ring.
        dropout_p, bias, alibi_slopes, return_attn_probs: not supported, as in
            :func:`flash_attn_func`.

    Returns ``out`` ``[B, S, H, Dv]`` (or ``(out, lse)``), differentiable in q, k and v.
    """
    scale, wl, wr = _entry(_OP, q, k, v, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes,
                           return_attn_probs, ulysses_group, ring_group)
    zigzag = _zigzag(_OP, seq_layout, q, ulysses_group, ring_group)
    ring = _Ring(ring_group)
    if ring.size == 1:  # Ulysses alone: the whole sequence in one flash_attn_func call (windows too)
        def attention(ql, kl, vl):
            return local_attention(ql, kl, vl, scale, wl, wr, deterministic)
    else:
        def attention(ql, kl, vl):
            return RingAttnFunction.apply(ql, kl, vl, scale, bool(causal), zigzag, bool(deterministic), ring)
    return _usp(attention, q, k, v, return_lse, ulysses_group)


@native.raises_python_errors
def flash_attn_fp8_usp_func(
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
    ulysses_group=None,
    ring_group=None,
):
    """:func:`flash_attn_usp_func` on :func:`flash_attn_fp8_func` (q, k and v quantized to FP8
    blockwise after the Ulysses exchange; ``fp8_config`` as there). Ulysses only: a ring group of
    more than one rank raises NotImplementedError (the FP8 kernel's blocks are not merged across
    ring steps yet)."""
    scale, wl, wr = _entry("flash_attn_fp8_usp_func", q, k, v, dropout_p, softmax_scale, causal, window_size, bias,
                           alibi_slopes, return_attn_probs, ulysses_group, ring_group, ulysses_only="FP8 attention")

    def attention(ql, kl, vl):
        return flash_attn_fp8_func(ql, kl, vl, softmax_scale=scale, window_size=(wl, wr), deterministic=deterministic,
                                   return_lse=True, fp8_config=fp8_config)

    return _usp(attention, q, k, v, return_lse, ulysses_group)


@native.raises_python_errors
def flash_attn_varlen_usp_func(
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
    ulysses_group=None,
    ring_group=None,
):
    """:func:`flash_attn_varlen_func` over packed sequences sharded across the Ulysses group: q
    ``[Tq, Hq, D]``, k and v ``[Tk, Hkv, D]`` are this rank's contiguous share of the packed tokens
    (the ranks' shares in Ulysses-rank order make the batch; every rank the same count), and
    ``cu_seqlens_q/k`` / ``max_seqlen_q/k`` describe the whole batch (the same on every rank).
    After one all-to-all every rank holds every token of ``H / U`` heads and runs one varlen call.
    A ring group of more than one rank raises NotImplementedError (documents crossing ring
    chunks are not split yet). Returns ``out`` ``[Tq, Hq, Dv]`` (and ``lse`` ``[Hq, Tq]``)."""
    op = "flash_attn_varlen_usp_func"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{op}: argument '{name}' must be a 3-D tensor [T, H, D] (this rank's packed tokens)")
    scale, wl, wr = _entry(op, q[None], k[None], v[None], dropout_p, softmax_scale, causal, window_size, bias,
                           alibi_slopes, return_attn_probs, ulysses_group, ring_group,
                           ulysses_only="attention of packed sequences", same_tokens=False)

    def attention(ql, kl, vl):
        out, lse = local_varlen_attention(ql[0], kl[0], vl[0], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                          scale, wl, wr, deterministic)
        return out[None], lse[None]

    result = _usp(attention, q[None], k[None], v[None], return_lse, ulysses_group)
    if return_lse:
        return result[0][0], result[1][0]
    return result[0]
