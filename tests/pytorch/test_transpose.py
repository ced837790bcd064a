"""transpose_last2 (kernels/layout/transpose.cuh): bit-exact against torch's transpose copy for
every element size, both kernel paths (4-byte words and single elements), partial tiles, empty
tensors; argument errors; graph capture and compile."""

import pytest
import torch

from primus_turbo._core import lib
from primus_turbo.pytorch.ops._transpose import transpose_last2

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _random(shape, dtype):
    bits = torch.randint(-(2**31), 2**31 - 1, (int(torch.Size(shape).numel()),), dtype=torch.int32, device="cuda")
    raw = bits.view(torch.uint8)[: torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()]
    return raw.view(dtype).view(shape)


def _bytes(t):
    """The raw bytes of t in row-major order (an empty tensor's strides are arbitrary)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


@cuda
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8, torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "shape",
    [(3, 128, 256), (2, 64, 64), (1, 1, 1), (4, 100, 36), (2, 130, 68), (5, 7, 13), (257, 33), (64, 4096), (0, 8, 8)],
)
def test_matches_torch_bit_for_bit(dtype, shape):
    x = _random(shape, dtype)
    y = transpose_last2(x)
    ref = x.transpose(-2, -1).contiguous()
    assert y.shape == ref.shape and y.dtype == dtype and y.is_contiguous()
    assert torch.equal(_bytes(y), _bytes(ref))


@cuda
def test_unaligned_view_uses_the_element_path():
    base = _random((1, 4 * 64 * 64 + 1), torch.uint8).view(-1)
    x = base[1:].view(4, 64, 64)  # 1-byte offset: no 4-byte words
    assert torch.equal(transpose_last2(x), x.transpose(-2, -1).contiguous())


@cuda
def test_cuda_graph_and_compile():
    x = _random((4, 96, 160), torch.float8_e5m2)
    y = transpose_last2(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = transpose_last2(x)
    x.copy_(_random((4, 96, 160), torch.float8_e5m2))
    graph.replay()
    assert torch.equal(_bytes(out), _bytes(x.transpose(-2, -1)))
    compiled = torch.compile(transpose_last2, fullgraph=True)
    assert torch.equal(_bytes(compiled(x)), _bytes(transpose_last2(x)))
    assert not torch.equal(_bytes(y), _bytes(out))


def test_rejects_other_ranks():
    with pytest.raises(ValueError, match="2-D or 3-D"):
        transpose_last2(torch.zeros(2, 2, 2, 2))


def test_cpu_tensors_fall_back_to_torch():
    x = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    assert torch.equal(transpose_last2(x), x.transpose(1, 2))


def test_fake_shape_under_meta():
    from primus_turbo.pytorch.ops._transpose import _transpose_op

    y = _transpose_op(torch.empty(3, 5, 7, device="meta", dtype=torch.bfloat16))
    assert y.shape == (3, 7, 5) and y.dtype == torch.bfloat16


def test_c_api_rejects_bad_element_size():
    status = lib.pt_transpose_prepare(3)
    assert status != 0
