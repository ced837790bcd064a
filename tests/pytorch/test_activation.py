"""turbo.ops.swiglu / geglu and their MoE variants with routing probabilities and a row mask on
the GPU: forward and gradients (x, probs) against float64 autograd of the reference, odd sizes,
many and few rows, views, unaligned pointers, CUDA graphs and torch.compile."""

import pytest
import torch
import torch.nn.functional as F

import primus_turbo.pytorch as turbo
from turbo_test_utils import assert_gate, poison_allocator

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
COLS = [1, 7, 127, 128, 1408, 4097, 14336]
ROWS = [0, 1, 3, 1000, 4096]
ACTS = {"swiglu": F.silu, "geglu": lambda g: F.gelu(g, approximate="none")}


def reference(name, x, dy, probs=None, row_mask=None):
    """Float64 autograd of act(gate) * up * probs, masked rows zero: (out, dx, dprobs)."""
    x64 = x.detach().double().requires_grad_()
    gate, up = x64.chunk(2, dim=-1)
    out = ACTS[name](gate) * up
    p64 = None
    if probs is not None:
        p64 = probs.detach().double().requires_grad_()
        out = out * p64.reshape(out.shape[:-1]).unsqueeze(-1)
    if row_mask is not None:
        out = out * (row_mask.reshape(out.shape[:-1]) != 0).double().unsqueeze(-1)
    out.backward(dy.double())
    return out.detach(), x64.grad, None if p64 is None else p64.grad


def run_turbo(name, x, dy, probs=None, row_mask=None):
    x = x.detach().requires_grad_()
    if probs is None:
        out = getattr(turbo.ops, name)(x)
        out.backward(dy)
        return out.detach(), x.grad, None
    probs = probs.detach().requires_grad_()
    out = getattr(turbo.ops, name + "_with_probs")(x, probs, row_mask)
    assert out.shape == (x.numel() // x.shape[-1], x.shape[-1] // 2)  # [rows, H], as the original
    out.backward(dy.reshape(out.shape))
    return out.detach().view(dy.shape), x.grad, probs.grad


def check(got, ref, dtype):
    assert_gate(got[0], ref[0], dtype, "out")
    assert_gate(got[1], ref[1], dtype, "dx")
    if ref[2] is not None:
        assert got[2].dtype == torch.float32 and got[2].shape == ref[2].shape
        # dprobs is a float32 sum over the row of 16-bit products: the gate of its inputs' dtype.
        assert_gate(got[2], ref[2], dtype, "dprobs")


def inputs(rows, cols, dtype, seed):
    torch.manual_seed(seed)
    x = torch.randn(rows, 2 * cols, device="cuda", dtype=dtype)
    dy = torch.randn(rows, cols, device="cuda", dtype=dtype)
    probs = torch.rand(rows, device="cuda", dtype=torch.float32)
    return x, dy, probs


@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("cols", COLS)
def test_plain_matches_float64(name, cols, rows, dtype):
    x, dy, _ = inputs(rows, cols, dtype, seed=cols + rows)
    poison_allocator(rows * 2 * cols * dtype.itemsize)
    check(run_turbo(name, x, dy), reference(name, x, dy), dtype)


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,cols", [(0, 128), (1, 1), (5, 127), (1000, 1408), (4096, 2048), (300, 4097)])
def test_with_probs_matches_float64(rows, cols, dtype, name, masked):
    x, dy, probs = inputs(rows, cols, dtype, seed=rows * 3 + cols)
    row_mask = (torch.rand(rows, device="cuda") > 0.25).to(torch.int64) if masked else None
    poison_allocator(rows * 2 * cols * dtype.itemsize)
    got = run_turbo(name, x, dy, probs, row_mask)
    ref = reference(name, x, dy, probs, row_mask)
    check(got, ref, dtype)
    if masked and rows:
        dead = row_mask == 0
        assert torch.all(got[0][dead] == 0) and torch.all(got[1][dead] == 0) and torch.all(got[2][dead] == 0)


def test_leading_dimensions_views_and_unaligned():
    torch.manual_seed(3)
    base = torch.randn(2, 2 * 1408, 5, device="cuda", dtype=torch.bfloat16)
    x = base.transpose(1, 2)  # [2, 5, 2816], last dimension strided
    dy = torch.randn(2, 5, 1408, device="cuda", dtype=torch.bfloat16)
    probs = torch.rand(2, 5, device="cuda")
    check(run_turbo("swiglu", x, dy, probs), reference("swiglu", x, dy, probs), torch.bfloat16)
    storage = torch.randn(64 * 2048 + 1, device="cuda", dtype=torch.bfloat16)
    xu = storage[1:].view(64, 2048)  # 2 bytes off a 16-byte boundary: the scalar path
    dyu = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    check(run_turbo("geglu", xu, dyu), reference("geglu", xu, dyu), torch.bfloat16)


def test_bool_row_mask_and_deterministic_dprobs():
    x, dy, probs = inputs(2048, 1024, torch.bfloat16, seed=4)
    mask = torch.rand(2048, device="cuda") > 0.5
    first = run_turbo("swiglu", x, dy, probs, mask)
    second = run_turbo("swiglu", x, dy, probs, mask.to(torch.int64))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_cuda_graph_capture_and_replay():
    x, dy, probs = inputs(1024, 2048, torch.bfloat16, seed=5)
    mask = torch.ones(1024, dtype=torch.int64, device="cuda")
    fwd = torch.ops.primus_turbo.gated_act_fwd.default
    bwd = torch.ops.primus_turbo.gated_act_bwd.default
    fwd(x, probs, mask, 0)
    bwd(dy, x, probs, mask, 0, True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fwd(x, probs, mask, 0)
        dx, dprobs = bwd(dy, x, probs, mask, 0, True)
    x.copy_(torch.randn_like(x))
    mask[::3] = 0
    graph.replay()
    torch.cuda.synchronize()
    check((out, dx, dprobs), reference("swiglu", x, dy, probs, mask), torch.bfloat16)


@pytest.mark.parametrize("name", list(ACTS))
def test_torch_compile_fullgraph(name):
    x, dy, probs = inputs(512, 1408, torch.bfloat16, seed=6)

    def fn(a, p):
        return getattr(turbo.ops, name + "_with_probs")(a * 2.0, p * 0.5, None) + getattr(turbo.ops, name)(a)

    compiled = torch.compile(fn, fullgraph=True)
    results = []
    for f in (compiled, fn):
        a, p = x.clone().requires_grad_(), probs.clone().requires_grad_()
        out = f(a, p)
        out.backward(dy)
        results.append((out.detach(), a.grad, p.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
