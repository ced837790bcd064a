"""torch.Tensor -> the core's pt_tensor descriptor, plus the stream and workspace of a call."""

import contextlib
import ctypes

import torch

from primus_turbo._core import PtTensor, lib
from primus_turbo._core.lib import PT_MAX_DIMS

# Must match pt_dtype in csrc/include/primus_turbo/primus_turbo.h.
_DTYPE_CODES = {
    torch.float32: 0,
    torch.float16: 1,
    torch.bfloat16: 2,
    torch.float8_e4m3fn: 3,
    torch.float8_e5m2: 4,
    torch.int32: 7,
    torch.int64: 8,
    torch.uint8: 9,
}
if hasattr(torch, "float8_e8m0fnu"):
    _DTYPE_CODES[torch.float8_e8m0fnu] = 5
if hasattr(torch, "float4_e2m1fn_x2"):
    _DTYPE_CODES[torch.float4_e2m1fn_x2] = 6

_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}

_Dims = ctypes.c_int64 * PT_MAX_DIMS


def to_pt(t: torch.Tensor) -> PtTensor:
    shape = t.shape
    return PtTensor(
        t.data_ptr() if t.numel() > 0 else None, _DTYPE_CODES[t.dtype], len(shape), _Dims(*shape), _Dims(*t.stride())
    )


def empty_like_pt(p: PtTensor, device: torch.device) -> torch.Tensor:
    """An uninitialized tensor with the shape, strides and dtype a descriptor states."""
    shape, strides = tuple(p.shape[: p.ndim]), tuple(p.strides[: p.ndim])
    return torch.empty_strided(shape, strides, dtype=_CODE_DTYPES[p.dtype], device=device)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream_handle(device: torch.device) -> int:
    """cudaStream_t of torch's current stream on device (the raw query skips a Stream object)."""
    if _raw_stream is not None and device.index is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def device_guard(device: torch.device):
    """Makes device current for the block; a no-op (no torch guard object) when it already is."""
    if device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def workspace(device: torch.device) -> torch.Tensor:
    """Scratch memory for one call, from torch's caching allocator (so it is graph-safe)."""
    return torch.empty(lib.pt_gemm_workspace_bytes(), dtype=torch.uint8, device=device)


