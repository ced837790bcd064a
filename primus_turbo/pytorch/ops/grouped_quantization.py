"""Grouped quantization: the tokens of G groups (experts) ``x [T, N]``, quantized so that no scale
block spans two groups, in the padded per-group layouts the original library defines.

- Along N (``axis`` 1 / -1, row-wise): groups are independent of the scales, but each group is
  moved to start at a multiple of 32 rows (of the block size with 2-D blocks; FP4 stays tight) so
  a grouped GEMM can read per-group 32-row tiles; MX_BLOCKWISE also pads N to a multiple of 128.
- Along the tokens (``axis`` 0 / -2, column-wise): each group starts at a multiple of 128 rows,
  zero-filled, and the result is stored transposed, ``[N, rows]``: the K-major operand of a
  variable-K (weight-gradient) grouped GEMM, blocks of 32 (MX) or ``block_size`` never crossing a
  group.

Every op returns the padded ``group_lens`` / ``group_offs`` next to the data. The padded total is
an upper bound fixed by (T, G) (``_group_padding.padded_rows``), and the per-group offsets are
computed on the device: no host synchronization, CUDA-graph capturable. TENSORWISE and ROWWISE
scales do not depend on the groups: use :func:`quantize_fp8` for them.
"""

import torch
import torch.nn.functional as F

from primus_turbo.pytorch.core import native
from primus_turbo.pytorch.core.low_precision import ScalingGranularity, ScalingRecipe
from primus_turbo.pytorch.ops import quantization as qz
from primus_turbo.pytorch.ops._checks import check_cuda_tensors
from primus_turbo.pytorch.ops._group_padding import gather_groups, offsets, pad_groups_with_layout, padded_rows

__all__ = [
    "grouped_dequantize_fp4",
    "grouped_dequantize_fp8",
    "grouped_quantize_fp4",
    "grouped_quantize_fp4_with_trans",
    "grouped_quantize_fp8",
    "grouped_quantize_fp8_with_trans",
]

ROW_ALIGN = 32  # rows per group boundary, row-wise FP8 copies
COL_ALIGN = 128  # rows per group boundary, column-wise copies; MX row-wise N padding
_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_groups(op: str, x, group_lens, group_offs, name_offs: str = "group_offs"):
    """Checks the group tensors; returns them as given (group_offs may be None: back to back)."""
    if not isinstance(group_lens, torch.Tensor) or group_lens.dim() != 1 or group_lens.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{op}: argument 'group_lens' must be a 1-D int64 (or int32) tensor")
    if group_lens.shape[0] < 1:
        raise ValueError(f"{op}: argument 'group_lens' must hold at least one group")
    check_cuda_tensors(op, x=x, group_lens=group_lens)
    if group_offs is None:
        return group_lens, None
    if not isinstance(group_offs, torch.Tensor) or group_offs.dim() != 1 or group_offs.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{op}: argument '{name_offs}' must be a 1-D int64 (or int32) tensor")
    if group_offs.shape[0] != group_lens.shape[0] + 1:
        raise ValueError(
            f"{op}: argument '{name_offs}' has {group_offs.shape[0]} entries; expected len(group_lens) + 1 = "
            f"{group_lens.shape[0] + 1}"
        )
    check_cuda_tensors(op, x=x, **{name_offs: group_offs})
    return group_lens, group_offs


def _as_int64(lens, offs):
    """(lens, offsets) as int64, the offsets computed from the lens where not given."""
    lens = lens.to(torch.int64)
    return lens, (offsets(lens) if offs is None else offs.to(torch.int64))


def _check_fp8_grouped(op: str, x, out_dtype, granularity, block_size):
    g, block = qz._common_args(op, x, qz._HP_KIND, out_dtype, qz._FP8_KIND, granularity, block_size)
    if x.dim() != 2:
        raise ValueError(f"{op}: argument 'x' must be 2-D [tokens, N], got shape {tuple(x.shape)}")
    if g in (qz._TENSORWISE, qz._ROWWISE):
        raise NotImplementedError(
            f"{op}: {granularity.name} scales do not depend on the groups; quantize the tokens with quantize_fp8"
        )
    if block > COL_ALIGN or COL_ALIGN % block:
        raise ValueError(f"{op}: block_size {block} must divide the {COL_ALIGN}-row group alignment")
    return g, block


