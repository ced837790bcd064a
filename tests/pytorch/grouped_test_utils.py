"""Shared pieces of the grouped GEMM GPU tests (bf16, FP8, FP4): group-size distributions, inputs
and the per-group float64 product."""

import torch


def group_lens(dist: str, g: int, m_per: int, seed: int = 0) -> torch.Tensor:
    """int64 CUDA group sizes: "balanced", "skewed" (a few experts take most tokens, every third
    none), "zeros" (first and last empty) or anything else (random, some empty, none aligned)."""
    gen = torch.Generator().manual_seed(seed)
    if dist == "balanced":
        lens = torch.full((g,), m_per, dtype=torch.int64)
    elif dist == "skewed":
        w = torch.rand(g, generator=gen) ** 4
        lens = (w / w.sum() * m_per * g).floor().to(torch.int64)
        lens[:: max(1, g // 3)] = 0
    elif dist == "zeros":
        lens = torch.randint(1, 2 * m_per, (g,), generator=gen)
        lens[0] = lens[-1] = 0
    else:
        lens = torch.randint(0, 2 * m_per, (g,), generator=gen)
    return lens.cuda()


def grouped_inputs(lens, k, n, g, dtype, trans_b, seed=0):
    """a [sum(lens), K] and b [G, N, K] (trans_b) or [G, K, N], unit-scale products."""
    torch.manual_seed(seed)
    m = int(lens.sum().item())
    a = torch.randn(m, k, dtype=dtype, device="cuda")
    shape = (g, n, k) if trans_b else (g, k, n)
    b = (torch.randn(shape, device="cuda") / k**0.5).to(dtype)
    return a, b


def group_offsets(lens) -> list:
    return [0] + torch.cumsum(lens.cpu(), 0).tolist()


def grouped64(x, w_nk, lens):
    """Per group x[rows] @ w_nk[g]^T in float64; w_nk [G, N, K]."""
    offs = group_offsets(lens)
    out = torch.zeros(x.shape[0], w_nk.shape[1], dtype=torch.float64, device=x.device)
    for g in range(w_nk.shape[0]):
        s, e = offs[g], offs[g + 1]
        out[s:e] = x[s:e].double() @ w_nk[g].double().t()
    return out


def grouped_e2e_references(a, b, lens, grad_out, trans_b):
    """Per-group float64 forward, dgrad and wgrad of a @ op(b[g]) from the high-precision
    operands (b [G, N, K] with trans_b, else [G, K, N])."""
    w_nk = b if trans_b else b.transpose(1, 2)  # op(b)^T per expert
    out = grouped64(a, w_nk, lens)
    da = grouped64(grad_out, w_nk.transpose(1, 2), lens)
    offs = group_offsets(lens)
    db = torch.zeros(b.shape, dtype=torch.float64, device=b.device)
    for g in range(b.shape[0]):
        s, e = offs[g], offs[g + 1]
        dw = a[s:e].double().t() @ grad_out[s:e].double()  # [K, N]
        db[g] = dw.t() if trans_b else dw
    return out, da, db


def capture_training_step(call, a, b, grad_out):
    """Warms ``call()`` (forward, then backward with grad_out) twice on a side stream, as torch
    recommends before capture, then captures one step; returns (graph, out). a.grad and b.grad
    are the graph's gradients."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # builds plans and modules outside the capture
        for _ in range(2):
            a.grad = b.grad = None
            call().backward(grad_out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    a.grad = b.grad = None
    with torch.cuda.graph(graph):
        out = call()
        out.backward(grad_out)
    return graph, out
