"""turbo.ops.rope: rotary position embedding of q and k in one kernel, forward and backward
(kernels/rope/rope.cuh)."""

import math

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.ops._checks import check_cuda_tensors

__all__ = ["rope", "rope_cos_sin"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Must match pt_rope_layout in csrc/include/primus_turbo/rope.h.
_LAYOUTS = {"bshd": 0, "sbhd": 1, "thd": 2}
MAX_HEAD_DIM = 4096


def _check_args(q, k, cos, sin, positions, cu_seqlens, theta, rotary_dim, layout) -> int:
    """Validates arguments (no device work); returns the rotary dimension."""
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rope: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"rope: argument '{name}' has dtype {t.dtype}; expected float32, float16 or bfloat16")
    if k.dtype != q.dtype:
        raise TypeError(f"rope: argument 'k' has dtype {k.dtype}; expected the dtype of 'q' ({q.dtype})")
    if layout not in _LAYOUTS:
        raise ValueError(f"rope: argument 'layout' is {layout!r}; expected one of {sorted(_LAYOUTS)}")
    ndim = 3 if layout == "thd" else 4
    dims = "[tokens, heads, head_dim]" if layout == "thd" else f"[{', '.join(n for n in layout[:2])}, heads, head_dim]"
    for name, t in (("q", q), ("k", k)):
        if t.dim() != ndim:
            raise ValueError(f"rope: argument '{name}' has shape {tuple(t.shape)}; layout {layout!r} expects {dims}")
    if k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"rope: argument 'k' has shape {tuple(k.shape)}; expected the shape of 'q' {tuple(q.shape)} except for the number of heads"
        )
    head_dim = q.shape[-1]
    if not 2 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"rope: head_dim (last dimension of 'q') is {head_dim}; expected 2 to {MAX_HEAD_DIM}")
    if (cos is None) != (sin is None):
        raise ValueError("rope: arguments 'cos' and 'sin' must be given together")
    if cos is not None:
        for name, t in (("cos", cos), ("sin", sin)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"rope: argument '{name}' must be a floating-point torch.Tensor")
            if t.dim() != 2:
                raise ValueError(
                    f"rope: argument '{name}' has shape {tuple(t.shape)}; expected [max_position, rotary_dim // 2]"
                )
        if sin.shape != cos.shape:
            raise ValueError(
                f"rope: argument 'sin' has shape {tuple(sin.shape)}; expected the shape of 'cos' {tuple(cos.shape)}"
            )
        if rotary_dim is None:
            rotary_dim = 2 * cos.shape[1]
        elif cos.shape[1] * 2 != rotary_dim:
            raise ValueError(
                f"rope: argument 'cos' has {cos.shape[1]} columns; expected rotary_dim // 2 = {rotary_dim // 2}"
            )
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        # checked with a table too (unused then), so a wrong value never passes silently
        raise ValueError(f"rope: argument 'theta' must be a positive finite number, got {theta!r}")
    if rotary_dim is None:
        rotary_dim = head_dim
    if (
        isinstance(rotary_dim, bool)
        or not isinstance(rotary_dim, int)
        or not (2 <= rotary_dim <= head_dim)
        or rotary_dim % 2
    ):
        raise ValueError(
            f"rope: argument 'rotary_dim' is {rotary_dim!r}; expected an even int from 2 to head_dim ({head_dim})"
        )
    if positions is not None:
        if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int32, torch.int64):
            raise TypeError("rope: argument 'positions' must be an int32 or int64 torch.Tensor")
        seq = q.shape[1] if layout == "bshd" else q.shape[0]
        shared = layout != "thd" and tuple(positions.shape) == (seq,)
        if not shared and positions.shape != q.shape[:-2]:
            want = f"[{q.shape[0]}]" if layout == "thd" else f"[{seq}] or {list(q.shape[:2])}"
            raise ValueError(f"rope: argument 'positions' has shape {tuple(positions.shape)}; expected {want}")
    if cu_seqlens is not None:
        if layout != "thd":
            raise ValueError("rope: argument 'cu_seqlens' needs layout='thd' (packed [tokens, heads, head_dim])")
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError("rope: argument 'cu_seqlens' must be an int32 or int64 torch.Tensor")
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
            raise ValueError(
                f"rope: argument 'cu_seqlens' has shape {tuple(cu_seqlens.shape)}; expected [num_seqs + 1], num_seqs >= 1"
            )
    optional = {
        n: t
        for n, t in (("cos", cos), ("sin", sin), ("positions", positions), ("cu_seqlens", cu_seqlens))
        if t is not None
    }
    check_cuda_tensors("rope", q=q, k=k, **optional)
    return rotary_dim


# ---- native op (csrc/bindings/torch/rope_ops.cpp): one for both directions (the backward is the
# inverse rotation); it reads any strides with a unit last one and converts tables itself --------


def _rope_fake(q, k, cos, sin, positions, cu_seqlens, rotary_dim, theta, interleaved, layout, backward):
    # The checks of the eager path (fake CUDA tensors take its native branch, whose C++ checks do
    # not run under torch.compile's tracing).
    names = {code: name for name, code in _LAYOUTS.items()}
    if layout not in names:
        raise ValueError(f"rope: layout code {layout} is not one of {sorted(names)}")
    _check_args(q, k, cos, sin, positions, cu_seqlens, theta, rotary_dim, names[layout])
    return q.new_empty(q.shape), k.new_empty(k.shape)