def _direction(op: str, axis) -> bool:
    """True along N (axis 1 / -1), False along the tokens (0 / -2)."""
    return qz._axis_dim(op, axis, 2) == 1


def _row_copy(x, lens, offs, out_dtype, g, block, flags):
    # 2-D blocks span `block` rows: groups then start at multiples of the block, not of 32.
    align = max(ROW_ALIGN, block) if flags & qz._FLAG_2D else ROW_ALIGN
    rows = padded_rows(x.shape[0], lens.shape[0], align)
    xp, plens, poffs = pad_groups_with_layout(x, lens, offs, rows, align)
    if g == qz._MX:
        xp = F.pad(xp, (0, (-x.shape[1]) % COL_ALIGN))
    q, s = qz._quantize_op(xp, out_dtype, g, block, True, False, False, flags, 0)[:2]
    return q, s, plens, poffs


def _col_copy(x, lens, offs, out_dtype, g, block, flags):
    rows = padded_rows(x.shape[0], lens.shape[0], COL_ALIGN)
    xp, plens, poffs = pad_groups_with_layout(x, lens, offs, rows, COL_ALIGN)
    q, s = qz._quantize_op(xp, out_dtype, g, block, False, True, True, flags, 0)[2:]
    return q, s, plens, poffs


@native.raises_python_errors
def grouped_quantize_fp8(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    *,
    block_size: int | None = None,
    axis: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
):
    """FP8 quantization of grouped tokens x ``[T, N]`` (bf16/fp16/fp32) in one direction; returns
    ``(q, scale_inv, group_lens_padded, group_offs_padded)``.

    MX_BLOCKWISE (block_size 32, E8M0 scales) or BLOCKWISE (block_size 32/64/128, fp32 scales);
    ``scaling_recipe.use_2d_block`` for square blocks.
    axis 1 / -1: q ``[R, N']`` (R = padded rows at 32 per group; N' = N rounded up to 128 for MX),
    scales ``[R, N'/block]``; group g's rows start at ``group_offs_padded[g]``.
    axis 0 / -2: q ``[N, R]`` quantized along the tokens and stored transposed (R at 128 per
    group), scales ``[N, R/block]``.
    Padding rows and columns are zeros (their scales those of an all-zero block)."""
    op = "grouped_quantize_fp8"
    g, block = _check_fp8_grouped(op, x, out_dtype, granularity, block_size)
    along_n = _direction(op, axis)
    lens, offs = _check_groups(op, x, group_lens, group_offs)
    flags = qz._FLAG_2D if qz._use_2d(scaling_recipe) else 0
    copy = _row_copy if along_n else _col_copy
    return copy(x.contiguous(), lens, offs, out_dtype, g, block, flags)


@native.raises_python_errors
def grouped_quantize_fp8_with_trans(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    *,
    block_size: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
    scaling_recipe_for_trans: ScalingRecipe | None = None,
):
    """Both copies of :func:`grouped_quantize_fp8`: ``(q_row, scale_inv_row, q_col, scale_inv_col,
    group_lens_padded_row, group_offs_padded_row, group_lens_padded_col, group_offs_padded_col)``,
    the row copy as axis -1 (with ``scaling_recipe``), the column copy as axis 0 (with
    ``scaling_recipe_for_trans``, default ``scaling_recipe``)."""
    op = "grouped_quantize_fp8_with_trans"
    g, block = _check_fp8_grouped(op, x, out_dtype, granularity, block_size)
    lens, offs = _check_groups(op, x, group_lens, group_offs)
    row_flags = qz._FLAG_2D if qz._use_2d(scaling_recipe) else 0
    col_recipe = scaling_recipe if scaling_recipe_for_trans is None else scaling_recipe_for_trans
    col_flags = qz._FLAG_2D if qz._use_2d(col_recipe, "scaling_recipe_for_trans") else 0
    x = x.contiguous()
    q_row, s_row, lens_row, offs_row = _row_copy(x, lens, offs, out_dtype, g, block, row_flags)
    q_col, s_col, lens_col, offs_col = _col_copy(x, lens, offs, out_dtype, g, block, col_flags)
    return q_row, s_row, q_col, s_col, lens_row, offs_row, lens_col, offs_col


