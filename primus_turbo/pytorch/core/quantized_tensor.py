"""Pre-quantized operands: ``QuantizedTensor`` (FP8 / FP4 data, its ``scale_inv`` and how it was
quantized), ``QuantizedTensorPair`` (the copies a forward and a backward read) and
``create_quantized_weight``. A trainer quantizes a weight once per step and passes it to every
low-precision op (``gemm_fp8``, ``grouped_gemm_fp8``, ``gemm_fp4``, the modules) in place of the
high-precision tensor; the op reads it without quantizing again, and its gradient flows to the
``QuantizedTensor`` as a high-precision tensor of the same shape (straight-through).

A ``QuantizedTensor`` is a ``torch.Tensor`` subclass whose shape and dtype are those of the
high-precision tensor it stands for; the quantized buffers live inside (``qdata``, ``scale_inv``).
Layouts are the GEMMs' (the quantize ops' unpadded ones; the public MX quantizers pad to 128):

- FP8 (``quantize_fp8_unpadded``): ``qdata`` has the tensor's shape; ``scale_inv`` per
  ``quantized_axis``.
- FP4 (``quantize_fp4_unpadded``): along the last dim ``qdata`` is ``[..., K/2]``; along the first
  dim of a 2-D tensor it is stored transposed, ``[K, M/2]``.
- Grouped tokens (``group_lens`` given, BLOCKWISE / MX): the padded per-group layouts of
  ``grouped_quantize_fp8`` / ``grouped_quantize_fp4``, with the padded lens and offsets kept.

Views that keep the quantized layout (``view`` / ``reshape`` of leading dims, ``detach``) stay
quantized; ``t()`` / ``transpose`` of an FP8 tensor moves data and scales together (exact; the
quantized dim follows), of an FP4 tensor or of 2-D blocks over a 3-D tensor it re-quantizes the
dequantized values along the new axis. Any other torch op raises: call ``dequantize()`` first.
"""

from __future__ import annotations

import math
import weakref
from typing import NamedTuple, Optional

import torch

from primus_turbo.pytorch.core.low_precision import (
    Float4QuantConfig,
    Float8QuantConfig,
    Format,
    ScalingGranularity,
    ScalingRecipe,
    float4_e2m1fn_x2,
)

