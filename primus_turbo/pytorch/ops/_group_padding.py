"""Per-group row padding for grouped (mixture-of-experts) operands, computed on the device.

Tokens of G groups lie back to back in x ``[T, C]`` (group g at ``group_offs[g]``, ``group_lens[g]``
rows). Quantizing along the tokens in blocks (or reading each group with block-aligned starts)
needs every group to start at a multiple of ``align`` rows, so no block spans two groups. The
padded layout keeps the groups in order, each rounded up to ``align`` rows with zeros; its total is
bounded by ``padded_rows`` for any group sizes, so shapes never depend on device values (no host
synchronization; CUDA-graph capturable).

The moves are one native call each (``group_pad_rows`` / ``group_gather_rows``, one launch, for up
to ``MAX_NATIVE_GROUPS`` groups); more groups take the torch composition below."""

import torch

from primus_turbo.pytorch.core import library, native

__all__ = ["gather_groups", "offsets", "padded_rows", "padded_layout", "pad_groups", "pad_groups_with_layout"]

MAX_NATIVE_GROUPS = 1024  # PT_GROUP_ROWS_MAX_GROUPS (kernels/layout/group_rows_abi.h)


def _native(x: torch.Tensor, groups: int) -> bool:
    """CUDA tensors and 1 to MAX_NATIVE_GROUPS groups take the native op; the rest the torch one."""
    return x.is_cuda and 1 <= groups <= MAX_NATIVE_GROUPS


def _pad_fake(x, group_lens, group_offs, rows, align):
    g = group_lens.shape[0]
    return (x.new_empty((rows, x.shape[1])), group_lens.new_empty((g,), dtype=torch.int64),
            group_lens.new_empty((g + 1,), dtype=torch.int64))


def _gather_fake(x, group_offs, group_offs_padded, tokens, group_lens):
    return x.new_empty((tokens, x.shape[1]))


# Native ops (csrc/bindings/torch/layout_ops.cpp).
library.register_fake("group_pad_rows", _pad_fake)
library.register_fake("group_gather_rows", _gather_fake)
_pad_op = native.ops.group_pad_rows.default
_gather_op = native.ops.group_gather_rows.default


def padded_rows(tokens: int, groups: int, align: int) -> int:
    """Rows of a padded layout that fits any split of ``tokens`` into ``groups``: each group adds
    less than ``align`` rows of padding (one extra ``align`` of slack, as the original library sizes
    it)."""
    return -(-(tokens + groups * align) // align) * align


def _clamped(group_lens: torch.Tensor, group_offs: torch.Tensor | None, tokens: int):
    """(starts, lens) of each group, clamped into [0, tokens)."""
    lens = group_lens.clamp_min(0)
    starts = group_offs[:-1] if group_offs is not None else torch.cumsum(lens, 0) - lens
    starts = starts.clamp(0, tokens)
    return starts, torch.minimum(lens, tokens - starts)


def offsets(group_lens: torch.Tensor) -> torch.Tensor:
    """Group starts and the end, ``[G + 1]`` int64: 0 then the running sum of the (non-negative) lens."""
    offs = torch.zeros(group_lens.shape[0] + 1, dtype=torch.int64, device=group_lens.device)
    offs[1:] = torch.cumsum(group_lens.clamp_min(0), 0)
    return offs


def padded_layout(group_lens: torch.Tensor, align: int):
    """(padded lens ``[G]``, padded offsets ``[G + 1]``), int64 on group_lens' device."""
    lens = group_lens.clamp_min(0).to(torch.int64)
    plen = (lens + align - 1) // align * align
    return plen, offsets(plen)


def _source_rows(group_lens, group_offs, tokens: int, align: int):
    """For each token row: (its row in the padded layout, whether it belongs to a group)."""
    starts, lens = _clamped(group_lens, group_offs, tokens)
    _, poffs = padded_layout(lens, align)
    rows = torch.arange(tokens, device=group_lens.device)
    gid = (torch.searchsorted(starts, rows, right=True) - 1).clamp_min(0)
    inside = (rows >= starts[gid]) & (rows < starts[gid] + lens[gid])
    return poffs[gid] + rows - starts[gid], inside


@native.raises_python_errors
def pad_groups_with_layout(x: torch.Tensor, group_lens, group_offs, rows: int, align: int):
    """(:func:`pad_groups`, then :func:`padded_layout` of group_lens) in one launch."""
    if _native(x, group_lens.shape[0]):
        return _pad_op(x, group_lens, group_offs, rows, align)
    return (pad_groups_torch(x, group_lens, group_offs, rows, align), *padded_layout(group_lens, align))


@native.raises_python_errors
def pad_groups(x: torch.Tensor, group_lens, group_offs, rows: int, align: int) -> torch.Tensor:
    """x ``[T, C]`` -> ``[rows, C]``: every group's rows moved to start at a multiple of ``align``,
    in group order, zeros elsewhere. With group_offs, starts must be non-decreasing."""
    if _native(x, group_lens.shape[0]):
        return _pad_op(x, group_lens, group_offs, rows, align)[0]
    return pad_groups_torch(x, group_lens, group_offs, rows, align)


def pad_groups_torch(x: torch.Tensor, group_lens, group_offs, rows: int, align: int) -> torch.Tensor:
    """:func:`pad_groups` in torch ops (any number of groups; the reference of the native op)."""
    dest, inside = _source_rows(group_lens, group_offs, x.shape[0], align)
    dest = torch.where(inside, dest, rows)  # row `rows`: discarded
    out = x.new_zeros((rows + 1, x.shape[1]))
    out.index_put_((dest,), x)  # (index_copy_ refuses deterministic mode on CUDA)
    return out[:rows]


@native.raises_python_errors
def gather_groups(xp: torch.Tensor, group_offs: torch.Tensor, group_offs_padded: torch.Tensor, tokens: int,
                  group_lens: torch.Tensor | None = None):
    """Rows ``[0, tokens)`` of the original layout (group g at ``group_offs[g]``, ``group_lens[g]``
    rows; default: up to the next offset) read from a padded one (group g at
    ``group_offs_padded[g]``); rows of no group come back as zeros."""
    if _native(xp, group_offs.shape[0] - 1):
        return _gather_op(xp, group_offs, group_offs_padded, tokens, group_lens)
    return gather_groups_torch(xp, group_offs, group_offs_padded, tokens, group_lens)


def gather_groups_torch(xp: torch.Tensor, group_offs: torch.Tensor, group_offs_padded: torch.Tensor, tokens: int,
                        group_lens: torch.Tensor | None = None):
    """:func:`gather_groups` in torch ops (any number of groups; the reference of the native op)."""
    rows = torch.arange(tokens, device=group_offs.device)
    starts = group_offs[:-1]
    ends = group_offs[1:] if group_lens is None else starts + group_lens.clamp_min(0)
    gid = (torch.searchsorted(starts.contiguous(), rows, right=True) - 1).clamp_min(0)
    inside = (rows >= starts[gid]) & (rows < ends[gid])
    if xp.shape[0] == 0 or tokens == 0:
        return xp.new_zeros((tokens, xp.shape[1]))
    src = torch.where(inside, group_offs_padded[gid] + rows - starts[gid], 0).clamp(0, xp.shape[0] - 1)
    return torch.where(inside.unsqueeze(1), xp.index_select(0, src), 0)
