"""turbo.ops quantization: FP8 (tensorwise, rowwise, blockwise, MX) and MXFP4 quantize / dequantize
on the library's own CUDA kernels (kernels/quantization/quantize_tile.cuh).

Conventions (the contract the FP8/FP4 GEMMs build on):
- ``x ~ q.float() * scale_inv`` broadcast per scale group; ``scale = FMT_MAX / amax`` with amax
  clamped to 1e-30 (an all-zero group gives q = 0 and a finite scale_inv), values rounded to
  nearest even and saturated to the format's maximum. MX scales are E8M0 powers of two, exponent
  ``ceil(log2(amax / FMT_MAX))``: the smallest that keeps every element of the block in range, so
  none clips (the rule of NVIDIA's MXFP8 training recipe and of the original library).
- Quantized along any dim (``axis``); scales keep x's other dims. 2-D blocks and the GEMM
  helpers see x of rank > 2 as ``[prod(leading dims), last dim]``; a non-contiguous x is copied once.
- Tensorwise and rowwise amax are reduced on the device: no host synchronization anywhere, so
  every op can be captured in a CUDA graph; each is a registered custom op with a fake
  implementation, so ``torch.compile(fullgraph=True)`` traces it.
"""

import itertools
import math
import operator

import torch
import torch.nn.functional as F

from primus_turbo._core import check, lib
from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.core.low_precision import ScalingGranularity, ScalingRecipe, float4_e2m1fn_x2
from primus_turbo.pytorch.core.tensor_bridge import current_stream_handle, device_guard, to_pt
from primus_turbo.pytorch.ops._checks import check_cuda_tensors
from primus_turbo.pytorch.ops._transpose import transpose_last2

__all__ = [
    "RHT_SIGNS",
    "dequantize_fp4",
    "dequantize_fp8",
    "quantize_fp4",
    "quantize_fp4_with_trans",
    "quantize_fp8",
    "quantize_fp8_with_trans",
    "MX_PADDING_ALIGN_SIZE",
]

_IN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_FP4_DTYPE = float4_e2m1fn_x2 if float4_e2m1fn_x2 is not None else torch.uint8
_E8M0 = getattr(torch, "float8_e8m0fnu", torch.uint8)
_FMT_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0, _FP4_DTYPE: 6.0}
_GRANULARITY = {
    ScalingGranularity.TENSORWISE: 0,
    ScalingGranularity.ROWWISE: 1,
    ScalingGranularity.BLOCKWISE: 2,
    ScalingGranularity.MX_BLOCKWISE: 3,
}
_TENSORWISE, _ROWWISE, _BLOCKWISE, _MX = 0, 1, 2, 3
_FLAG_2D, _FLAG_RHT, _FLAG_SR, _FLAG_MN_MAJOR = 1, 2, 4, 8
_AMAX_EPS = 1e-30
MX_BLOCK_SIZE = 32

# Sign vector of the FP4 random Hadamard transform (kRhtSigns in quant_formats.cuh): element i of
# each group of 16 along the quantized dim is negated when RHT_SIGNS[i] is -1. The transform is
# y = H16 @ diag(RHT_SIGNS) @ x / 4 (orthonormal); its inverse is diag(RHT_SIGNS) @ H16 @ y / 4.
RHT_SIGNS = tuple(-1.0 if (0x9A5C >> i) & 1 else 1.0 for i in range(16))


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def undo_rht(y: torch.Tensor) -> torch.Tensor:
    """The inverse random Hadamard transform along the last dim (a multiple of 16):
    ``diag(RHT_SIGNS) @ H16 @ y / 4`` on each 16 consecutive values, computed in float32 and
    returned in y's dtype. Takes an FP4 tensor quantized with ``use_rht`` back to its own domain."""
    idx = torch.arange(16, device=y.device)
    parity = torch.zeros(16, 16, dtype=torch.int64, device=y.device)
    for bit in range(4):  # (-1)^popcount(i & j): the Sylvester-ordered H16
        parity += ((idx[:, None] >> bit) & (idx[None, :] >> bit) & 1)
    h = 1.0 - 2.0 * (parity % 2).float()
    signs = torch.tensor(RHT_SIGNS, dtype=torch.float32, device=y.device)
    g = y.float().reshape(*y.shape[:-1], -1, 16)
    return ((g @ h.t()) / 4 * signs).reshape(y.shape).to(y.dtype)


def _empty_group_scale_inv(fmt_max: float) -> float:
    """scale_inv the kernels give an all-zero group (fp32 arithmetic, as on the device)."""
    mult = torch.tensor(fmt_max, dtype=torch.float32) / torch.tensor(_AMAX_EPS, dtype=torch.float32)
    return float(mult.reciprocal())


# ---- shapes: one place for the kernel wrapper and the fake implementation ------------------------


