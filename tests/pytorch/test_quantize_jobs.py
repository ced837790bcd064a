"""pt_quantize_jobs (one or two FP8 quantizations in one call; small ones in one cooperative launch
with their amax reductions) against pt_quantize on each job: every output, scales and their
padding included, bitwise equal; outputs pre-filled with different garbage on each side, so every
element must have been written. The core's argument checks run without a GPU."""

import ctypes

import pytest
import torch
from host_check_utils import FAKE_PTR, desc

from primus_turbo._core import check
from primus_turbo._core.lib import PtQuantizeJob, lib
from primus_turbo.pytorch.core.tensor_bridge import current_stream_handle, to_pt
from primus_turbo.pytorch.ops import quantization as QZ

TENSOR, ROW, BLOCK = 0, 1, 2
FLAG_2D, FLAG_MN_MAJOR, FLAG_PAD4 = 1, 8, 16
# (granularity, flags, row, col) of one job; the weight-like 2-D blocks and the GEMM's blocks-major
# 1x128 scales included.
JOBS = {
    "tensor-rc": (TENSOR, 0, True, True),
    "tensor-r": (TENSOR, 0, True, False),
    "tensor-c": (TENSOR, 0, False, True),
    "row-rc": (ROW, 0, True, True),
    "row-r": (ROW, 0, True, False),
    "row-c": (ROW, 0, False, True),
    "block-mn-rc": (BLOCK, FLAG_MN_MAJOR, True, True),
    "block2d-rc": (BLOCK, FLAG_2D, True, True),
    "block2d-pad-rc": (BLOCK, FLAG_2D | FLAG_PAD4, True, True),
}
# Pairs of shapes: aligned, odd (partial tiles, rows not a multiple of 4), and one above the
# batched launch's size limit (the separate path behind the same call).
SHAPES = {
    "aligned": ((256, 256), (512, 256)),
    "odd": ((100, 272), (37, 1000)),
    "large": ((4096, 4097), (16, 256)),
}


def _cdiv(a, b):
    return -(-a // b)


def _outputs(x, q_dtype, job, fill):
    g, flags, row, col = job
    outs = list(QZ._outputs(x, q_dtype, g, 128 if g == BLOCK else 0, row, col, True, flags & ~FLAG_PAD4))
    if flags & FLAG_PAD4:  # 2-D scales with the last dim rounded up to 4
        m, k = x.shape
        pad4 = lambda n: _cdiv(n, 4) * 4  # noqa: E731
        outs[1] = x.new_empty((_cdiv(m, 128), pad4(_cdiv(k, 128))), dtype=torch.float32)
        outs[3] = x.new_empty((_cdiv(k, 128), pad4(_cdiv(m, 128))), dtype=torch.float32)
    for t in outs:
        if t.numel():
            (t.view(torch.uint8).fill_(fill) if t.dtype != torch.float32 else t.fill_(float(fill)))
    return outs


def _descs(x, outs, job):
    g, flags, row, col = job
    q_row, s_row, q_col, s_col = outs
    d = [to_pt(x), to_pt(q_row) if row else None, to_pt(s_row) if row else None, to_pt(q_col) if col else None,
         to_pt(s_col) if col else None]
    return d, g, 128 if g == BLOCK else 0, flags


def _ref(x, q_dtype, job):
    outs = _outputs(x, q_dtype, job, 7)
    (xd, qr, sr, qc, sc), g, block, flags = _descs(x, outs, job)
    ws_bytes = lib.pt_quantize_workspace_bytes(*x.shape, g)
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=x.device)
    p = lambda d: ctypes.byref(d) if d is not None else None  # noqa: E731
    check(lib.pt_quantize(p(xd), p(qr), p(sr), p(qc), p(sc), g, block, 1, flags, 0, ws.data_ptr(), ws.numel(),
                          current_stream_handle(x.device)))
    return outs


def _jobs(xs, q_dtype, jobs):
    outs, keep, arr = [], [], (PtQuantizeJob * len(xs))()
    for i, (x, job) in enumerate(zip(xs, jobs)):
        o = _outputs(x, q_dtype, job, 0x5A)
        d, g, block, flags = _descs(x, o, job)
        keep.append(d)
        ptr = lambda t: ctypes.pointer(t) if t is not None else None  # noqa: E731
        arr[i] = PtQuantizeJob(*(ptr(t) for t in d), g, block, 1, flags)
        outs.append(o)
    ws_bytes = lib.pt_quantize_jobs_workspace_bytes(arr, len(xs))
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=xs[0].device)
    check(lib.pt_quantize_jobs(arr, len(xs), ws.data_ptr(), ws_bytes, current_stream_handle(xs[0].device)))
    return outs