def _total_rows(group_offs: torch.Tensor, total_M) -> int:
    if total_M is not None:
        if isinstance(total_M, bool) or not isinstance(total_M, int) or total_M < 0:
            raise ValueError(f"argument 'total_M' must be a non-negative int, got {total_M!r}")
        return total_M
    return int(group_offs[-1])  # one host read; pass total_M to avoid it


@native.raises_python_errors
def grouped_dequantize_fp8(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    group_offs: torch.Tensor,
    group_offs_padded: torch.Tensor,
    *,
    block_size: int | None = None,
    axis: int | None = None,
    scale_inv: torch.Tensor,
    scaling_recipe: ScalingRecipe | None = None,
    total_M: int | None = None,
) -> torch.Tensor:
    """Inverse of :func:`grouped_quantize_fp8` for the same axis: ``[total_M, N']`` in ``out_dtype``,
    the tokens back in their original rows (``group_offs``, gap-free: group g ends where g + 1
    starts) read from the padded ones (``group_offs_padded``). N' is the quantized width (MX row-wise copies keep their zero columns
    up to a multiple of 128; slice ``[:, :N]``). ``total_M`` defaults to ``group_offs[-1]``, read
    from the device (pass it to stay free of host synchronization)."""
    op = "grouped_dequantize_fp8"
    g, block = qz._common_args(op, x, qz._FP8_KIND, out_dtype, qz._HP_KIND, granularity, block_size)
    if x.dim() != 2:
        raise ValueError(f"{op}: argument 'x' must be 2-D, got shape {tuple(x.shape)}")
    along_n = _direction(op, axis)
    for name, t in (("group_offs", group_offs), ("group_offs_padded", group_offs_padded)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in _INDEX_DTYPES:
            raise TypeError(f"{op}: argument '{name}' must be a 1-D int64 (or int32) tensor")
    check_cuda_tensors(op, x=x, group_offs=group_offs, group_offs_padded=group_offs_padded)
    if group_offs.shape != group_offs_padded.shape:
        raise ValueError(
            f"{op}: 'group_offs' has {group_offs.shape[0]} entries but 'group_offs_padded' {group_offs_padded.shape[0]}"
        )
    if group_offs.shape[0] < 2:
        raise ValueError(f"{op}: argument 'group_offs' needs num_groups + 1 >= 2 entries, got {group_offs.shape[0]}")
    tokens = _total_rows(group_offs, total_M)
    padded_rows_of_x = x.shape[0] if along_n else x.shape[1]
    if tokens > padded_rows_of_x:
        raise ValueError(
            f"{op}: argument 'total_M' (or group_offs[-1]) is {tokens}, more than the {padded_rows_of_x} "
            "padded rows of x"
        )
    out = qz._dequantize_fp8_checked(op, x, out_dtype, g, block, -1, scale_inv, scaling_recipe)  # x checked above
    return gather_groups(out if along_n else out.t(), group_offs, group_offs_padded, tokens)


# ---- FP4 (MXFP4) ----------------------------------------------------------------------------------


def _fp4_col_copy(x, lens, offs, out_dtype, granularity, block_size, recipe, seed):
    rows = padded_rows(x.shape[0], lens.shape[0], COL_ALIGN)
    xp, plens, poffs = pad_groups_with_layout(x, lens, offs, rows, COL_ALIGN)
    q, s = qz.quantize_fp4_unpadded(xp, out_dtype, granularity, block_size=block_size, axis=0, scaling_recipe=recipe, seed=seed)
    return q, s, plens, poffs


def _check_fp4_grouped(op: str, x, out_dtype, granularity, block_size):
    qz._common_args(op, x, qz._HP_KIND, out_dtype, qz._FP4_KIND, granularity, block_size, mx_only=True)
    if x.dim() != 2:
        raise ValueError(f"{op}: argument 'x' must be 2-D [tokens, N], got shape {tuple(x.shape)}")


@native.raises_python_errors
def grouped_quantize_fp4(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    *,
    block_size: int | None = qz.MX_BLOCK_SIZE,
    axis: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
    seed: int | None = None,
):
    """MXFP4 quantization of grouped tokens x ``[T, N]``; returns ``(q, scale_inv,
    group_lens_padded, group_offs_padded)``. axis 1 / -1: the tight layout (row i is token i, as
    :func:`quantize_fp4`; the padded lens/offsets equal the given ones). axis 0 / -2: along the
    tokens with each group starting at a multiple of 128 rows, stored transposed: q ``[N, R/2]``,
    scales ``[N, R/32]``."""
    op = "grouped_quantize_fp4"
    _check_fp4_grouped(op, x, out_dtype, granularity, block_size)
    lens, offs = _check_groups(op, x, group_lens, group_offs)
    if _direction(op, axis):
        q, s = qz.quantize_fp4_unpadded(x, out_dtype, granularity, block_size=block_size, axis=-1,
                                        scaling_recipe=scaling_recipe, seed=seed)
        return q, s, *_as_int64(lens, offs)
    return _fp4_col_copy(x.contiguous(), lens, offs, out_dtype, granularity, block_size, scaling_recipe, seed)


@native.raises_python_errors
def grouped_quantize_fp4_with_trans(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    *,
    block_size: int | None = qz.MX_BLOCK_SIZE,
    scaling_recipe: ScalingRecipe | None = None,
    scaling_recipe_for_trans: ScalingRecipe | None = None,
    seed: int | None = None,
):
    """Both copies of :func:`grouped_quantize_fp4`: ``(q_row, scale_inv_row, q_col, scale_inv_col,
    group_lens_padded_row, group_offs_padded_row, group_lens_padded_col, group_offs_padded_col)``
    (row copy tight, so its padded lens/offsets are the given ones)."""
    op = "grouped_quantize_fp4_with_trans"
    _check_fp4_grouped(op, x, out_dtype, granularity, block_size)
    lens, offs = _check_groups(op, x, group_lens, group_offs)
    q_row, s_row = qz.quantize_fp4_unpadded(x, out_dtype, granularity, block_size=block_size, axis=-1,
                                            scaling_recipe=scaling_recipe, seed=seed)
    col_recipe = scaling_recipe if scaling_recipe_for_trans is None else scaling_recipe_for_trans
    col = _fp4_col_copy(x.contiguous(), lens, offs, out_dtype, granularity, block_size, col_recipe,
                        None if seed is None else seed + 1)
    return q_row, s_row, col[0], col[1], *_as_int64(lens, offs), col[2], col[3]


@native.raises_python_errors
def grouped_dequantize_fp4(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity = ScalingGranularity.MX_BLOCKWISE,
    *,
    block_size: int | None = qz.MX_BLOCK_SIZE,
    axis: int | None = None,
    scale_inv: torch.Tensor,
    scaling_recipe: ScalingRecipe | None = None,
) -> torch.Tensor:
    """Inverse of :func:`grouped_quantize_fp4`'s row-wise (tight) copy: :func:`dequantize_fp4` along
    the last dim (axis 1 / -1, the default). A column-wise copy is dequantized with
    :func:`dequantize_fp4` (axis 0) in its padded layout."""
    op = "grouped_dequantize_fp4"
    if axis is not None and not _direction(op, axis):
        raise ValueError(f"{op}: only the row-wise (axis -1) copy is tight; dequantize a column-wise copy with "
                         "dequantize_fp4(axis=0) in its padded layout")
    return qz.dequantize_fp4(x, out_dtype, granularity, block_size=block_size, axis=-1, scale_inv=scale_inv,
                             scaling_recipe=scaling_recipe)