def _scale_shape(g: int, block: int, m: int, k: int, along_k: bool, transposed: bool, two_d: bool,
                 mn_major: bool = False):
    """Shape of the scale tensor of one output (see pt_quantize in quantization.h)."""
    if mn_major:  # 1-D blocks as the FP8 GEMM reads them: blocks-major, rows padded to 4
        return (_cdiv(k, block), -(-m // 4) * 4) if along_k else (_cdiv(m, block), -(-k // 4) * 4)
    if g == _TENSORWISE:
        return ()
    if g == _ROWWISE:
        return (m, 1) if along_k else ((k, 1) if transposed else (1, k))
    if two_d:
        return (_cdiv(m, block), _cdiv(k, block)) if along_k else (_cdiv(k, block), _cdiv(m, block))
    if along_k:
        return (m, _cdiv(k, block))
    return (k, _cdiv(m, block)) if transposed else (_cdiv(m, block), k)


def _outputs(x, out_dtype, g, block, row, col, col_transposed, flags):
    m, k = x.shape
    fp4 = out_dtype == _FP4_DTYPE
    sdt = _E8M0 if g == _MX else torch.float32
    two_d, mn = bool(flags & _FLAG_2D), bool(flags & _FLAG_MN_MAJOR)
    if row:
        q_row = x.new_empty((m, k // 2) if fp4 else (m, k), dtype=out_dtype)
        s_row = x.new_empty(_scale_shape(g, block, m, k, True, False, two_d, mn), dtype=sdt)
    else:  # absent outputs are distinct empty tensors (a custom op's outputs must not alias)
        q_row, s_row = library.placeholder(x), library.placeholder(x)
    if col:
        shape = (k, m // 2) if fp4 else ((k, m) if col_transposed else (m, k))
        q_col = x.new_empty(shape, dtype=out_dtype)
        s_col = x.new_empty(_scale_shape(g, block, m, k, False, col_transposed, two_d, mn), dtype=sdt)
    else:
        q_col, s_col = library.placeholder(x), library.placeholder(x)
    return q_row, s_row, q_col, s_col


# ---- registered ops: x is 2-D and contiguous here ------------------------------------------------


def _quantize_cuda(x, out_dtype, granularity: int, block_size: int, row: bool, col: bool, col_transposed: bool,
                   flags: int, seed: int):
    q_row, s_row, q_col, s_col = _outputs(x, out_dtype, granularity, block_size, row, col, col_transposed, flags)
    m, k = x.shape
    if m == 0 or k == 0:
        # Every scale group is empty: the value of an all-zero group.
        for s in (s_row, s_col):
            if s.numel():
                if s.dtype == torch.float32:
                    s.fill_(_empty_group_scale_inv(_FMT_MAX[out_dtype]))
                else:
                    s.view(torch.uint8).fill_(0)
        return q_row, s_row, q_col, s_col
    # Row-only rowwise FP8 reduces each row's amax inside its kernel: no workspace.
    inline_amax = granularity == _ROWWISE and row and not col and out_dtype != _FP4_DTYPE and not flags & _FLAG_RHT
    ws_bytes = 0 if inline_amax else lib.pt_quantize_workspace_bytes(m, k, granularity)
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=x.device) if ws_bytes else None
    with device_guard(x.device):
        status = lib.pt_quantize(
            to_pt(x),
            to_pt(q_row) if row else None,
            to_pt(s_row) if row else None,
            to_pt(q_col) if col else None,
            to_pt(s_col) if col else None,
            granularity, block_size, int(col_transposed), flags, seed & (2**64 - 1),
            ws.data_ptr() if ws is not None else None, ws_bytes,
            current_stream_handle(x.device),
        )
    if status:
        check(status, context="quantize")
    return q_row, s_row, q_col, s_col


def _quantize_fake(x, out_dtype, granularity, block_size, row, col, col_transposed, flags, seed):
    return _outputs(x, out_dtype, granularity, block_size, row, col, col_transposed, flags)


def _dequantize_fake(q, scale_inv, out_dtype, granularity, block_size, axis, flags):
    m, k = q.shape
    k = 2 * k if q.dtype in (_FP4_DTYPE, torch.uint8) else k  # uint8: packed FP4, as the native op reads it
    # The core's scale check, so a traced call fails where the eager one would.
    want = _scale_shape(granularity, block_size, m, k, axis != 0, False, bool(flags & _FLAG_2D))
    sdt = _E8M0 if granularity == _MX else torch.float32
    if scale_inv.dtype not in (sdt, torch.uint8 if granularity == _MX else sdt) or scale_inv.numel() != math.prod(want):
        raise ValueError(
            f"dequantize: argument 'scale_inv' is {scale_inv.dtype} {tuple(scale_inv.shape)}; expected {sdt} "
            f"{tuple(want)} for q of shape {tuple(q.shape)}"
        )
    return q.new_empty((m, k), dtype=out_dtype)


_quantize_op = library.define_op(
    "quantize(Tensor x, ScalarType out_dtype, int granularity, int block_size, bool row, bool col, "
    "bool col_transposed, int flags, int seed) -> (Tensor, Tensor, Tensor, Tensor)",
    _quantize_cuda,
    _quantize_fake,
)
# Native (csrc/bindings/torch/quantize_ops.cpp): one call checks, allocates and launches.
library.register_fake("dequantize", _dequantize_fake)
_native_dequantize = native.ops.dequantize.default


def _dequantize_op(q, scale_inv, out_dtype, granularity, block_size, axis, flags):
    """The native dequantize with packed FP4 q and E8M0 scales as uint8 views: torch's stable ABI,
    which the native op is built on, converts neither dtype."""
    if q.dtype == _FP4_DTYPE:
        q = q.view(torch.uint8)
    if scale_inv.dtype == _E8M0:
        scale_inv = scale_inv.view(torch.uint8)
    return _native_dequantize(q, scale_inv, out_dtype, granularity, block_size, axis, flags)


# ---- argument checks (host only, before any launch) ----------------------------------------------


def _check_tensor(op: str, name: str, t, dtypes, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}; expected {what}")
    if t.dim() < 1:
        raise ValueError(f"{op}: argument '{name}' must have at least 1 dimension, got a scalar")
    check_cuda_tensors(op, **{name: t})


def _granularity_code(op: str, granularity) -> int:
    if not isinstance(granularity, ScalingGranularity):
        raise TypeError(f"{op}: argument 'granularity' must be a ScalingGranularity, got {granularity!r}")
    return _GRANULARITY[granularity]


def _block_size(op: str, g: int, block_size) -> int:
    if g in (_TENSORWISE, _ROWWISE):
        return 0
    if g == _MX:
        if block_size not in (None, MX_BLOCK_SIZE):
            raise ValueError(f"{op}: argument 'block_size' is {block_size}; MX_BLOCKWISE needs {MX_BLOCK_SIZE}")
        return MX_BLOCK_SIZE
    if block_size is None:
        raise ValueError(f"{op}: argument 'block_size' is required for BLOCKWISE (e.g. 128)")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size not in (32, 64, 128):
        raise ValueError(f"{op}: argument 'block_size' is {block_size!r}; BLOCKWISE supports 32, 64 or 128")
    return block_size


def _along_last(op: str, axis, ndim: int, required: bool = True) -> bool:
    """FP4: True for the last dim (-1 or ndim-1), False for the first of the 2-D view (0 or -2)."""
    if axis is None:
        if required:
            raise ValueError(f"{op}: argument 'axis' is required (-1: along the last dim, 0: along the first)")
        return True
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{op}: argument 'axis' must be an int, got {axis!r}")
    if axis in (-1, max(ndim, 2) - 1):
        return True
    if axis in (0, -2):
        return False
    raise ValueError(f"{op}: argument 'axis' is {axis}; expected -1 (or {max(ndim, 2) - 1}) or 0 (or -2)")


def _axis_dim(op: str, axis, ndim: int) -> int:
    """The quantized dim of an FP8 (de)quantization as an index in [0, ndim): any dim of x."""
    if axis is None:
        raise ValueError(f"{op}: argument 'axis' is required (the dim quantized along: -1 for the last)")
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{op}: argument 'axis' must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{op}: argument 'axis' is {axis}; expected a dim of x, in [{-ndim}, {ndim - 1}]")
    return axis % ndim


def _fp4_batched_along_last(op: str, axis) -> bool:
    """FP4 of a 3-D [G, M, N] input: True along N (axis 2 / -1), False along M (1 / -2)."""
    dim = _axis_dim(op, axis, 3)
    if dim == 0:
        raise ValueError(f"{op}: argument 'axis' is {axis}; a 3-D [G, M, N] input takes 2 (or -1, along N) or 1 (or -2, "
                         "along M: each group stored transposed)")
    return dim == 2


def _use_2d(recipe, name: str = "scaling_recipe") -> bool:
    """Whether a (checked) recipe asks for 2-D blocks; ``name``: the argument it came in."""
    if recipe is not None and not isinstance(recipe, ScalingRecipe):
        raise TypeError(f"argument '{name}' must be a ScalingRecipe or None, got {type(recipe).__name__}")
    if recipe is not None and (recipe.shuffle_scale or recipe.shuffle_out):
        raise ValueError(
            f"argument '{name}': shuffle_scale / shuffle_out are pre-shuffled layouts of the original library's AMD "
            "kernels; no kernel here reads them (leave both False)"
        )
    return bool(recipe is not None and recipe.use_2d_block)


# The original library pads an MX-quantized dim to a multiple of this (its MX*_PADDING_ALIGN_SIZE).
MX_PADDING_ALIGN_SIZE = 128


def _pad_dim(x: torch.Tensor, dim: int, multiple: int = MX_PADDING_ALIGN_SIZE) -> torch.Tensor:
    """x with dim zero-padded at its end to a multiple of ``multiple`` (x itself when it is one)."""
    extra = (-x.shape[dim]) % multiple
    if not extra:
        return x
    return F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [0, extra])


def _mx_1d(granularity, recipe) -> bool:
    """MX_BLOCKWISE with 1-D blocks: the case whose public layouts pad (see quantize_fp8)."""
    return granularity == ScalingGranularity.MX_BLOCKWISE and not (
        isinstance(recipe, ScalingRecipe) and recipe.use_2d_block
    )


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    # The rows as a product, not -1: a reshape cannot infer it when the last dim is 0.
    return x.contiguous().reshape(math.prod(x.shape[:-1]), x.shape[-1]) if x.dim() != 2 else x.contiguous()


# (accepted dtypes, how an error message names them)
_HP_KIND = (_IN_DTYPES, "float32, float16 or bfloat16")
_FP8_KIND = (_FP8_DTYPES, "torch.float8_e4m3fn or torch.float8_e5m2")
_FP4_KIND = ((_FP4_DTYPE, torch.uint8), f"{_FP4_DTYPE}")


def _check_out_dtype(op: str, out_dtype, kind) -> None:
    dtypes, what = kind
    if out_dtype not in dtypes:
        raise TypeError(f"{op}: argument 'out_dtype' is {out_dtype}; expected {what}")


def _granularity_and_block(op: str, granularity, block_size, mx_only: bool = False) -> tuple[int, int]:
    """(granularity code, block size) after their checks; ``mx_only``: FP4, MX_BLOCKWISE only."""
    g = _granularity_code(op, granularity)
    if mx_only and g != _MX:
        raise ValueError(f"{op}: argument 'granularity' is {granularity}; FP4 supports MX_BLOCKWISE only")
    return g, _block_size(op, g, block_size)


def _common_args(op: str, x, x_kind, out_dtype, out_kind, granularity, block_size, mx_only: bool = False):
    """The checks every quantize / dequantize starts with, in order: x, out_dtype, granularity,
    block_size. Returns (granularity code, block size)."""
    _check_tensor(op, "x", x, *x_kind)
    _check_out_dtype(op, out_dtype, out_kind)
    return _granularity_and_block(op, granularity, block_size, mx_only)


def _check_scale_inv(op: str, x, scale_inv) -> None:
    if not isinstance(scale_inv, torch.Tensor):
        raise TypeError(f"{op}: argument 'scale_inv' must be a torch.Tensor, got {type(scale_inv).__name__}")
    check_cuda_tensors(op, x=x, scale_inv=scale_inv)


def _fp8_layout(op: str, g: int, scaling_recipe, axis, ndim: int) -> tuple[bool, int | None]:
    """(2-D blocks, quantized dim) of an FP8 (de)quantization; tensorwise and 2-D blocks ignore
    the axis (dim None: x seen as [M, K], scaled as a whole or in B x B blocks)."""
    two_d = _use_2d(scaling_recipe) and g in (_BLOCKWISE, _MX)  # checked for every granularity
    return two_d, None if g == _TENSORWISE or two_d else _axis_dim(op, axis, ndim)


# ---- FP8 ------------------------------------------------------------------------------------------


def quantize_fp8(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    *,
    block_size: int | None = None,
    axis: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantizes x (float32/float16/bfloat16) to FP8; returns ``(q, scale_inv)``.

    MX_BLOCKWISE (1-D blocks) uses the original library's padded layouts: the quantized dim is
    zero-padded to a multiple of 128; along the last dim q is ``[..., K_pad]`` with scale_inv
    ``[..., K_pad/32]``; along the other dim of a 2-D ``[M, N]`` (axis 0) or 3-D ``[G, M, N]``
    (axis 1) input q is stored transposed, ``[N, M_pad]`` / ``[G, N, M_pad]``, scale_inv
    ``[N, M_pad/32]`` / ``[G, N, M_pad/32]`` (:func:`dequantize_fp8` with the same axis returns
    ``[M_pad, N]`` / ``[G, M_pad, N]``). Every other case: :func:`quantize_fp8_unpadded`.
    """
    if _mx_1d(granularity, scaling_recipe):
        # Every argument checked before anything is padded or copied.
        _common_args("quantize_fp8", x, _HP_KIND, out_dtype, _FP8_KIND, granularity, block_size)
        _use_2d(scaling_recipe)
        dim = _axis_dim("quantize_fp8", axis, x.dim())
        kw = {"block_size": block_size, "scaling_recipe": scaling_recipe}
        if dim == x.dim() - 1:
            return quantize_fp8_unpadded(_pad_dim(x, dim), out_dtype, granularity, axis=-1, **kw)
        if x.dim() == 2:  # the kernels' transposed column output of the padded x
            q_row, s_row, q_col, s_col = _quantize_op(_pad_dim(x, 0).contiguous(), out_dtype, _MX, MX_BLOCK_SIZE,
                                                      False, True, True, 0, 0)
            return q_col, s_col
        if x.dim() == 3 and dim == 1:
            return quantize_fp8_unpadded(_pad_dim(x, 1).transpose(1, 2), out_dtype, granularity, axis=-1, **kw)
        q, s = quantize_fp8(x.movedim(dim, -1), out_dtype, granularity, axis=-1, **kw)
        return q.movedim(-1, dim).contiguous(), s.movedim(-1, dim).contiguous()
    return quantize_fp8_unpadded(x, out_dtype, granularity, block_size=block_size, axis=axis,
                                 scaling_recipe=scaling_recipe)


def quantize_fp8_unpadded(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    *,
    block_size: int | None = None,
    axis: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_fp8` in the layouts the GEMMs read (MX included: nothing padded, every
    axis quantized as it lies).

    q has x's shape and ``out_dtype`` (``torch.float8_e4m3fn`` or ``torch.float8_e5m2``), contiguous.
    scale_inv (fp32 unless MX):
      TENSORWISE: 0-dim (axis ignored).
      ROWWISE, BLOCKWISE (block_size 32/64/128), MX_BLOCKWISE (block_size 32, ``torch.float8_e8m0fnu``
      scales): one scale per group of values along ``axis`` (required; any dim of x, negative
      counts from the end), shaped as x with that dim replaced by its number of groups (1 for
      ROWWISE): ``[B, S, K]`` along -1 gives ``[B, S, 1]`` (ROWWISE) or ``[B, S, ceil(K/B)]``.
      BLOCKWISE/MX with ``scaling_recipe.use_2d_block``: x seen as ``[M, K]`` (leading dims
      flattened) in B x B blocks, ``[ceil(M/B), ceil(K/B)]`` (axis ignored).
    """
    op = "quantize_fp8"
    g, block = _common_args(op, x, _HP_KIND, out_dtype, _FP8_KIND, granularity, block_size)
    two_d, dim = _fp8_layout(op, g, scaling_recipe, axis, x.dim())
    if dim is None or dim == x.dim() - 1:  # along the last dim of the [M, K] view
        q, s = _quantize_op(_as_2d(x), out_dtype, g, block, True, False, False, _FLAG_2D if two_d else 0, 0)[:2]
        return q.view(x.shape), (s if dim is None else s.view(*x.shape[:-1], s.shape[-1]))
    if x.dim() == 2:  # along M: the kernels' in-place column output, scales [groups, K]
        return _quantize_op(x.contiguous(), out_dtype, g, block, False, True, False, 0, 0)[2:]
    if dim == x.dim() - 2:  # e.g. a [G, N, K] weight along N: tiled transposes, not torch's strided copies
        q, s = quantize_fp8_unpadded(transpose_last2(x), out_dtype, granularity, block_size=block_size, axis=-1)
        return transpose_last2(q), s.transpose(-1, -2).contiguous()
    # Any other dim: quantize with that dim moved last, then move it back.
    q, s = quantize_fp8_unpadded(x.movedim(dim, -1), out_dtype, granularity, block_size=block_size, axis=-1)
    return q.movedim(-1, dim).contiguous(), s.movedim(-1, dim).contiguous()


def quantize_fp8_row_and_transposed(x: torch.Tensor, out_dtype, granularity, block_size=None, two_d: bool = False):
    """The GEMMs' quantizer: x ``[M, K]`` (leading dims flattened) in one read, quantized along K as
    it lies and along M stored transposed ``[K, M]`` (a backward GEMM's K-major operand), scales
    ``[K, 1]`` (ROWWISE), ``[K, ceil(M/B)]`` (1-D blocks), the row copy's transposed (2-D blocks)
    or the same 0-dim one (TENSORWISE). ``(q_row, s_row, q_col, s_col)``."""
    g, block = _granularity_and_block("quantize_fp8", granularity, block_size)
    return _quantize_op(_as_2d(x), out_dtype, g, block, True, True, True, _FLAG_2D if two_d else 0, 0)


def _quantize_fp8_with_amax_fake(x, amax, out_dtype, transposed=False):
    if out_dtype not in _FP8_DTYPES:
        raise TypeError(f"quantize_fp8_with_amax: argument 'out_dtype' is {out_dtype}; expected float8_e4m3fn or "
                        "float8_e5m2")
    if amax.dtype != torch.float32 or amax.numel() != 1:
        raise ValueError(f"quantize_fp8_with_amax: argument 'amax' must be one float32 value, got {amax.dtype} "
                         f"{tuple(amax.shape)}")
    if transposed and x.dim() != 2:
        raise ValueError(f"quantize_fp8_with_amax: a transposed copy needs a 2-D 'x', got shape {tuple(x.shape)}")
    q_t = x.new_empty((x.shape[1], x.shape[0]), dtype=out_dtype) if transposed else library.placeholder(x)
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty((), dtype=torch.float32), q_t


library.register_fake("quantize_fp8_with_amax", _quantize_fp8_with_amax_fake)
_native_quantize_with_amax = native.ops.quantize_fp8_with_amax.default


@native.raises_python_errors
def quantize_fp8_with_amax(x: torch.Tensor, out_dtype: torch.dtype, amax: torch.Tensor, transposed: bool = False):
    """TENSORWISE :func:`quantize_fp8_unpadded` with max |x| given (float32, one value on x's
    device, reduced by the op that wrote x): ``(q, scale_inv)``, q with x's shape, scale_inv 0-dim;
    the same codes as the quantizer's own amax pass gives when ``amax`` holds max |x|. With
    ``transposed`` (2-D x): ``(q, scale_inv, q_t)``, q_t ``[K, M]`` the same codes stored
    transposed, written in the same pass (a weight's dgrad copy)."""
    if isinstance(x, torch.Tensor) and x.numel() == 0:  # nothing to scale: the empty tensor's own result
        q, s = quantize_fp8_unpadded(x, out_dtype, ScalingGranularity.TENSORWISE)
        return (q, s, q.t()) if transposed else (q, s)
    q, s, q_t = _native_quantize_with_amax(x, amax, out_dtype, transposed)
    return (q, s, q_t) if transposed else (q, s)


def quantize_fp8_transposed(x: torch.Tensor, out_dtype, granularity, block_size=None):
    """Only the transposed copy of :func:`quantize_fp8_row_and_transposed`: x ``[M, K]`` (leading
    dims flattened) quantized along M and stored ``[K, M]``, scales ``[K, 1]`` (ROWWISE),
    ``[K, ceil(M/B)]`` (1-D blocks) or 0-dim (TENSORWISE). ``(q, scale_inv)``; no row copy written."""
    g, block = _granularity_and_block("quantize_fp8", granularity, block_size)
    return _quantize_op(_as_2d(x), out_dtype, g, block, False, True, True, 0, 0)[2:]


def quantize_fp8_with_trans(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    *,
    block_size: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
    scaling_recipe_for_trans: ScalingRecipe | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both FP8 quantizations of x: ``(q_row, scale_inv_row, q_col, scale_inv_col)``.

    MX_BLOCKWISE (1-D blocks), as the original library: x ``[M, K]`` gives q_row ``[M, K_pad]``,
    scale_inv_row ``[M, K_pad/32]``, q_col ``[K, M_pad]``, scale_inv_col ``[K, M_pad/32]`` (each
    quantized dim zero-padded to a multiple of 128); a 3-D ``[G, M, K]`` input is quantized per
    group (``[G, M, K_pad]``, ``[G, K, M_pad]``). Every other case:
    :func:`quantize_fp8_with_trans_unpadded`.
    """
    recipes_1d = not (_use_2d(scaling_recipe) or _use_2d(scaling_recipe_for_trans, "scaling_recipe_for_trans"))
    if _mx_1d(granularity, None) and recipes_1d and isinstance(x, torch.Tensor):
        kw = {"block_size": block_size}
        if x.dim() == 3:
            return (*quantize_fp8(x, out_dtype, granularity, axis=2, **kw),
                    *quantize_fp8(x, out_dtype, granularity, axis=1, **kw))
        _common_args("quantize_fp8_with_trans", x, _HP_KIND, out_dtype, _FP8_KIND, granularity, block_size)
        x2 = _as_2d(x)
        m, k = x2.shape
        q_row, s_row, q_col, s_col = _quantize_op(_pad_dim(_pad_dim(x2, 0), 1).contiguous(), out_dtype, _MX,
                                                  MX_BLOCK_SIZE, True, True, True, 0, 0)
        return q_row[:m], s_row[:m], q_col[:k], s_col[:k]
    return quantize_fp8_with_trans_unpadded(x, out_dtype, granularity, block_size=block_size,
                                            scaling_recipe=scaling_recipe,
                                            scaling_recipe_for_trans=scaling_recipe_for_trans)


def quantize_fp8_with_trans_unpadded(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    *,
    block_size: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
    scaling_recipe_for_trans: ScalingRecipe | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One read of x ``[M, K]`` (leading dims flattened), two FP8 outputs:
    ``(q_row, scale_inv_row, q_col, scale_inv_col)``; q_row is the axis -1 quantization (as
    :func:`quantize_fp8`).

    BLOCKWISE (1-D blocks, as the original library): q_col ``[M, K]`` quantized along M in place,
    scale_inv_col ``[ceil(M/B), K]``, i.e. ``quantize_fp8(x, axis=0)``; dequantize it with axis 0.
    MX_BLOCKWISE, ROWWISE, TENSORWISE: q_col is the column-wise quantization stored transposed, a
    row-major ``[K, M]`` tensor quantized along its own last dim (dequantize it with axis -1), with
    scale_inv_col ``[K, ceil(M/32)]`` (MX), ``[K, 1]`` (ROWWISE), the same 0-dim value
    (TENSORWISE: ``q_col == q_row.T``). BLOCKWISE/MX with ``scaling_recipe.use_2d_block``: B x B
    blocks, scale_inv_row ``[ceil(M/B), ceil(K/B)]``, q_col transposed with scale_inv_col the
    transposed scales.
    """
    op = "quantize_fp8_with_trans"
    g, block = _common_args(op, x, _HP_KIND, out_dtype, _FP8_KIND, granularity, block_size)
    two_d = _use_2d(scaling_recipe) and g in (_BLOCKWISE, _MX)
    trans_2d = two_d if scaling_recipe_for_trans is None else (
        _use_2d(scaling_recipe_for_trans, "scaling_recipe_for_trans") and g in (_BLOCKWISE, _MX)
    )
    if trans_2d != two_d:
        raise ValueError(
            f"{op}: 'scaling_recipe' and 'scaling_recipe_for_trans' must agree on use_2d_block "
            "(2-D blocks are shared by both outputs)"
        )
    in_place_col = g == _BLOCKWISE and not two_d
    flags = _FLAG_2D if two_d else 0
    return _quantize_op(_as_2d(x), out_dtype, g, block, True, True, not in_place_col, flags, 0)


@native.raises_python_errors
def dequantize_fp8(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    *,
    block_size: int | None = None,
    axis: int | None = None,
    scale_inv: torch.Tensor,
    scaling_recipe: ScalingRecipe | None = None,
) -> torch.Tensor:
    """The inverse of :func:`quantize_fp8` for the same granularity, axis and recipe. MX_BLOCKWISE
    (1-D blocks) reads the original library's padded layouts and keeps the padding: x
    ``[..., K_pad]`` along the last dim gives ``[..., K_pad]``; the transposed ``[N, M_pad]`` /
    ``[G, N, M_pad]`` of axis 0 / 1 gives ``[M_pad, N]`` / ``[G, M_pad, N]``. Every other case:
    :func:`dequantize_fp8_unpadded`."""
    if _mx_1d(granularity, scaling_recipe) and isinstance(x, torch.Tensor) and x.dim() in (2, 3):
        _common_args("dequantize_fp8", x, _FP8_KIND, out_dtype, _HP_KIND, granularity, block_size)
        _check_scale_inv("dequantize_fp8", x, scale_inv)
        _use_2d(scaling_recipe)
        dim = _axis_dim("dequantize_fp8", axis, x.dim())
        if dim == x.dim() - 2:
            out = dequantize_fp8_unpadded(x, out_dtype, granularity, block_size=block_size, axis=-1,
                                          scale_inv=scale_inv)
            return out.transpose(-1, -2).contiguous()
    return dequantize_fp8_unpadded(x, out_dtype, granularity, block_size=block_size, axis=axis, scale_inv=scale_inv,
                                   scaling_recipe=scaling_recipe)


@native.raises_python_errors
def dequantize_fp8_unpadded(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    *,
    block_size: int | None = None,
    axis: int | None = None,
    scale_inv: torch.Tensor,
    scaling_recipe: ScalingRecipe | None = None,
) -> torch.Tensor:
    """``x * scale_inv`` in ``out_dtype`` (float32/float16/bfloat16), x's shape; the scales laid out
    as :func:`quantize_fp8` returns them for the same granularity, axis and recipe (a transposed
    output of :func:`quantize_fp8_with_trans` is dequantized with axis -1, BLOCKWISE's in-place one
    with axis 0). Along the last dim, scales with the leading dims flattened are accepted too."""
    op = "dequantize_fp8"
    g, block = _common_args(op, x, _FP8_KIND, out_dtype, _HP_KIND, granularity, block_size)
    return _dequantize_fp8_checked(op, x, out_dtype, g, block, axis, scale_inv, scaling_recipe)


def _dequantize_fp8_checked(op: str, x, out_dtype, g: int, block, axis, scale_inv, scaling_recipe) -> torch.Tensor:
    """:func:`dequantize_fp8_unpadded` once ``_common_args`` has checked x, the dtypes, the
    granularity ``g`` and ``block``; ``op`` names the messages (the grouped dequantize calls it too)."""
    _check_scale_inv(op, x, scale_inv)
    two_d, dim = _fp8_layout(op, g, scaling_recipe, axis, x.dim())
    if dim is None or dim == x.dim() - 1:
        flat = dim is not None and scale_inv.dim() != 2  # [..., groups] or [groups] -> [rows, groups]
        if flat and (scale_inv.dim() != x.dim() or scale_inv.shape[:-1] != x.shape[:-1]):
            raise ValueError(
                f"{op}: argument 'scale_inv' has shape {tuple(scale_inv.shape)}; along the last dim of x "
                f"{tuple(x.shape)} expected [{', '.join(map(str, x.shape[:-1]))}, groups] or [rows, groups]"
            )
        s = scale_inv.reshape(math.prod(x.shape[:-1]), scale_inv.shape[-1]) if flat else scale_inv
        out = _dequantize_op(_as_2d(x), s, out_dtype, g, block, -1, _FLAG_2D if two_d else 0)
        return out.view(x.shape)
    if x.dim() == 2:
        return _dequantize_op(x, scale_inv, out_dtype, g, block, 0, 0)
    if scale_inv.dim() != x.dim():
        raise ValueError(
            f"{op}: argument 'scale_inv' has shape {tuple(scale_inv.shape)}; expected x's rank ({x.dim()}) "
            f"with dim {dim} holding the groups along axis {axis}"
        )
    out = _dequantize_fp8_checked(op, x.movedim(dim, -1), out_dtype, g, block, -1, scale_inv.movedim(dim, -1), None)
    return out.movedim(-1, dim).contiguous()


# ---- FP4 (MXFP4) ------------------------------------------------------------------------------------

_seed_counter = itertools.count(1)


def quantize_fp4(
    x: torch.Tensor,
    out_dtype: torch.dtype = _FP4_DTYPE,
    granularity: ScalingGranularity = ScalingGranularity.MX_BLOCKWISE,
    *,
    block_size: int | None = MX_BLOCK_SIZE,
    axis: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 in the original library's padded layouts: :func:`quantize_fp4_unpadded` of x with the
    quantized dim zero-padded to a multiple of 128, so along the last dim q is ``[M, K_pad/2]``,
    scale_inv ``[M, K_pad/32]``, and along the rows (stored transposed) ``[K, M_pad/2]``,
    ``[K, M_pad/32]`` (3-D per group: ``[G, M, N_pad/2]``, ``[G, N, M_pad/2]``).
    :func:`dequantize_fp4` keeps the padding (``[M, K_pad]`` / ``[M_pad, K]``)."""
    if isinstance(x, torch.Tensor) and isinstance(axis, int) and not isinstance(axis, bool):
        _common_args("quantize_fp4", x, _HP_KIND, out_dtype, _FP4_KIND, granularity, block_size, mx_only=True)
        if x.dim() == 3:
            along_last = _fp4_batched_along_last("quantize_fp4", axis)
        else:
            along_last = _along_last("quantize_fp4", axis, x.dim())
        if along_last:
            x = _pad_dim(x, x.dim() - 1)
        elif x.dim() in (2, 3):  # other ranks quantize the rows of the flattened leading dims as they are
            x = _pad_dim(x, x.dim() - 2)
    return quantize_fp4_unpadded(x, out_dtype, granularity, block_size=block_size, axis=axis,
                                 scaling_recipe=scaling_recipe, seed=seed)


def quantize_fp4_unpadded(
    x: torch.Tensor,
    out_dtype: torch.dtype = _FP4_DTYPE,
    granularity: ScalingGranularity = ScalingGranularity.MX_BLOCKWISE,
    *,
    block_size: int | None = MX_BLOCK_SIZE,
    axis: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 (E2M1, two values per byte, low nibble = even element; one E8M0 scale per 32 values).

    x ``[M, K]`` (3-D: below). axis -1: q ``[M, K/2]``, scale_inv ``[M, ceil(K/32)]``;
    axis 0: quantized along M and stored transposed, q ``[K, M/2]``, scale_inv ``[K, ceil(M/32)]``.
    The quantized dim must be even (packing); a last partial block of 32 is scaled on its own.
    ``scaling_recipe``: ``use_2d_block`` 32x32 blocks (scale_inv ``[ceil(M/32), ceil(K/32)]`` for
    axis -1, its transpose for axis 0, so a weight and its transpose share scales); ``use_rht``
    random Hadamard transform of each 16 values along the quantized dim (q holds the transformed
    values; see ``RHT_SIGNS``; the dim must be a multiple of 16); ``use_sr`` stochastic rounding,
    deterministic for a given ``seed`` (None: a new seed per call from a process-wide counter).
    A 3-D ``[G, M, N]`` input (per-group operands, e.g. expert weights): axis 2 (or -1) quantizes
    along N, q ``[G, M, N/2]``, scale_inv ``[G, M, ceil(N/32)]``; axis 1 (or -2) along M with each
    group stored transposed, q ``[G, N, M/2]``, scale_inv ``[G, N, ceil(M/32)]`` (2-D blocks:
    ``[G, rows/32, cols/32]``, rows per group a multiple of 32).
    """
    op = "quantize_fp4"
    g, block = _common_args(op, x, _HP_KIND, out_dtype, _FP4_KIND, granularity, block_size, mx_only=True)
    if x.dim() == 3:  # per group: the 2-D quantization of the groups stacked along their rows
        src = x if _fp4_batched_along_last(op, axis) else x.transpose(1, 2)
        groups, rows, cols = src.shape
        if scaling_recipe is not None and _use_2d(scaling_recipe) and rows % 32:
            raise ValueError(f"{op}: 2-D blocks of a [G, M, N] input need {rows} rows a group to be a multiple of 32 "
                             "(a block must not span two groups)")
        q, s = quantize_fp4_unpadded(src.reshape(groups * rows, cols), out_dtype, granularity, block_size=block_size,
                                     axis=-1, scaling_recipe=scaling_recipe, seed=seed)
        return q.view(groups, rows, q.shape[-1]), s.view(groups, -1, s.shape[-1])
    if scaling_recipe is not None and not isinstance(scaling_recipe, ScalingRecipe):
        raise TypeError(f"{op}: scaling_recipe must be a ScalingRecipe or None, got {type(scaling_recipe).__name__}")
    _use_2d(scaling_recipe)
    r = scaling_recipe or ScalingRecipe()
    along_k = _along_last(op, axis, x.dim())
    x2 = _as_2d(x)
    m, k = x2.shape
    dim = k if along_k else m
    if dim % 2:
        raise ValueError(f"{op}: argument 'x' has shape {tuple(x.shape)}; the quantized dim ({dim}) must be even (two FP4 values per byte)")
    if r.use_rht and dim % 16:
        raise ValueError(f"{op}: use_rht needs the quantized dim to be a multiple of 16, got {dim}")
    if r.use_rht and r.use_2d_block:
        raise ValueError(f"{op}: use_rht and use_2d_block cannot be combined (the transform runs along one dim)")
    flags = (_FLAG_2D if r.use_2d_block else 0) | (_FLAG_RHT if r.use_rht else 0) | (_FLAG_SR if r.use_sr else 0)
    if seed is None:
        seed = next(_seed_counter) if r.use_sr else 0
    else:
        try:
            if isinstance(seed, bool):
                raise TypeError
            seed = operator.index(seed)  # ints and numpy / torch integers; never floats
        except TypeError:
            raise TypeError(f"{op}: argument 'seed' must be an int or None, got {seed!r}") from None
        # A seed is 64 random bits: any int, taken modulo 2^64 and passed as the op's signed int64.
        seed &= 2**64 - 1
        seed -= 2**64 if seed >= 2**63 else 0
    q_row, s_row, q_col, s_col = _quantize_op(x2, _FP4_DTYPE, g, block, along_k, not along_k, True, flags, int(seed))
    q, s = (q_row, s_row) if along_k else (q_col, s_col)
    return (q.view(torch.uint8) if out_dtype == torch.uint8 and q.dtype != torch.uint8 else q), s


def quantize_fp4_with_trans(
    x: torch.Tensor,
    out_dtype: torch.dtype = _FP4_DTYPE,
    granularity: ScalingGranularity = ScalingGranularity.MX_BLOCKWISE,
    *,
    block_size: int | None = MX_BLOCK_SIZE,
    axis: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
    scaling_recipe_for_trans: ScalingRecipe | None = None,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize_fp4_with_trans_unpadded` in the original library's padded layouts (each
    copy's quantized dim zero-padded to a multiple of 128, as :func:`quantize_fp4`)."""
    return _fp4_with_trans(quantize_fp4, x, out_dtype, granularity, block_size, axis, scaling_recipe,
                           scaling_recipe_for_trans, seed)


def quantize_fp4_with_trans_unpadded(
    x: torch.Tensor,
    out_dtype: torch.dtype = _FP4_DTYPE,
    granularity: ScalingGranularity = ScalingGranularity.MX_BLOCKWISE,
    *,
    block_size: int | None = MX_BLOCK_SIZE,
    axis: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
    scaling_recipe_for_trans: ScalingRecipe | None = None,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both MXFP4 quantizations of x: ``(q_row, scale_inv_row, q_col, scale_inv_col)``, q_row as
    :func:`quantize_fp4` along the last dim, q_col along the rows and stored transposed (axis 0 of
    :func:`quantize_fp4`: ``[K, M/2]`` for x ``[M, K]``; ``[G, N, M/2]`` per group for x
    ``[G, M, N]``). ``axis`` is implied by the two directions and must be None.
    ``scaling_recipe_for_trans`` (default: ``scaling_recipe``) is the transposed copy's recipe, e.g.
    the random Hadamard transform or stochastic rounding only on the wgrad operand. Each copy is
    one quantize launch; with stochastic rounding, ``seed`` seeds the row copy and ``seed + 1``
    the transposed one."""
    return _fp4_with_trans(quantize_fp4_unpadded, x, out_dtype, granularity, block_size, axis, scaling_recipe,
                           scaling_recipe_for_trans, seed)


def _fp4_with_trans(quantize, x, out_dtype, granularity, block_size, axis, scaling_recipe, scaling_recipe_for_trans,
                    seed):
    op = "quantize_fp4_with_trans"
    if axis is not None:
        raise ValueError(f"{op}: argument 'axis' must be None (both directions are produced), got {axis!r}")
    _common_args(op, x, _HP_KIND, out_dtype, _FP4_KIND, granularity, block_size, mx_only=True)
    for recipe in (scaling_recipe, scaling_recipe_for_trans):
        _use_2d(recipe)
    row_recipe = scaling_recipe or ScalingRecipe()
    col_recipe = scaling_recipe_for_trans or row_recipe
    last, first = (-1, -2) if x.dim() == 3 else (-1, 0)
    q_row, s_row = quantize(x, out_dtype, granularity, block_size=block_size, axis=last, scaling_recipe=row_recipe,
                            seed=seed)
    q_col, s_col = quantize(x, out_dtype, granularity, block_size=block_size, axis=first, scaling_recipe=col_recipe,
                            seed=None if seed is None else seed + 1)
    return q_row, s_row, q_col, s_col


@native.raises_python_errors
def dequantize_fp4(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity = ScalingGranularity.MX_BLOCKWISE,
    *,
    block_size: int | None = MX_BLOCK_SIZE,
    axis: int | None = None,
    scale_inv: torch.Tensor,
    scaling_recipe: ScalingRecipe | None = None,
) -> torch.Tensor:
    """Inverse of :func:`quantize_fp4` for the same axis and recipe: returns ``[M, K]``. For axis 0 the
    stored ``[K, M/2]`` data is dequantized along its rows and returned as a ``[M, K]`` transposed
    view. With ``use_rht`` the values stay in the transformed domain (the GEMM operands are both
    transformed, so the transform cancels in the product)."""
    op = "dequantize_fp4"
    _check_tensor(op, "x", x, (_FP4_DTYPE, torch.uint8), f"{_FP4_DTYPE} (or uint8)")
    if x.dim() == 3:  # per group, as quantize_fp4 lays a [G, M, N] input out
        along_last = _fp4_batched_along_last(op, axis)
        _check_scale_inv(op, x, scale_inv)
        groups, rows, half = x.shape
        out = dequantize_fp4(x.reshape(groups * rows, half), out_dtype, granularity, block_size=block_size, axis=-1,
                             scale_inv=scale_inv.reshape(-1, scale_inv.shape[-1]), scaling_recipe=scaling_recipe)
        out = out.view(groups, rows, out.shape[-1])
        return out if along_last else out.transpose(1, 2)
    if x.dim() != 2:
        raise ValueError(f"{op}: argument 'x' has shape {tuple(x.shape)}; expected 2-D or 3-D packed data")
    _check_out_dtype(op, out_dtype, _HP_KIND)
    g, block = _granularity_and_block(op, granularity, block_size, mx_only=True)
    _check_scale_inv(op, x, scale_inv)
    along_k = _along_last(op, axis, 2)
    flags = _FLAG_2D if _use_2d(scaling_recipe) else 0
    out = _dequantize_op(x, scale_inv, out_dtype, g, block, -1, flags)  # FP4 or its uint8 view: both read as packed FP4
    return out if along_k else out.t()
