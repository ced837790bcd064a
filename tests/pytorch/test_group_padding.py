"""group_pad_rows / group_gather_rows (the native moves of grouped tokens between their tight layout
and the per-group padded one, _group_padding.pad_groups / gather_groups) against the torch
composition they replace: bitwise equal rows, padded lens and offsets, every output row written
(the allocator is poisoned first), int32 and int64 index tensors, group offsets given or not, empty
and negative groups, rows of 1-, 4- and 16-byte multiples, CUDA-graph capture, and fake shapes."""

import ctypes

import pytest
import torch
from host_check_utils import desc
from turbo_test_utils import capture_graph, poison_allocator

from primus_turbo.pytorch.ops import _group_padding as gp

# (group lens, given offsets?): empty groups, a negative one (read as 0), and gaps between the
# groups when the offsets are given (each group starts after the previous one ends).
CASES = {
    "even": ([64, 64, 64, 64], False),
    "odd": ([3, 0, 130, 1, 0, 77], False),
    "negative": ([5, -3, 40], False),
    "gaps": ([10, 0, 33, 7], True),
    "one": ([1], False),
    "many": ([(i * 37) % 11 for i in range(300)], False),
}


def _offsets(lens, gaps: bool):
    offs, at = [], 0
    for i, n in enumerate(lens):
        at += (i % 3) if gaps else 0
        offs.append(at)
        at += max(n, 0)
    return offs + [at]


def _inputs(case, width, dtype, index_dtype):
    lens, with_offs = CASES[case]
    offs = _offsets(lens, with_offs)
    tokens = offs[-1] + (2 if with_offs else 0)  # rows after the last group belong to none
    x = torch.randn(tokens, width, device="cuda").to(dtype)
    t_lens = torch.tensor(lens, device="cuda", dtype=index_dtype)
    t_offs = torch.tensor(offs, device="cuda", dtype=index_dtype) if with_offs else None
    return x, t_lens, t_offs


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("align", [32, 128])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("width,dtype", [(256, torch.bfloat16), (6, torch.bfloat16), (7, torch.bfloat16),
                                         (129, torch.float32), (64, torch.uint8)])