__all__ = ["QuantizedTensor", "QuantizedTensorPair", "create_quantized_weight", "check_quantized_tensor"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_FP4 = float4_e2m1fn_x2 if float4_e2m1fn_x2 is not None else torch.uint8
_HP = (torch.float32, torch.float16, torch.bfloat16)


def _is_fp4(dtype: torch.dtype) -> bool:
    return dtype == _FP4


def _norm_axis(axis: Optional[int], ndim: int) -> Optional[int]:
    return None if axis is None else axis % ndim


def _two_d(granularity: ScalingGranularity, recipe: Optional[ScalingRecipe]) -> bool:
    return granularity in (ScalingGranularity.BLOCKWISE, ScalingGranularity.MX_BLOCKWISE) and bool(
        recipe is not None and recipe.use_2d_block
    )


# id(QuantizedTensor) -> its memo (QuantizedTensor.memoized): kept beside the tensor, not in it, so
# copies, pickles and checkpoints never carry it; a finalizer drops it with the tensor. (Keyed by
# id: a WeakKeyDictionary would compare tensors with ==.)
_OPERAND_MEMOS: dict = {}


def _attach_memo(t, memo: dict) -> dict:
    if id(t) not in _OPERAND_MEMOS:
        weakref.finalize(t, _OPERAND_MEMOS.pop, id(t), None)
    _OPERAND_MEMOS[id(t)] = memo
    return memo


class QuantizedTensor(torch.Tensor):
    """A high-precision tensor held quantized: see the module docstring."""

    @staticmethod
    def __new__(
        cls,
        data: torch.Tensor,
        scale_inv: torch.Tensor,
        *,
        shape,
        orig_dtype: torch.dtype,
        dest_dtype: torch.dtype,
        granularity: ScalingGranularity,
        block_size: Optional[int] = None,
        scaling_recipe: Optional[ScalingRecipe] = None,
        quantized_axis: Optional[int] = None,
        group_lens: Optional[torch.Tensor] = None,
        group_offs: Optional[torch.Tensor] = None,
        orig_group_lens: Optional[torch.Tensor] = None,
        orig_group_offs: Optional[torch.Tensor] = None,
        is_grouped_tensor: bool = False,
        requires_grad: bool = False,
    ):
        if not isinstance(data, torch.Tensor) or not isinstance(scale_inv, torch.Tensor):
            raise TypeError("QuantizedTensor: 'data' and 'scale_inv' must be tensors")
        if dest_dtype not in _FP8 and not _is_fp4(dest_dtype):
            raise TypeError(f"QuantizedTensor: dest_dtype {dest_dtype} is not an FP8 or FP4 dtype")
        if orig_dtype not in _HP:
            raise TypeError(f"QuantizedTensor: orig_dtype {orig_dtype} must be float32, float16 or bfloat16")
        if not isinstance(granularity, ScalingGranularity):
            raise TypeError(f"QuantizedTensor: granularity must be a ScalingGranularity, got {granularity!r}")
        fp4 = _is_fp4(dest_dtype)
        if (data.dtype not in (_FP4, torch.uint8)) if fp4 else (data.dtype != dest_dtype):
            raise TypeError(f"QuantizedTensor: 'data' has dtype {data.dtype}; dest_dtype {dest_dtype} needs it")
        if scale_inv.device != data.device:
            raise ValueError(f"QuantizedTensor: 'scale_inv' is on {scale_inv.device} but 'data' on {data.device}")
        if not is_grouped_tensor and data.numel() * (2 if fp4 else 1) != math.prod(shape):
            raise ValueError(
                f"QuantizedTensor: 'data' of shape {tuple(data.shape)} cannot hold a tensor of shape {tuple(shape)}"
            )
        self = torch.Tensor._make_wrapper_subclass(
            cls, torch.Size(shape), dtype=orig_dtype, device=data.device, requires_grad=requires_grad
        )
        self._data, self._scale_inv = data.contiguous(), scale_inv.contiguous()
        self._orig_dtype, self._dest_dtype = orig_dtype, dest_dtype
        self._granularity, self._block_size, self._scaling_recipe = granularity, block_size, scaling_recipe
        self._quantized_axis = quantized_axis
        self._group_lens, self._group_offs = group_lens, group_offs
        self._orig_group_lens, self._orig_group_offs = orig_group_lens, orig_group_offs
        self._is_grouped_tensor = bool(is_grouped_tensor)
        return self

    def memoized(self, key, make):
        """``make()``, kept for the tensor's life under ``key``: a restatement of the quantized data
        for a kernel (e.g. the grouped GEMM's transposed weight), computed once however many GEMMs
        read it (a weight cached for a step serves every micro-batch). The data never changes in
        place, and aliases (``detach``) share the memo. Not kept while torch.compile traces."""
        if torch.compiler.is_compiling():
            return make()
        memo = _OPERAND_MEMOS.get(id(self))
        if memo is None:
            memo = _attach_memo(self, {})
        if key not in memo:
            memo[key] = make()
        return memo[key]

    # ---- construction from a high-precision tensor ------------------------------------------------

    @classmethod
    @torch.no_grad()
    def quantize(
        cls,
        hp_tensor: torch.Tensor,
        dest_dtype: torch.dtype,
        granularity: ScalingGranularity,
        *,
        axis: Optional[int] = None,
        group_lens: Optional[torch.Tensor] = None,
        block_size: Optional[int] = None,
        scaling_recipe: Optional[ScalingRecipe] = None,
        amax: Optional[torch.Tensor] = None,
        quantized: Optional[tuple] = None,
    ) -> "QuantizedTensor":
        """``hp_tensor`` (2-D or 3-D) quantized to ``dest_dtype`` (E4M3, E5M2 or packed E2M1) along
        ``axis`` (required unless TENSORWISE or 2-D blocks). ``group_lens``: a 2-D ``[tokens, N]``
        of grouped tokens; BLOCKWISE / MX use the grouped quantizers' padded layouts, TENSORWISE /
        ROWWISE the plain ones (their scales do not depend on the groups)."""
        from primus_turbo.pytorch.ops import grouped_quantization as gq
        from primus_turbo.pytorch.ops import quantization as qz

        if not isinstance(hp_tensor, torch.Tensor) or isinstance(hp_tensor, QuantizedTensor):
            raise TypeError("QuantizedTensor.quantize: 'hp_tensor' must be a high-precision torch.Tensor")
        if hp_tensor.dim() not in (2, 3):
            raise ValueError(f"QuantizedTensor.quantize: expected a 2-D or 3-D tensor, got shape {tuple(hp_tensor.shape)}")
        fp4 = _is_fp4(dest_dtype)
        if fp4 and granularity != ScalingGranularity.MX_BLOCKWISE:
            raise ValueError(f"QuantizedTensor.quantize: FP4 takes MX_BLOCKWISE only, got {granularity}")
        needs_axis = granularity != ScalingGranularity.TENSORWISE and not _two_d(granularity, scaling_recipe)
        if needs_axis and axis is None:
            raise ValueError(f"QuantizedTensor.quantize: argument 'axis' is required for {granularity.name}")
        ndim = hp_tensor.dim()
        norm = _norm_axis(axis, ndim) if axis is not None else None
        # The block size as the quantizers apply it (MX is always 32; per-tensor / per-row have none),
        # so it compares equal to a config's.
        if granularity == ScalingGranularity.MX_BLOCKWISE and block_size is None:
            block_size = 32
        elif granularity in (ScalingGranularity.TENSORWISE, ScalingGranularity.ROWWISE):
            block_size = None
        meta = dict(shape=hp_tensor.shape, orig_dtype=hp_tensor.dtype, dest_dtype=dest_dtype, granularity=granularity,
                    block_size=block_size, scaling_recipe=scaling_recipe, quantized_axis=norm)
        grouped = group_lens is not None and granularity in (ScalingGranularity.BLOCKWISE, ScalingGranularity.MX_BLOCKWISE)
        if group_lens is not None and ndim != 2:
            raise ValueError("QuantizedTensor.quantize: grouped tokens must be a 2-D [tokens, N] tensor")
        if grouped:
            if fp4:
                q, s, lens_p, offs_p = gq.grouped_quantize_fp4(hp_tensor, dest_dtype, granularity, group_lens,
                                                               block_size=block_size, axis=axis,
                                                               scaling_recipe=scaling_recipe)
            else:
                q, s, lens_p, offs_p = gq.grouped_quantize_fp8(hp_tensor, dest_dtype, granularity, group_lens,
                                                               block_size=block_size, axis=axis,
                                                               scaling_recipe=scaling_recipe)
            lens, offs = gq._as_int64(*gq._check_groups("QuantizedTensor.quantize", hp_tensor, group_lens, None))
            return cls(q, s, **meta, group_lens=lens_p, group_offs=offs_p, orig_group_lens=lens, orig_group_offs=offs,
                       is_grouped_tensor=True, requires_grad=hp_tensor.requires_grad)
        if quantized is not None:  # (q, scale_inv) made elsewhere as the quantizer would (the optimizer's)
            if fp4 or group_lens is not None:
                raise ValueError("QuantizedTensor.quantize: 'quantized' takes FP8 of an ungrouped tensor")
            q, s = quantized
        elif amax is not None:
            if granularity != ScalingGranularity.TENSORWISE or fp4 or group_lens is not None:
                raise ValueError("QuantizedTensor.quantize: 'amax' is for TENSORWISE FP8 of an ungrouped tensor")
            q, s = qz.quantize_fp8_with_amax(hp_tensor, dest_dtype, amax)
        elif fp4:
            q, s = qz.quantize_fp4_unpadded(hp_tensor, dest_dtype, granularity, block_size=block_size, axis=axis,
                                            scaling_recipe=scaling_recipe)
        else:
            q, s = qz.quantize_fp8_unpadded(hp_tensor, dest_dtype, granularity, block_size=block_size, axis=axis,
                                            scaling_recipe=scaling_recipe)
        extra = {}
        if group_lens is not None:  # TENSORWISE / ROWWISE: the plain layout, groups kept for the ops
            lens, offs = gq._as_int64(*gq._check_groups("QuantizedTensor.quantize", hp_tensor, group_lens, None))
            extra = dict(group_lens=lens, group_offs=offs, orig_group_lens=lens, orig_group_offs=offs,
                         is_grouped_tensor=True)
        return cls(q, s, **meta, **extra, requires_grad=hp_tensor.requires_grad)

    # ---- properties ----------------------------------------------------------------------------

    @property
    def qdata(self) -> torch.Tensor:
        """The quantized buffer (FP8, or packed FP4)."""
        return self._data

    @property
    def scale_inv(self) -> torch.Tensor:
        return self._scale_inv

    @property
    def real_dtype(self) -> torch.dtype:
        """The quantized dtype (``dtype`` is the high-precision one this tensor stands for)."""
        return self._dest_dtype

    @property
    def granularity(self) -> ScalingGranularity:
        return self._granularity

    @property
    def block_size(self) -> Optional[int]:
        return self._block_size

    @property
    def scaling_recipe(self) -> Optional[ScalingRecipe]:
        return self._scaling_recipe

    @property
    def quantized_axis(self) -> Optional[int]:
        """The dim quantized along (non-negative), or None (TENSORWISE, 2-D blocks)."""
        return self._quantized_axis

    @property
    def is_grouped_tensor(self) -> bool:
        return self._is_grouped_tensor

    @property
    def group_lens(self) -> torch.Tensor:
        """Per-group row counts of the quantized (padded) layout."""
        if not self._is_grouped_tensor:
            raise AttributeError("QuantizedTensor.group_lens: not a grouped tensor")
        return self._group_lens

    @property
    def group_offs(self) -> torch.Tensor:
        """Group starts (and the end) in the quantized (padded) layout."""
        if not self._is_grouped_tensor:
            raise AttributeError("QuantizedTensor.group_offs: not a grouped tensor")
        return self._group_offs

    @property
    def orig_group_lens(self) -> Optional[torch.Tensor]:
        return self._orig_group_lens

    @property
    def orig_group_offs(self) -> Optional[torch.Tensor]:
        return self._orig_group_offs

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: D105
        return (
            f"QuantizedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, real_dtype={self._dest_dtype}, "
            f"granularity={self._granularity.name}, block_size={self._block_size}, axis={self._quantized_axis}, "
            f"grouped={self._is_grouped_tensor}, device={self.device})"
        )

    # ---- back to high precision ----------------------------------------------------------------

    @torch.no_grad()
    def dequantize(self) -> torch.Tensor:
        """The high-precision tensor (``dtype``, ``shape``) the quantized values stand for."""
        from primus_turbo.pytorch.ops import grouped_quantization as gq
        from primus_turbo.pytorch.ops import quantization as qz

        g, kw = self._granularity, dict(block_size=self._block_size, scaling_recipe=self._scaling_recipe)
        padded = self._is_grouped_tensor and g in (ScalingGranularity.BLOCKWISE, ScalingGranularity.MX_BLOCKWISE)
        if _is_fp4(self._dest_dtype):
            # FP4 rows are stored along the quantized dim (transposed when that is not the last):
            # dequantize them as stored, undo the Hadamard transform, then turn them back.
            stored = qz.dequantize_fp4(self._data, self._orig_dtype, g, axis=-1, scale_inv=self._scale_inv, **kw)
            if self._scaling_recipe is not None and self._scaling_recipe.use_rht:
                stored = qz.undo_rht(stored)
            along_last = self._quantized_axis in (None, self._data.dim() - 1)
            out = stored if along_last else stored.transpose(-2, -1)
            if padded and not along_last:  # the padded column copy: gather the tokens back
                from primus_turbo.pytorch.ops._group_padding import gather_groups

                out = gather_groups(out, self._orig_group_offs, self._group_offs, self.shape[0], self._orig_group_lens)
        elif padded:
            out = gq.grouped_dequantize_fp8(
                self._data, self._orig_dtype, g, self._orig_group_offs, self._group_offs, axis=self._quantized_axis,
                scale_inv=self._scale_inv, total_M=self.shape[0], **kw,
            )
        else:
            axis = -1 if self._quantized_axis is None else self._quantized_axis
            out = qz.dequantize_fp8_unpadded(self._data, self._orig_dtype, g, axis=axis, scale_inv=self._scale_inv, **kw)
        if tuple(out.shape) != tuple(self.shape):  # padding columns (MX row copies)
            out = out[..., : self.shape[-1]]
        return out.contiguous()

    # ---- torch.compile / FSDP flattening ---------------------------------------------------------

    _INNER = ("_data", "_scale_inv", "_group_lens", "_group_offs", "_orig_group_lens", "_orig_group_offs")
    _META = ("_orig_dtype", "_dest_dtype", "_granularity", "_block_size", "_scaling_recipe", "_quantized_axis",
             "_is_grouped_tensor")

    def __tensor_flatten__(self):
        return [k for k in self._INNER if getattr(self, k) is not None], {k: getattr(self, k) for k in self._META}

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return QuantizedTensor(
            inner["_data"], inner["_scale_inv"], shape=outer_size, orig_dtype=meta["_orig_dtype"],
            dest_dtype=meta["_dest_dtype"], granularity=meta["_granularity"], block_size=meta["_block_size"],
            scaling_recipe=meta["_scaling_recipe"], quantized_axis=meta["_quantized_axis"],
            group_lens=inner.get("_group_lens"), group_offs=inner.get("_group_offs"),
            orig_group_lens=inner.get("_orig_group_lens"), orig_group_offs=inner.get("_orig_group_offs"),
            is_grouped_tensor=meta["_is_grouped_tensor"],
        )

    def _like(self, data: torch.Tensor, scale_inv: torch.Tensor, shape, axis: Optional[int]) -> "QuantizedTensor":
        return QuantizedTensor(
            data, scale_inv, shape=shape, orig_dtype=self._orig_dtype, dest_dtype=self._dest_dtype,
            granularity=self._granularity, block_size=self._block_size, scaling_recipe=self._scaling_recipe,
            quantized_axis=axis, group_lens=self._group_lens, group_offs=self._group_offs,
            orig_group_lens=self._orig_group_lens, orig_group_offs=self._orig_group_offs,
            is_grouped_tensor=self._is_grouped_tensor,
        )

    # ---- the torch ops a quantized tensor supports ------------------------------------------------

    def _reshaped(self, shape) -> "QuantizedTensor":
        """A reshape that keeps the last dim (and so every scale group): data and scales follow."""
        shape = list(shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape)
        if shape.count(-1) > 1 or any(d < -1 for d in shape):
            raise ValueError(f"QuantizedTensor: invalid shape {tuple(shape)} for a reshape")
        if -1 in shape:  # aten.view gets the sizes as written: infer the one -1
            known = math.prod(d for d in shape if d != -1)
            shape[shape.index(-1)] = self.numel() // known if known else 0
        if math.prod(shape) != self.numel():
            raise ValueError(
                f"QuantizedTensor: shape {tuple(shape)} is invalid for a tensor of shape {tuple(self.shape)} "
                f"({self.numel()} elements)"
            )
        shape = torch.Size(shape)
        if shape == self.shape:
            return self._like(self._data, self._scale_inv, shape, self._quantized_axis)
        last_kept = len(shape) >= 1 and shape[-1] == self.shape[-1]
        along_last = self._quantized_axis is None or self._quantized_axis == self.dim() - 1
        if self._is_grouped_tensor or not last_kept or not along_last or _two_d(self._granularity, self._scaling_recipe):
            raise NotImplementedError(
                f"QuantizedTensor: reshape {tuple(self.shape)} -> {tuple(shape)} would split scale groups; only "
                "reshapes of the leading dims of a tensor quantized along its last dim (or TENSORWISE) stay quantized. "
                "Call dequantize() first"
            )
        data = self._data.reshape(*shape[:-1], self._data.shape[-1])
        scale = self._scale_inv if self._scale_inv.dim() == 0 else self._scale_inv.reshape(*shape[:-1], self._scale_inv.shape[-1])
        axis = None if self._quantized_axis is None else len(shape) - 1
        return self._like(data, scale, shape, axis)

    def _transposed(self, d0: int, d1: int) -> "QuantizedTensor":
        """The transpose of dims d0 and d1. FP8: exact (data and scales move together; the quantized
        dim follows) except 2-D blocks of a 3-D tensor, whose blocks span experts: those, and FP4
        (packed along its quantized dim), are dequantized and quantized again along the new axis."""
        nd = self.dim()
        for d in (d0, d1):
            if isinstance(d, bool) or not isinstance(d, int) or not -nd <= d < nd:
                raise IndexError(f"QuantizedTensor.transpose: dim {d!r} is out of range for a {nd}-D tensor")
        d0, d1 = d0 % nd, d1 % nd
        if d0 == d1:
            return self._like(self._data, self._scale_inv, self.shape, self._quantized_axis)
        if self._is_grouped_tensor:
            raise NotImplementedError("QuantizedTensor: a grouped tensor cannot be transposed; call dequantize() first")
        shape = list(self.shape)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        swap = {d0: d1, d1: d0}
        axis = self._quantized_axis
        two_d = _two_d(self._granularity, self._scaling_recipe)
        s = self._scale_inv
        # Exact when the scales lie as the data (1-D groups: the quantized dim grouped; 2-D blocks
        # of a 2-D tensor) or are one value; FP4 packing and blocks spanning experts are not.
        if not _is_fp4(self._dest_dtype) and not (two_d and nd > 2) and s.dim() in (0, nd):
            from primus_turbo.pytorch.ops._transpose import transpose_last2

            last2 = {d0, d1} == {nd - 2, nd - 1}
            data = transpose_last2(self._data) if last2 else self._data.transpose(d0, d1).contiguous()
            s = s.transpose(d0, d1).contiguous() if s.dim() else s
            return self._like(data, s, torch.Size(shape), None if axis is None else swap.get(axis, axis))
        hp = self.dequantize().transpose(d0, d1)
        return QuantizedTensor.quantize(
            hp.contiguous(), self._dest_dtype, self._granularity, axis=None if axis is None else swap.get(axis, axis),
            block_size=self._block_size, scaling_recipe=self._scaling_recipe,
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        x = args[0] if args else None
        if isinstance(x, QuantizedTensor):
            if func in (aten.detach.default, aten.alias.default):
                alias = x._like(x._data.detach(), x._scale_inv.detach(), x.shape, x._quantized_axis)
                memo = _OPERAND_MEMOS.get(id(x))  # the same data: the same restatements, shared
                _attach_memo(alias, memo if memo is not None else _attach_memo(x, {}))
                return alias
            if func in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
                return x._reshaped(args[1])
            if func is aten.t.default:
                if x.dim() > 2:
                    raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.dim()}D")
                return x._transposed(0, x.dim() - 1)
            if func is aten.transpose.int:
                return x._transposed(args[1], args[2])
            if func in (aten.clone.default, aten.contiguous.default):
                return x._like(x._data.clone(), x._scale_inv.clone(), x.shape, x._quantized_axis)
        raise NotImplementedError(
            f"QuantizedTensor does not support {func}: it holds quantized data; call .dequantize() for a "
            "high-precision tensor, or pass it to a low-precision op (gemm_fp8, grouped_gemm_fp8, gemm_fp4)"
        )

    __torch_function__ = torch._C._disabled_torch_function_impl


class QuantizedTensorPair(NamedTuple):
    """An operand quantized both ways: ``data`` along the forward GEMM's reduction dim, ``data_t``
    along the other (what the backward GEMM that reads it needs; None: made from ``data`` when
    needed)."""

    data: QuantizedTensor
    data_t: Optional[QuantizedTensor] = None


def check_quantized_tensor(
    quantized_tensor: QuantizedTensor,
    config,
    axis: Optional[int] = None,
    scaling_recipe: Optional[ScalingRecipe] = None,
) -> None:
    """Raises ``ValueError`` unless ``quantized_tensor`` was quantized as ``config`` (any object with
    ``granularity`` and ``block_size``) says, along ``axis`` and with ``scaling_recipe`` when given."""
    if not isinstance(quantized_tensor, QuantizedTensor):
        raise TypeError(f"check_quantized_tensor: expected a QuantizedTensor, got {type(quantized_tensor).__name__}")
    if quantized_tensor.granularity != config.granularity:
        raise ValueError(f"QuantizedTensor granularity {quantized_tensor.granularity} does not match the config's "
                         f"{config.granularity}")
    if quantized_tensor.block_size != config.block_size:
        raise ValueError(f"QuantizedTensor block_size {quantized_tensor.block_size} does not match the config's "
                         f"{config.block_size}")
    if axis is not None and quantized_tensor.quantized_axis is not None:
        want = _norm_axis(axis, quantized_tensor.dim())
        if quantized_tensor.quantized_axis != want:
            raise ValueError(f"QuantizedTensor is quantized along axis {quantized_tensor.quantized_axis}; expected {want}")
    if scaling_recipe is not None and quantized_tensor.scaling_recipe != scaling_recipe:
        raise ValueError(f"QuantizedTensor scaling_recipe {quantized_tensor.scaling_recipe} does not match "
                         f"{scaling_recipe}")


def weight_scaling_recipe(quant_config) -> ScalingRecipe:
    """The recipe a weight is quantized with, as the ops quantize it: 2-D blocks for BLOCKWISE
    (128x128) and where the FP4 config's effective recipe (``gemm_fp4.recipe_of``) asks for them
    (32x32); 1-D otherwise (MXFP8 weights are scaled per 32 along K, as the MX GEMM reads them)."""
    if isinstance(quant_config, Float4QuantConfig):
        from primus_turbo.pytorch.ops.gemm_fp4 import recipe_of  # (the FP4 ops import this module)

        return ScalingRecipe(use_2d_block=bool(recipe_of(quant_config).use_2d_block))
    return ScalingRecipe(use_2d_block=quant_config.granularity == ScalingGranularity.BLOCKWISE)


def create_quantized_weight(
    weight: torch.Tensor,
    dest_dtype: torch.dtype,
    quant_config,
    need_weight_transpose_cache: bool = False,
    amax: Optional[torch.Tensor] = None,
    quantized: Optional[tuple] = None,
) -> tuple[QuantizedTensor, Optional[QuantizedTensor]]:
    """A weight ``[N, K]`` (or ``[G, N, K]`` per expert) quantized once for a step:
    ``(w, w_t)`` with ``w`` along K (axis -1; the forward of ``x @ w.T``) and, with
    ``need_weight_transpose_cache``, ``w_t`` along N (what the dgrad reads; for TENSORWISE and
    2-D blocks the same data, since their scales serve both orientations). Pass
    ``QuantizedTensorPair(w, w_t)`` as the op's weight with ``trans_b=True``. ``amax`` (TENSORWISE
    FP8 only): max |weight| as float32 ``[1]`` on its device, reduced elsewhere (e.g. by the
    optimizer's update), so the quantization skips its own amax pass; the result is the same.
    ``quantized``: ``(q, scale_inv)`` already made from ``weight`` exactly as this function's
    quantization along K would make them (e.g. by ``turbo.optim.FusedAdamW`` from its update): only
    wrapped."""
    if not isinstance(quant_config, (Float8QuantConfig, Float4QuantConfig)):
        raise TypeError(f"create_quantized_weight: quant_config must be a Float8QuantConfig or Float4QuantConfig, "
                        f"got {type(quant_config).__name__}")
    if isinstance(quant_config, Float4QuantConfig):
        wanted = (torch.uint8,) + ((float4_e2m1fn_x2,) if float4_e2m1fn_x2 is not None else ())
    else:  # HYBRID quantizes weights (and activations) to E4M3, gradients to E5M2
        wanted = (torch.float8_e5m2,) if quant_config.format == Format.E5M2 else (torch.float8_e4m3fn,)
    if dest_dtype not in wanted:
        raise ValueError(
            f"create_quantized_weight: dest_dtype {dest_dtype} does not match the config's format "
            f"({quant_config.format}); expected {wanted[-1]}"
        )
    recipe = weight_scaling_recipe(quant_config)
    g = quant_config.granularity
    w = QuantizedTensor.quantize(weight, dest_dtype, g, axis=-1, block_size=quant_config.block_size, scaling_recipe=recipe,
                                 amax=amax, quantized=quantized)
    if not need_weight_transpose_cache:
        return w, None
    if g == ScalingGranularity.TENSORWISE or (_two_d(g, recipe) and not _is_fp4(dest_dtype)):
        return w, w._like(w._data, w._scale_inv, w.shape, None)
    w_t = QuantizedTensor.quantize(weight, dest_dtype, g, axis=-2, block_size=quant_config.block_size, scaling_recipe=recipe)
    return w, w_t