@pytest.mark.gpu
@pytest.mark.parametrize("shapes", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("pair", [("tensor-rc", "tensor-rc"), ("row-rc", "row-rc"), ("block-mn-rc", "block2d-rc"),
                                  ("tensor-r", "tensor-c"), ("row-r", "row-c"), ("row-rc", None),
                                  ("tensor-rc", None), ("block-mn-rc", "row-c"), ("block-mn-rc", "block2d-pad-rc")],
                         ids=lambda p: f"{p[0]}+{p[1]}")
@pytest.mark.parametrize("q_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_jobs_match_separate_calls(shapes, pair, q_dtype, x_dtype):
    torch.manual_seed(0)
    names = [n for n in pair if n is not None]
    xs = [torch.randn(*shape, device="cuda", dtype=x_dtype) * (1 + i) for i, shape in enumerate(SHAPES[shapes])]
    xs = xs[: len(names)]
    jobs = [JOBS[n] for n in names]
    got = _jobs(xs, q_dtype, jobs)
    for x, job, outs in zip(xs, jobs, got):
        ref = _ref(x, q_dtype, job)
        for name, a, b in zip(("q_row", "s_row", "q_col", "s_col"), outs, ref):
            assert a.shape == b.shape, name
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), f"{name} differs"
        if job[1] & FLAG_PAD4:  # the padded scales hold the unpadded ones, then zeros
            plain = _ref(x, q_dtype, (job[0], FLAG_2D, job[2], job[3]))
            for padded, unpadded in ((outs[1], plain[1]), (outs[3], plain[3])):
                n = unpadded.shape[1]
                assert torch.equal(padded[:, :n], unpadded) and not padded[:, n:].any()


# ---- the core's checks (no device work happens before them) ---------------------------------------


def _job(x, q_row, s_row):
    return PtQuantizeJob(ctypes.pointer(x), ctypes.pointer(q_row), ctypes.pointer(s_row), None, None, TENSOR, 0, 1, 0)


def test_jobs_count_and_workspace_are_checked():
    arr = (PtQuantizeJob * 3)(*(_job(desc([4, 8]), desc([4, 8], 3), desc([], 0)) for _ in range(3)))
    assert lib.pt_quantize_jobs(arr, 3, None, 0, None) != 0
    assert "'count' is 3" in lib.pt_last_error().decode()
    assert lib.pt_quantize_jobs(None, 1, None, 0, None) != 0
    assert "'jobs' is null" in lib.pt_last_error().decode()
    need = lib.pt_quantize_jobs_workspace_bytes(arr, 2)
    assert need == 512  # two tensorwise jobs, a 256-byte share each
    assert lib.pt_quantize_jobs(arr, 2, FAKE_PTR, need - 1, None) != 0
    assert "these jobs need" in lib.pt_last_error().decode()


def test_padded_scales_need_2d_blocks():
    x, q = desc([4, 256]), desc([4, 256], 3)
    assert lib.pt_quantize(x, q, desc([4, 4], 0), None, None, BLOCK, 128, 1, FLAG_PAD4, 0, None, 0, None) != 0
    assert "PT_QUANT_SCALES_PAD4" in lib.pt_last_error().decode()
    # 2-D blocks: [ceil(4/128), round_up(2, 4)] = [1, 4] is the padded shape; [1, 2] is refused.
    assert lib.pt_quantize(x, q, desc([1, 2], 0), None, None, BLOCK, 128, 1, FLAG_2D | FLAG_PAD4, 0, None, 0,
                           None) != 0
    assert "expected [1, 4]" in lib.pt_last_error().decode()


def test_jobs_check_each_job():
    bad = (PtQuantizeJob * 1)(_job(desc([4, 8], 7), desc([4, 8], 3), desc([], 0)))  # int32 input
    assert lib.pt_quantize_jobs(bad, 1, FAKE_PTR, 256, None) != 0
    assert "argument 'x' has dtype int32" in lib.pt_last_error().decode()
