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
    poison_allocator(y.numel() * y.element_size())  # d(inp)'s rows no token references must be written
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
    unmerged = turbo.ops.token_unpermute(y2, rmap)
    poison_allocator(y2.numel() * y2.element_size())
    unmerged.backward(g)
    assert torch.equal(y2.grad[: t * topk], g[t_idx]) and (y2.grad[t * topk :] == 0).all()


@pytest.mark.parametrize("used", ["tokens", "probs"])
def test_gradient_of_one_output(used):
    """Only one of token_permute's outputs reaches the loss: the other gets no gradient, and the
    inputs' gradients are what that output alone gives (zero for the unused path)."""
    t, e, topk, h = 100, 16, 4, 256
    mask, probs = make_routing(t, e, topk, seed=5)
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    p = probs.clone().requires_grad_()
    out, pprobs, _ = turbo.ops.token_permute(x, p, mask, num_out_tokens=t * topk)
    t_idx, e_idx = reference_rows(mask, t * topk)
    if used == "tokens":
        g_out = torch.randn_like(out)
        dx, dp = torch.autograd.grad(out, (x, p), g_out, allow_unused=True)
        ref_dx = torch.zeros(t, h, dtype=torch.float64, device="cuda").index_add_(0, t_idx, g_out.double())
        assert_gate(dx, ref_dx, torch.bfloat16, "dx")
        assert dp is None or (dp == 0).all()
    else:
        g_pp = torch.randn_like(pprobs)
        dx, dp = torch.autograd.grad(pprobs, (x, p), g_pp, allow_unused=True)
        ref_dp = torch.zeros(t, e, device="cuda")
        ref_dp[t_idx, e_idx] = g_pp
        assert torch.equal(dp, ref_dp)
        assert dx is None or (dx == 0).all()


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


def test_capture_without_num_out_tokens_asks_for_it():
    """Counting the routed tokens needs a host sync, which a capture cannot do: a clear error."""
    mask, probs = make_routing(64, 8, 2, seed=6)
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    turbo.ops.token_permute(x, probs, mask, num_out_tokens=128)  # warm the module outside the capture
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="pass num_out_tokens"):
        with torch.cuda.graph(graph):
            turbo.ops.token_permute(x, probs, mask)


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


# ---- moe_permute / moe_unpermute ----------------------------------------------------------------


def make_topk(t, e, topk, seed=0, drop=0.0, device="cuda"):
    """[t, topk] distinct expert indices per token (a fraction `drop` set to -1: no route), the
    equivalent bool map, and [t, topk] / [t, e] probabilities (zero where not routed)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    idx = torch.rand(t, e, generator=g).argsort(dim=1)[:, :topk]
    if drop:
        idx[torch.rand(t, topk, generator=g) < drop] = -1
    mask = torch.zeros(t, e + 1, dtype=torch.bool).scatter_(1, torch.where(idx < 0, e, idx), True)[:, :e]
    ptopk = (torch.rand(t, topk, generator=g) + 0.05) * (idx >= 0)
    pmap = torch.zeros(t, e + 1).scatter_(1, torch.where(idx < 0, e, idx), ptopk)[:, :e]
    return idx.to(device), mask.to(device), ptopk.to(device), pmap.to(device)


def moe_layout(mask, align, cap):
    """Per permuted row: source token (-1: padding or unused) and expert; plus tokens_per_expert,
    total padded rows and the per-expert (rows, tokens) of the real copies (slots < cap)."""
    t, e = mask.shape
    counts = mask.sum(0).tolist()
    padded = [(c + align - 1) // align * align if align > 1 else c for c in counts]
    total = sum(padded)
    m = cap if cap > 0 else total
    src_t = torch.full((max(m, total),), -1, dtype=torch.long, device=mask.device)
    src_e = torch.full_like(src_t, -1)
    off, tpe, per_expert = 0, [], []
    for x in range(e):
        toks = mask[:, x].nonzero().flatten()
        rows = torch.arange(off, off + counts[x], device=mask.device)
        src_t[rows], src_e[rows] = toks, x
        keep = rows < m
        per_expert.append((rows[keep], toks[keep]))
        tpe.append(max(0, min(padded[x], m - off)))
        off += padded[x]
    return src_t[:m], src_e[:m], tpe, total, per_expert


def ordered_sum(src, per_expert, t):
    """out[t] = sum of src[row] over t's rows, fp32 in expert order (one rounding per add)."""
    acc = torch.zeros(t, src.shape[1], dtype=torch.float32, device=src.device)
    for rows, toks in per_expert:
        if rows.numel():
            acc.index_add_(0, toks, src[rows].float())
    return acc.to(src.dtype)


