"""primus_turbo.pytorch.core.utils and low_precision helpers that code written for the original imports."""

import pytest
import torch

from primus_turbo.pytorch.core import utils
from primus_turbo.pytorch.core.low_precision import is_fp8_dtype


def test_amd_architecture_checks_are_false_without_touching_the_device():
    assert utils.is_gfx942() is False
    assert utils.is_gfx950() is False
    assert utils.is_gfx1250() is False


@pytest.mark.parametrize(
    "dtype,expected",
    [
        (torch.float8_e4m3fn, True),
        (torch.float8_e5m2, True),
        (torch.bfloat16, False),
        (torch.float32, False),
        (torch.uint8, False),
        (getattr(torch, "float8_e8m0fnu", torch.int8), False),
    ],
)
def test_is_fp8_dtype(dtype, expected):
    assert is_fp8_dtype(dtype) is expected


@pytest.mark.gpu
def test_device_queries_on_a_gpu():
    major, minor = utils.get_device_compute_capability()
    assert (major, minor) == torch.cuda.get_device_capability()
    assert utils.get_num_cus() == torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    assert utils.get_num_cus() > 0
