"""Batched transpose of the last two dimensions on the GPU (``pt_transpose_last2``,
kernels/layout/transpose.cuh), for the K-major operands a training step's other GEMMs need: a
[G, N, K] FP8 weight as [G, K, N] for the grouped dgrad, a bf16 weight before its rowwise
quantization. torch's copy of a transposed view moves 1- and 2-byte elements one at a time
through uncoalesced stores (~0.3 TB/s on an H100); the kernel moves 64 x 64 tiles through shared
memory in 4-byte words. Registered as ``primus_turbo::transpose_last2`` with a fake
implementation, so it captures in CUDA graphs and compiles without graph breaks."""

import torch

from primus_turbo._core import check, lib
from primus_turbo.pytorch.core import library
from primus_turbo.pytorch.core.tensor_bridge import current_stream_handle, device_guard, to_pt

_ELEMENT_BYTES = (1, 2, 4)


def _transposed_shape(x: torch.Tensor):
    return (*x.shape[:-2], x.shape[-1], x.shape[-2])


def _transpose_cuda(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(_transposed_shape(x), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    with device_guard(x.device):
        status = lib.pt_transpose_last2(to_pt(x), to_pt(y), current_stream_handle(x.device))
    if status:
        check(status, context="transpose_last2")
    return y


def _transpose_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(_transposed_shape(x))


_transpose_op = library.define_op("transpose_last2(Tensor x) -> Tensor", _transpose_cuda, _transpose_fake)


def transpose_last2(x: torch.Tensor) -> torch.Tensor:
    """``x.transpose(-2, -1).contiguous()`` for a 2-D or 3-D tensor; on CUDA one tiled kernel
    (elements of 1, 2 or 4 bytes), elsewhere torch's copy."""
    if x.dim() not in (2, 3):
        raise ValueError(f"transpose_last2: x must be 2-D or 3-D, got shape {tuple(x.shape)}")
    if x.device.type != "cuda" or x.element_size() not in _ELEMENT_BYTES:
        return x.transpose(-2, -1).contiguous()
    return _transpose_op(x.contiguous())