def test_pad_and_gather_match_torch(case, align, index_dtype, width, dtype):
    x, lens, offs = _inputs(case, width, dtype, index_dtype)
    rows = gp.padded_rows(x.shape[0], lens.shape[0], align)
    poison_allocator(4 * (rows + x.shape[0]) * width * x.element_size())
    xp, plens, poffs = gp.pad_groups_with_layout(x, lens, offs, rows, align)
    ref = gp.pad_groups_torch(x, lens, offs, rows, align)
    ref_lens, ref_offs = gp.padded_layout(lens, align)
    assert xp.shape == ref.shape and xp.dtype == x.dtype
    assert torch.equal(xp.view(torch.uint8), ref.view(torch.uint8))
    assert torch.equal(plens, ref_lens) and torch.equal(poffs, ref_offs)
    # Back: with the offsets (gaps come back as zeros) and with the lens as well.
    src_offs = offs if offs is not None else gp.offsets(lens.to(torch.int64)).to(index_dtype)
    for glens in (None, lens):
        back = gp.gather_groups(xp, src_offs, poffs, x.shape[0], glens)
        want = gp.gather_groups_torch(ref, src_offs, ref_offs, x.shape[0], glens)
        assert torch.equal(back.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.gpu
def test_gather_out_of_range_source_is_zero():
    """A padded offset that points past x reads nothing: those rows are zeros."""
    xp = torch.randn(64, 16, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([0, 8, 16], device="cuda")
    poffs = torch.tensor([0, 60, 128], device="cuda")  # group 1 would read rows 60..67 of 64
    out = gp.gather_groups(xp, offs, poffs, 16)
    assert torch.equal(out[:8], xp[:8])
    assert torch.equal(out[8:12], xp[60:64]) and not out[12:].any()


@pytest.mark.gpu
def test_pad_is_capturable():
    x, lens, offs = _inputs("odd", 256, torch.bfloat16, torch.int64)
    rows = gp.padded_rows(x.shape[0], lens.shape[0], 128)
    graph, (xp, plens, poffs) = capture_graph(lambda: gp.pad_groups_with_layout(x, lens, offs, rows, 128))
    x.copy_(torch.randn_like(x))
    lens.copy_(lens.flip(0))
    graph.replay()
    assert torch.equal(xp, gp.pad_groups_torch(x, lens, offs, rows, 128))
    assert torch.equal(poffs, gp.padded_layout(lens, 128)[1])


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(100, 48, dtype=torch.bfloat16, device="cuda")
        lens = torch.empty(5, dtype=torch.int32, device="cuda")
        xp, plens, poffs = gp.pad_groups_with_layout(x, lens, None, 768, 128)
        assert xp.shape == (768, 48) and plens.shape == (5,) and poffs.shape == (6,)
        assert plens.dtype == poffs.dtype == torch.int64
        back = gp.gather_groups(xp, poffs, poffs, 100)
        assert back.shape == (100, 48) and back.dtype == torch.bfloat16


@pytest.mark.gpu
def test_bad_arguments_name_them():
    x = torch.randn(10, 8, device="cuda")
    with pytest.raises((ValueError, TypeError), match="group_lens"):
        gp.pad_groups(x, torch.ones(3, device="cuda", dtype=torch.float32), None, 512, 128)
    with pytest.raises((ValueError, TypeError), match="group_offs"):
        gp.pad_groups(x, torch.ones(3, device="cuda", dtype=torch.int64), torch.zeros(3, device="cuda",
                      dtype=torch.int64), 512, 128)
    with pytest.raises((ValueError, TypeError), match="group_offs_padded"):
        gp.gather_groups(x, torch.zeros(3, device="cuda", dtype=torch.int64), torch.zeros(2, device="cuda",
                         dtype=torch.int64), 10)


# The core's checks run before any device work: descriptors at a fake address, no GPU.
BF16, I32, I64, F32 = 2, 7, 8, 0


def _core_pad(x, lens, offs, y, lens_out=None, offs_out=None, align=128):
    from primus_turbo._core.lib import lib

    ref = (lambda d: None if d is None else ctypes.byref(d))
    return lib.pt_group_pad_rows(ref(x), ref(lens), ref(offs), align, ref(y), ref(lens_out), ref(offs_out), None)


@pytest.mark.parametrize("bad,words", [
    ("lens_dtype", "group_lens' must be int32 or int64"),
    ("offs_shape", "group_offs' has shape"),
    ("y_width", "argument 'y' has shape"),
    ("y_dtype", "argument 'y' has dtype"),
    ("lens_out_dtype", "lens_out' must be int64"),
    ("align", "align"),
    ("groups", "groups; 1 to 1024"),
])
def test_core_rejects_bad_pad_arguments(bad, words):
    from primus_turbo._core.lib import last_error

    x, y = desc([100, 64]), desc([512, 64])
    lens, offs = desc([4], I64), desc([5], I64)
    lens_out, offs_out = desc([4], I64), desc([5], I64)
    align = 128
    if bad == "lens_dtype":
        lens = desc([4], F32)
    elif bad == "offs_shape":
        offs = desc([4], I64)
    elif bad == "y_width":
        y = desc([512, 32])
    elif bad == "y_dtype":
        y = desc([512, 64], F32)
    elif bad == "lens_out_dtype":
        lens_out = desc([4], I32)
    elif bad == "align":
        align = 0
    elif bad == "groups":
        lens, offs, lens_out, offs_out = desc([1025], I64), None, None, None
    assert _core_pad(x, lens, offs, y, lens_out, offs_out, align) != 0
    assert words in last_error()


def test_core_rejects_bad_gather_arguments():
    from primus_turbo._core.lib import last_error, lib

    x, y = desc([512, 64]), desc([100, 64])
    offs, poffs = desc([5], I64), desc([4], I64)
    assert lib.pt_group_gather_rows(ctypes.byref(x), ctypes.byref(offs), ctypes.byref(poffs), None,
                                    ctypes.byref(y), None) != 0
    assert "group_offs_padded' has shape" in last_error()


@pytest.mark.gpu
def test_grouped_quantization_compiles_without_graph_breaks():
    """The public ops built on the padding ops trace with fullgraph=True and match eager."""
    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.core.low_precision import ScalingGranularity as G

    x, lens, _ = _inputs("odd", 256, torch.bfloat16, torch.int64)
    e4m3 = torch.float8_e4m3fn

    def quant_and_back(x, lens):
        q, s, plens, poffs = turbo.ops.grouped_quantize_fp8(x, e4m3, G.BLOCKWISE, lens, block_size=128, axis=-1)
        offs = torch.cat([lens.new_zeros(1), torch.cumsum(lens.clamp_min(0), 0)])
        back = turbo.ops.grouped_dequantize_fp8(q, torch.bfloat16, G.BLOCKWISE, offs, poffs, block_size=128,
                                                axis=-1, scale_inv=s, total_M=x.shape[0])
        return q.view(torch.uint8), s, plens, poffs, back

    torch._dynamo.reset()
    compiled = torch.compile(quant_and_back, fullgraph=True)
    for got, want in zip(compiled(x, lens), quant_and_back(x, lens)):
        assert torch.equal(got, want)