library.register_fake("rope", _rope_fake)
_rope_op = native.ops.rope.default
# With the C++ autograd (bindings/torch_autograd/rope_autograd.cpp): both directions without Python.
_rope_train = native.training_op(
    "rope_train", lambda q, k, cos, sin, pos, cu, rd, theta, il, layout: _rope_fake(q, k, cos, sin, pos, cu, rd, theta,
                                                                                   il, layout, False)
)


class RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q, k, cos, sin, positions, cu_seqlens, rotary_dim: int, theta: float, interleaved: bool, layout: int
    ):
        q_out, k_out = _rope_op(q, k, cos, sin, positions, cu_seqlens, rotary_dim, theta, interleaved, layout, False)
        ctx.save_for_backward(cos, sin, positions, cu_seqlens)
        ctx.args = (rotary_dim, theta, interleaved, layout)
        return q_out, k_out

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        cos, sin, positions, cu_seqlens = ctx.saved_tensors
        dq, dk = _rope_op(dq_out, dk_out, cos, sin, positions, cu_seqlens, *ctx.args, True)
        return dq, dk, None, None, None, None, None, None, None, None


@native.raises_python_errors
def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    *,
    positions: torch.Tensor | None = None,
    theta: float = 10000.0,
    rotary_dim: int | None = None,
    interleaved: bool = False,
    layout: str = "bshd",
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of ``q`` and ``k`` in one kernel; returns new ``(q_out, k_out)``.

    Args:
        q, k: ``[batch, seq, heads, head_dim]`` (``layout="bshd"``), ``[seq, batch, heads, head_dim]``
            (``"sbhd"``) or packed ``[tokens, heads, head_dim]`` (``"thd"``); float32, float16 or
            bfloat16; ``k`` may have fewer heads (GQA). Views (e.g. slices of a fused qkv tensor)
            are read in place when the last dimension has unit stride.
        cos, sin: optional float tables ``[max_position, rotary_dim // 2]`` (converted to float32);
            without them the angles are computed from ``theta``. Positions outside the table give NaN.
        positions: optional int32/int64 positions, ``[seq]`` shared by the batch or one per token
            (``q.shape[:2]``, ``[tokens]`` for thd). Default: the index along the sequence, restarting
            at each ``cu_seqlens`` boundary.
        theta: base of the frequencies ``theta ** (-2j / rotary_dim)``.
        rotary_dim: features rotated (even, default ``head_dim`` or ``2 * cos.shape[1]``); the
            remaining ``head_dim - rotary_dim`` features pass through unchanged.
        interleaved: pairs ``(2j, 2j+1)`` (GPT-J) instead of ``(j, j + rotary_dim/2)`` (GPT-NeoX, Llama).
        cu_seqlens: int32/int64 ``[num_seqs + 1]`` offsets of packed sequences (``layout="thd"``).

    Math in float32, outputs contiguous in the input dtype. Differentiable in ``q`` and ``k`` (the
    gradient is the inverse rotation); no host synchronization, CUDA-graph capturable.
    """
    lay = _LAYOUTS.get(layout) if isinstance(layout, str) else None
    if (
        lay is None
        or not isinstance(q, torch.Tensor)
        or not isinstance(k, torch.Tensor)
        or q.device.type != "cuda"  # meta / fake tensors: the fake implementation's checks
        or type(theta) not in (float, int)
        or (rotary_dim is not None and type(rotary_dim) is not int)
        or (cos is not None and not (isinstance(cos, torch.Tensor) and cos.dim() == 2))
        or (sin is not None and not isinstance(sin, torch.Tensor))
    ):
        rotary_dim = _check_args(q, k, cos, sin, positions, cu_seqlens, theta, rotary_dim, layout)
    elif rotary_dim is None:
        rotary_dim = 2 * cos.shape[1] if cos is not None else q.shape[-1]
    if not isinstance(interleaved, bool):
        raise TypeError(f"rope: argument 'interleaved' must be a bool, got {interleaved!r}")
    args = (q, k, cos, sin, positions, cu_seqlens, rotary_dim, float(theta), interleaved, _LAYOUTS[layout])
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        if _rope_train is not None and native.eager_cpp_autograd():
            return _rope_train(*args)
        return RopeFunction.apply(*args)
    return _rope_op(*args, False)


def rope_cos_sin(
    max_position: int, rotary_dim: int, theta: float = 10000.0, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(cos, sin)`` tables ``[max_position, rotary_dim // 2]`` for :func:`rope` (computed in float64)."""
    for name, v, lo in (("max_position", max_position, 0), ("rotary_dim", rotary_dim, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"rope_cos_sin: argument '{name}' must be an int >= {lo}, got {v!r}")
    if rotary_dim % 2:
        raise ValueError(f"rope_cos_sin: argument 'rotary_dim' must be even, got {rotary_dim}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        raise ValueError(f"rope_cos_sin: argument 'theta' must be a positive finite number, got {theta!r}")
    try:
        device = None if device is None else torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"rope_cos_sin: argument 'device' is not a device: {device!r} ({e})") from None
    inv_freq = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)
    angles = torch.arange(max_position, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()
