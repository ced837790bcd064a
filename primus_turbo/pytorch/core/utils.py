"""Device queries that code written for the original library imports from
``primus_turbo.pytorch.core.utils``, answered for NVIDIA GPUs."""

import functools
from typing import Tuple

import torch

__all__ = ["get_device_compute_capability", "get_num_cus", "is_gfx942", "is_gfx950", "is_gfx1250"]


@functools.lru_cache(maxsize=None)
def _properties(index: int):
    return torch.cuda.get_device_properties(index)


def get_device_compute_capability() -> Tuple[int, int]:
    """(major, minor) compute capability of the current CUDA device: (9, 0) on H100/H200."""
    props = _properties(torch.cuda.current_device())
    return props.major, props.minor


def get_num_cus() -> int:
    """Compute units of the current device: its streaming multiprocessors (132 on H100 SXM). What
    ``num_cu`` arguments count (the SMs a persistent kernel may use)."""
    return _properties(torch.cuda.current_device()).multi_processor_count


# The original's AMD architecture checks: no NVIDIA GPU is one of these. They answer without touching
# the device, so code that branches on them runs on machines without a GPU too.
def is_gfx942() -> bool:
    """MI300X / MI325X: False on NVIDIA GPUs."""
    return False


def is_gfx950() -> bool:
    """MI355X: False on NVIDIA GPUs."""
    return False


def is_gfx1250() -> bool:
    """MI400 series: False on NVIDIA GPUs."""
    return False