MOE_CASES = [
    # t, e, topk, h, align, map kind, extra capacity (None: -1, exact size with one sync)
    (1000, 8, 2, 4096, 0, "int64", 0),
    (333, 64, 6, 1000, 16, "int32", 64 * 15),
    (257, 256, 8, 7168, 0, "bool", None),
    (300, 128, 8, 2048, 128, "int64", 128 * 127),
    (129, 512, 8, 96, 8, "int32", -100),  # capacity below the padded total: overflow
    (64, 16, 1, 33, 4, "bool", 7),
    (1, 8, 8, 8, 0, "int64", 0),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t,e,topk,h,align,kind,extra", MOE_CASES)
def test_moe_permute_unpermute_exact(t, e, topk, h, align, kind, extra, dtype):
    idx, mask, ptopk, pmap = make_topk(t, e, topk, seed=t + e, drop=0.1 if topk > 1 else 0.0)
    torch.manual_seed(t)
    x = torch.randn(t, h, device="cuda", dtype=dtype)
    counts = mask.sum(0)
    a = max(align, 1)
    padded_total = int(((counts + a - 1) // a * a).sum())
    cap = -1 if extra is None else t * topk + extra
    if kind == "bool":
        emap, probs, layout, width = mask, pmap, "routing_map", e
    else:
        emap, probs, layout, width = idx.to(getattr(torch, kind)), ptopk, "topk", topk
    if cap > 0:
        poison_allocator(cap * h * dtype.itemsize)
    out, rmap, tpe, ovf, nd, pscales, pprobs = turbo.ops.moe_permute(
        x, emap, num_local_experts=e, num_topk=topk, pad_multiple=align, num_permuted_tokens=cap,
        probs=probs, probs_layout=layout,
    )
    src_t, src_e, ref_tpe, total, per_expert = moe_layout(mask, max(align, 1), cap)
    m = src_t.numel()
    assert out.shape == (m, h) and pprobs.shape == (m,) and pscales is None
    assert rmap.shape == (t + align, 2 * e + 1) and rmap.dtype == torch.int32
    real = src_t >= 0
    assert torch.equal(out[real], x[src_t[real]])
    assert (out[~real] == 0).all() and (pprobs[~real] == 0).all()
    col = src_e[real] if kind == "bool" else (idx[src_t[real]] == src_e[real, None]).int().argmax(1)
    assert torch.equal(pprobs[real], probs[src_t[real], col])
    assert tpe.dtype == torch.int64 and tpe.tolist() == ref_tpe
    assert int(ovf.item()) == int(total > m) and (cap <= 0 or total <= m) == (int(ovf.item()) == 0)
    assert int(nd.item()) == int(mask.any(1).sum())
    assert padded_total == total

    # Unpermute: a sum in expert order (fp32), bitwise; probabilities carried back.
    y = torch.randn(m, h, device="cuda", dtype=dtype)
    back, uprobs = turbo.ops.moe_unpermute(
        y, rmap, nd, restore_shape=x.shape, num_local_experts=e, permuted_probs=pprobs,
        probs_topk_stride=0 if kind == "bool" else topk, pad_multiple=align,
    )
    assert torch.equal(back, ordered_sum(y, per_expert, t))
    kept = torch.zeros(t, width, device="cuda")
    for rows, toks in per_expert:
        if rows.numel():
            c = src_e[rows] if kind == "bool" else (idx[toks] == src_e[rows, None]).int().argmax(1)
            kept[toks, c] = 1
    assert torch.equal(uprobs, probs * kept)
    if cap <= 0 or total <= m:  # nothing dropped: the round trip restores each routed token * copies
        plain, none = turbo.ops.moe_unpermute(out, rmap, nd, restore_shape=x.shape, num_local_experts=e)
        assert none is None
        assert torch.equal(plain, ordered_sum(out, per_expert, t))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("align", [0, 16])
def test_moe_gradients(dtype, align):
    t, e, topk, h = 300, 32, 4, 512
    idx, mask, ptopk, _ = make_topk(t, e, topk, seed=3, drop=0.1)
    x = torch.randn(t, h, device="cuda", dtype=dtype, requires_grad=True)
    p = ptopk.clone().requires_grad_()
    cap = t * topk + e * max(align - 1, 0)
    out, rmap, _, _, nd, _, pprobs = turbo.ops.moe_permute(
        x, idx, num_local_experts=e, num_topk=topk, pad_multiple=align, num_permuted_tokens=cap, probs=p
    )
    src_t, src_e, _, _, per_expert = moe_layout(mask, max(align, 1), cap)
    real = src_t >= 0
    g_out, g_pp = torch.randn_like(out), torch.randn_like(pprobs)
    torch.autograd.backward((out, pprobs), (g_out, g_pp))
    assert torch.equal(x.grad, ordered_sum(g_out, per_expert, t))
    col = (idx[src_t[real]] == src_e[real, None]).int().argmax(1)
    ref_dp = torch.zeros_like(ptopk)
    ref_dp[src_t[real], col] = g_pp[real]
    assert torch.equal(p.grad, ref_dp)
    # Against autograd of an indexing reference (float64).
    x64 = x.detach().double().requires_grad_()
    p64 = ptopk.double().requires_grad_()
    ref_out = torch.zeros(out.shape, dtype=torch.float64, device="cuda")
    ref_out[real] = x64[src_t[real]]
    ref_pp = torch.zeros(pprobs.shape, dtype=torch.float64, device="cuda")
    ref_pp[real] = p64[src_t[real], col]
    torch.autograd.backward((ref_out, ref_pp), (g_out.double(), g_pp.double()))
    assert_gate(x.grad, x64.grad, dtype, "d(tokens)")
    assert torch.equal(p.grad.double(), p64.grad)

    # Unpermute backward: each token's gradient copied to its rows, padding rows zero.
    y = torch.randn(out.shape, device="cuda", dtype=dtype, requires_grad=True)
    pp = pprobs.detach().clone().requires_grad_()
    back, uprobs = turbo.ops.moe_unpermute(
        y, rmap, nd, restore_shape=x.shape, num_local_experts=e, permuted_probs=pp, probs_topk_stride=topk
    )
    g, gu = torch.randn_like(back), torch.randn_like(uprobs)
    torch.autograd.backward((back, uprobs), (g, gu))
    ref_dy = torch.zeros_like(y)
    ref_dy[real] = g[src_t[real]]
    assert torch.equal(y.grad, ref_dy)
    ref_dpp = torch.zeros_like(pprobs)
    ref_dpp[real] = gu[src_t[real], col]
    assert torch.equal(pp.grad, ref_dpp)
    y64 = y.detach().double().requires_grad_()
    ref_back = torch.zeros(t, h, dtype=torch.float64, device="cuda").index_add(0, src_t[real], y64[real])
    ref_back.backward(g.double())
    assert torch.equal(y.grad.double(), y64.grad)


@pytest.mark.parametrize("used", ["tokens", "probs"])
def test_moe_gradient_of_one_output(used):
    """Only one of moe_permute's (and then moe_unpermute's) differentiable outputs reaches the loss:
    the other input gets no gradient (or zeros), the used path its exact gradient."""
    t, e, topk, h = 96, 8, 2, 128
    idx, mask, ptopk, _ = make_topk(t, e, topk, seed=11)
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    p = ptopk.clone().requires_grad_()
    out, rmap, _, _, nd, _, pp = turbo.ops.moe_permute(
        x, idx, num_local_experts=e, num_topk=topk, num_permuted_tokens=t * topk, probs=p
    )
    src_t, src_e, _, _, per_expert = moe_layout(mask, 1, t * topk)
    col = (idx[src_t] == src_e[:, None]).int().argmax(1)
    if used == "tokens":
        g = torch.randn_like(out)
        dx, dp = torch.autograd.grad(out, (x, p), g, allow_unused=True)
        assert torch.equal(dx, ordered_sum(g, per_expert, t))
        assert dp is None or (dp == 0).all()
    else:
        g = torch.randn_like(pp)
        dx, dp = torch.autograd.grad(pp, (x, p), g, allow_unused=True)
        ref = torch.zeros_like(ptopk)
        ref[src_t, col] = g
        assert torch.equal(dp, ref)
        assert dx is None or (dx == 0).all()
    y = out.detach().clone().requires_grad_()
    q = pp.detach().clone().requires_grad_()
    back, up = turbo.ops.moe_unpermute(
        y, rmap, nd, restore_shape=x.shape, num_local_experts=e, permuted_probs=q, probs_topk_stride=topk
    )
    if used == "tokens":
        g = torch.randn_like(back)
        dy, dq = torch.autograd.grad(back, (y, q), g, allow_unused=True)
        assert torch.equal(dy, g[src_t])
        assert dq is None or (dq == 0).all()
    else:
        g = torch.randn_like(up)
        dy, dq = torch.autograd.grad(up, (y, q), g, allow_unused=True)
        assert torch.equal(dq, g[src_t, col])
        assert dy is None or (dy == 0).all()


def test_moe_cpp_and_python_autograd_agree(monkeypatch):
    """The C++ autograd of an eager training call and the Python autograd.Function (torch.compile's
    path, and where the C++ library is not loaded) give the same outputs and gradients bit for bit."""
    from primus_turbo.pytorch.core import native

    t, e, topk, h = 200, 16, 4, 256
    idx, _, ptopk, _ = make_topk(t, e, topk, seed=12, drop=0.1)
    x0 = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    g_seed = torch.Generator(device="cuda").manual_seed(0)

    def run():
        x = x0.clone().requires_grad_()
        p = ptopk.clone().requires_grad_()
        out, rmap, _, _, nd, _, pp = turbo.ops.moe_permute(
            x, idx, num_local_experts=e, num_topk=topk, pad_multiple=8, num_permuted_tokens=t * topk + e * 7, probs=p
        )
        back, up = turbo.ops.moe_unpermute(
            out * 1.5, rmap, nd, restore_shape=x.shape, num_local_experts=e, permuted_probs=pp * 0.5,
            probs_topk_stride=topk, pad_multiple=8,
        )
        g_seed.manual_seed(1)
        gb = torch.randn(back.shape, device="cuda", dtype=back.dtype, generator=g_seed)
        gu = torch.randn(up.shape, device="cuda", dtype=up.dtype, generator=g_seed)
        torch.autograd.backward((back, up), (gb, gu))
        return back, up, x.grad, p.grad

    cpp = run()
    monkeypatch.setattr(native, "CPP_AUTOGRAD", False)
    python = run()
    for a, b in zip(cpp, python):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2", "uint8"])
def test_moe_permute_fp8_scales_carried(fp8):
    t, e, topk, h, s = 200, 16, 2, 1024, 8
    idx, mask, ptopk, _ = make_topk(t, e, topk, seed=11)
    raw = torch.randint(0, 255, (t, h), dtype=torch.uint8, device="cuda")
    xq = raw.view(getattr(torch, fp8))
    scales = torch.rand(t, s, device="cuda") + 0.5
    out, rmap, _, _, nd, pscales, pprobs = turbo.ops.moe_permute(
        xq, idx, num_local_experts=e, num_topk=topk, pad_multiple=32, num_permuted_tokens=t * topk + e * 31,
        scaling_factor=scales, scales_per_token=s, probs=ptopk, use_fp8=True,
    )
    src_t, _, _, _, _ = moe_layout(mask, 32, t * topk + e * 31)
    real = src_t >= 0
    assert out.dtype == xq.dtype and pscales.shape == (out.shape[0], s)
    assert torch.equal(out.view(torch.uint8)[real], raw[src_t[real]])
    assert (out.view(torch.uint8)[~real] == 0).all()
    assert torch.equal(pscales[real], scales[src_t[real]]) and (pscales[~real] == 0).all()
    # Without use_fp8 the scales are not carried (as the original); an unaligned view is fine.
    buf = torch.randint(0, 255, (t * h + 1,), dtype=torch.uint8, device="cuda")
    out2 = turbo.ops.moe_permute(
        buf[1:].view(t, h).view(getattr(torch, fp8)), idx, num_local_experts=e, num_topk=topk, use_fp8=True
    )[0]
    src_t2, _, _, _, _ = moe_layout(mask, 1, -1)
    assert torch.equal(out2.view(torch.uint8), buf[1:].view(t, h)[src_t2])


def test_moe_empty_and_unrouted():
    x = torch.randn(0, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    emap = torch.zeros(0, 8, dtype=torch.bool, device="cuda")
    p = torch.zeros(0, 8, device="cuda", requires_grad=True)
    out, rmap, tpe, ovf, nd, _, pp = turbo.ops.moe_permute(
        x, emap, num_local_experts=8, pad_multiple=8, num_permuted_tokens=16, probs=p, probs_layout="routing_map"
    )
    assert out.shape == (0, 64) and rmap.shape == (8, 17) and tpe.tolist() == [0] * 8
    assert int(ovf.item()) == 0 and int(nd.item()) == 0 and pp.shape == (0,)
    torch.autograd.backward((out, pp), (torch.zeros_like(out), torch.zeros_like(pp)))
    assert x.grad.shape == (0, 64) and p.grad.shape == (0, 8)
    back, _ = turbo.ops.moe_unpermute(out, rmap, nd, restore_shape=x.shape, num_local_experts=8, pad_multiple=8)
    assert back.shape == (0, 64)
    # Tokens without a route (-1 everywhere) get zero rows back and no permuted rows.
    idx = torch.full((5, 2), -1, dtype=torch.int32, device="cuda")
    idx[2] = torch.tensor([3, 1])
    y = torch.randn(5, 48, device="cuda")
    out, rmap, tpe, _, nd, _, _ = turbo.ops.moe_permute(y, idx, num_local_experts=4, num_topk=2, num_permuted_tokens=6)
    assert torch.equal(out[:2], y[[2, 2]]) and (out[2:] == 0).all() and tpe.tolist() == [0, 1, 0, 1]
    assert int(nd.item()) == 1
    back, _ = turbo.ops.moe_unpermute(out, rmap, nd, restore_shape=y.shape, num_local_experts=4)
    assert torch.equal(back[2], (y[2].float() * 2).to(y.dtype)) and (back[[0, 1, 3, 4]] == 0).all()


def test_moe_cuda_graph_capture():
    t, e, topk, h = 512, 64, 8, 1024
    idx, mask, ptopk, _ = make_topk(t, e, topk, seed=5)
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    cap = t * topk + e * 15
    kw = dict(num_local_experts=e, num_topk=topk, pad_multiple=16, num_permuted_tokens=cap, probs=ptopk)
    turbo.ops.moe_permute(x, idx, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, rmap, tpe, _, nd, _, pp = turbo.ops.moe_permute(x, idx, **kw)
        back, up = turbo.ops.moe_unpermute(
            out, rmap, nd, restore_shape=x.shape, num_local_experts=e, permuted_probs=pp, probs_topk_stride=topk
        )
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    src_t, _, ref_tpe, _, per_expert = moe_layout(mask, 16, cap)
    real = src_t >= 0
    assert torch.equal(out[real], x[src_t[real]]) and (out[~real] == 0).all()
    assert tpe.tolist() == ref_tpe
    assert torch.equal(back, ordered_sum(out, per_expert, t)) and torch.equal(up, ptopk)


def test_moe_torch_compile_fullgraph():
    def fn(x, idx, p, n):
        out, rmap, _, _, nd, _, pp = turbo.ops.moe_permute(
            x, idx, num_local_experts=8, num_topk=2, pad_multiple=4, num_permuted_tokens=n, probs=p
        )
        back, up = turbo.ops.moe_unpermute(
            out * 2, rmap, nd, restore_shape=x.shape, num_local_experts=8, permuted_probs=pp * 3,
            probs_topk_stride=2, pad_multiple=4,
        )
        return back, up

    idx, _, ptopk, _ = make_topk(64, 8, 2, seed=6)
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    p = ptopk.clone().requires_grad_()
    for n in (64 * 2 + 8 * 3, -1):  # -1: the exact size, a data-dependent shape
        back, up = torch.compile(fn, fullgraph=True)(x, idx, p, n)
        ref_back, ref_up = fn(x, idx, p, n)
        assert torch.equal(back, ref_back) and torch.equal(up, ref_up)
        (back.sum() + up.sum()).backward()
        assert torch.equal(x.grad, torch.full_like(x, 4.0)) and torch.equal(p.grad, torch.full_like(p, 3.0))
        x.grad = p.grad = None


def defined_map_entries(row_id_map, t, e):
    """moe_permute's map with the entries past each token's count (unspecified) zeroed."""
    m = row_id_map[:t].clone()
    n = m[:, 2 * e : 2 * e + 1].long()
    col = torch.arange(e, device=m.device)[None, :]
    unused = (col >= n).repeat(1, 2)
    m[:, : 2 * e][unused] = 0
    return m


def test_moe_noncontiguous_inputs():
    t, e, topk, h = 100, 16, 4, 256
    idx, _, ptopk, _ = make_topk(t, e, topk, seed=8)
    x = torch.randn(t, 2 * h, device="cuda", dtype=torch.bfloat16)[:, ::2]
    idx_nc = torch.stack([idx, idx], dim=2)[:, :, 0]
    p_nc = torch.stack([ptopk, ptopk], dim=2)[:, :, 1]
    assert not (x.is_contiguous() or idx_nc.is_contiguous() or p_nc.is_contiguous())
    kw = dict(num_local_experts=e, num_topk=topk, pad_multiple=8, num_permuted_tokens=t * topk + e * 7)
    got = turbo.ops.moe_permute(x, idx_nc, probs=p_nc, **kw)
    want = turbo.ops.moe_permute(x.contiguous(), idx, probs=ptopk, **kw)
    for i, (a, b) in enumerate(zip(got, want)):
        if i == 1:  # row_id_map: only a token's first n entries (of each half) are defined
            a, b = defined_map_entries(a, t, e), defined_map_entries(b, t, e)
        assert (a is None and b is None) or torch.equal(a, b)
    y = torch.randn(got[0].shape[0], 2 * h, device="cuda", dtype=torch.bfloat16)[:, :h]
    back, _ = turbo.ops.moe_unpermute(y, got[1], got[4], restore_shape=(t, h), num_local_experts=e)
    assert torch.equal(back, turbo.ops.moe_unpermute(y.contiguous(), got[1], got[4], restore_shape=(t, h),
                                                     num_local_experts=e)[0])
