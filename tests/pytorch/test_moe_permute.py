"""turbo.ops.token_permute / token_unpermute on the GPU: rows, probabilities, maps and gradients
bitwise against an indexing reference (they move data; merges are checked against float64 under
the gates), dropped and padded rows, odd sizes, empty inputs, CUDA graphs and torch.compile."""

import pytest
import torch
from turbo_test_utils import assert_gate, poison_allocator

import primus_turbo.pytorch as turbo

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def make_routing(t, e, topk, seed=0, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    idx = torch.rand(t, e, generator=g).argsort(dim=1)[:, :topk]
    mask = torch.zeros(t, e, dtype=torch.bool).scatter_(1, idx, True)
    probs = torch.rand(t, e, generator=g) * mask
    return mask.to(device), probs.to(device)


def reference_rows(mask, num_out):
    """(token, expert) of each output row: experts in order, tokens in order within an expert."""
    e_idx, t_idx = mask.t().nonzero(as_tuple=True)
    return t_idx[:num_out], e_idx[:num_out]


def reference_map(mask, num_out):
    t_idx, e_idx = reference_rows(mask, num_out)
    rmap = torch.full(mask.shape, -1, dtype=torch.int32, device=mask.device)
    rmap[t_idx, e_idx] = torch.arange(t_idx.numel(), dtype=torch.int32, device=mask.device)
    return rmap


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "t,e,topk,h,extra",
    [
        (1000, 8, 2, 4096, 0),
        (333, 64, 6, 1000, 0),
        (257, 256, 8, 7168, 0),
        (64, 16, 4, 96, 17),
        (50, 4, 2, 33, -30),
        (1, 1, 1, 8, 0),
    ],
)
def test_permute_unpermute_exact(t, e, topk, h, extra, dtype):
    mask, probs = make_routing(t, e, topk, seed=t + e)
    torch.manual_seed(t)
    x = torch.randn(t, h, device="cuda", dtype=dtype)
    num_out = t * topk + extra  # > routed: zero padding rows; < routed: the excess is dropped
    poison_allocator(num_out * h * dtype.itemsize)
    out, pprobs, rmap = turbo.ops.token_permute(x, probs, mask, num_out_tokens=num_out)
    t_idx, e_idx = reference_rows(mask, num_out)
    n = t_idx.numel()
    assert out.shape == (num_out, h) and torch.equal(out[:n], x[t_idx])
    assert (out[n:] == 0).all() and (pprobs[n:] == 0).all()
    assert torch.equal(pprobs[:n], probs[t_idx, e_idx])
    assert torch.equal(rmap, reference_map(mask, num_out))
    # Unpermute: a merge in expert order; float64 reference under the gates, and exact without probs
    # when every token has one copy per row (a sum of one term).
    y = torch.randn(num_out, h, device="cuda", dtype=dtype)
    merged = turbo.ops.token_unpermute(y, rmap, probs)
    ref = torch.zeros(t, h, dtype=torch.float64, device="cuda")
    ref.index_add_(0, t_idx, y[:n].double() * probs[t_idx, e_idx, None].double())
    assert_gate(merged, ref, dtype, "merged")
    if topk == 1:
        plain = turbo.ops.token_unpermute(y, rmap)
        assert torch.equal(plain[t_idx], y[:n])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gradients(dtype):
    t, e, topk, h = 300, 32, 4, 512
    mask, probs = make_routing(t, e, topk, seed=3)
    x = torch.randn(t, h, device="cuda", dtype=dtype, requires_grad=True)
    p = probs.clone().requires_grad_()
    out, pprobs, rmap = turbo.ops.token_permute(x, p, mask, num_out_tokens=t * topk)
    g_out = torch.randn_like(out)
    g_pp = torch.randn_like(pprobs)
    torch.autograd.backward((out, pprobs), (g_out, g_pp))
    t_idx, e_idx = reference_rows(mask, t * topk)
    ref_dx = torch.zeros(t, h, dtype=torch.float64, device="cuda").index_add_(0, t_idx, g_out.double())
    assert_gate(x.grad, ref_dx, dtype, "dx")
    ref_dp = torch.zeros(t, e, device="cuda")
    ref_dp[t_idx, e_idx] = g_pp
    assert torch.equal(p.grad, ref_dp)

    # Unpermute with merging probs: d(inp) = g[t] * p, d(probs) = <g[t], inp[row]>.
    y = torch.randn(t * topk + 5, h, device="cuda", dtype=dtype, requires_grad=True)
    mp = probs.clone().requires_grad_()
    merged = turbo.ops.token_unpermute(y, rmap, mp)
    g = torch.randn_like(merged)
    merged.backward(g)
    y64 = y.detach().double().requires_grad_()
    mp64 = probs.double().requires_grad_()
    ref = torch.zeros(t, h, dtype=torch.float64, device="cuda").index_add(
        0, t_idx, y64[: t * topk] * mp64[t_idx, e_idx, None]
    )
    ref.backward(g.double())
    assert_gate(y.grad, y64.grad, dtype, "d(inp)")
    assert (y.grad[t * topk :] == 0).all()
    assert_gate(mp.grad, mp64.grad, torch.float32, "d(merging_probs)")

    # Without probs the backward is a permute of the gradient (exact).
    y2 = y.detach().clone().requires_grad_()
    turbo.ops.token_unpermute(y2, rmap).backward(g)
    assert torch.equal(y2.grad[: t * topk], g[t_idx]) and (y2.grad[t * topk :] == 0).all()


def test_int32_mask_and_unaligned_rows_and_empty():
    mask, probs = make_routing(40, 8, 3, seed=9)
    buf = torch.randn(40 * 35 + 1, device="cuda", dtype=torch.bfloat16)
    x = buf[1:].view(40, 35)  # odd hidden, unaligned: the scalar path
    out, _, rmap = turbo.ops.token_permute(x, routing_map=mask.to(torch.int32), num_out_tokens=120)
    t_idx, _ = reference_rows(mask, 120)
    assert torch.equal(out, x[t_idx])
    out, pprobs, rmap = turbo.ops.token_permute(x[:0], probs[:0], mask[:0], num_out_tokens=0)
    assert out.shape == (0, 35) and pprobs.shape == (0,) and rmap.shape == (0, 8)
    assert turbo.ops.token_unpermute(out, rmap).shape == (0, 35)


def test_num_out_tokens_counted_on_host():
    mask, _ = make_routing(100, 16, 2, seed=4)
    x = torch.randn(100, 64, device="cuda")
    out, _, _ = turbo.ops.token_permute(x, routing_map=mask)
    assert out.shape == (200, 64)


def test_cuda_graph_capture():
    mask, probs = make_routing(512, 64, 8, seed=5)
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    turbo.ops.token_permute(x, probs, mask, num_out_tokens=4096)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _, rmap = turbo.ops.token_permute(x, probs, mask, num_out_tokens=4096)
        back = turbo.ops.token_unpermute(out, rmap)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    t_idx, _ = reference_rows(mask, 4096)
    assert torch.equal(out, x[t_idx])
    assert_gate(back, x.double() * 8, torch.bfloat16)


def test_torch_compile_fullgraph():
    def fn(x, probs, mask):
        out, _, rmap = turbo.ops.token_permute(x, probs, mask, num_out_tokens=x.shape[0] * 2)
        return turbo.ops.token_unpermute(out * 2, rmap, probs)

    mask, probs = make_routing(64, 8, 2, seed=6)
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    out = torch.compile(fn, fullgraph=True)(x, probs, mask)
    assert torch.allclose(out, fn(x, probs, mask))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
