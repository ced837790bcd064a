"""MoE routing ops on the GPU: fused_group_topk_routing_with_aux_score against a float64 torch
reference of the same math (exact routing map, probs / scores under the gates of ACCURACY.md,
gradients against the reference's autograd) on model configurations and odd sizes, the tie rule,
indices_to_multihot and tokens_per_expert_to_mask against indexing references, empty inputs, CUDA
graphs and torch.compile."""

import pytest
import torch
from turbo_test_utils import assert_gate, poison_allocator

import primus_turbo.pytorch as turbo

pytestmark = pytest.mark.gpu

route = turbo.ops.fused_group_topk_routing_with_aux_score
DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# (name, experts, topk, groups, selected_groups, score_function, scaling)
MODELS = [
    ("deepseek_v3", 256, 8, 8, 4, "sigmoid", 2.5),
    ("qwen3_moe", 128, 8, 1, 1, "softmax", 1.0),
    ("mixtral", 8, 2, 1, 1, "softmax", 1.0),
    ("kimi_k2", 384, 8, 1, 1, "sigmoid", 2.827),
]
ODD = [
    # experts not a multiple of 32, groups > 32 lanes, topk 1, a group per selected group, ...
    (1, 1, 1, 1, "sigmoid", 1.0),
    (7, 3, 1, 1, "sigmoid", 1.0),
    (33, 5, 1, 1, "softmax", 1.5),
    (96, 6, 6, 3, "sigmoid", 2.0),
    (100, 4, 10, 2, "softmax", 1.0),
    (160, 1, 1, 1, "sigmoid", 1.0),
    (160, 1, 1, 1, "softmax", 3.0),
    (256, 8, 64, 8, "sigmoid", 1.0),
    (512, 8, 8, 4, "sigmoid", 2.5),
    (1024, 16, 64, 8, "softmax", 1.0),
    (1000, 9, 8, 3, "sigmoid", 1.0),
    (64, 64, 1, 1, "sigmoid", 1.0),
]


def reference(logits, topk, groups, sel, score_function, scaling):
    """float64 reference: (scores, probs, routing_map, margin). margin is the smallest gap of a
    decision (expert k vs k+1, group sel vs sel+1) relative to the row's largest score."""
    x = logits.double()
    t, e = x.shape
    s = torch.sigmoid(x) if score_function == "sigmoid" else torch.softmax(x, dim=-1)
    margin = torch.full((t,), float("inf"), dtype=torch.float64, device=x.device)
    if groups > 1:
        gscore = s.view(t, groups, -1).topk(topk // sel, dim=-1).values.sum(-1)
        gsorted = gscore.detach().sort(dim=-1, descending=True).values
        if sel < groups:
            margin = torch.minimum(margin, gsorted[:, sel - 1] - gsorted[:, sel])
        gidx = gscore.detach().topk(sel, dim=-1).indices
        gmask = torch.zeros(t, groups, dtype=torch.bool, device=x.device).scatter(1, gidx, True)
        emask = gmask[:, :, None].expand(t, groups, e // groups).reshape(t, e)
        masked = s.masked_fill(~emask, float("-inf"))
    else:
        masked = s
    eligible = e // groups * sel
    vals_sorted = masked.detach().sort(dim=-1, descending=True).values
    if topk < eligible:
        margin = torch.minimum(margin, vals_sorted[:, topk - 1] - vals_sorted[:, topk])
    margin = margin / vals_sorted[:, 0].clamp_min(1e-300)
    idx = masked.detach().topk(topk, dim=-1).indices
    vals = s.gather(1, idx)
    if score_function == "sigmoid" and topk > 1:
        vals = vals / (vals.sum(-1, keepdim=True) + 1e-20)
    probs = torch.zeros_like(s).scatter(1, idx, vals * scaling)
    rmap = torch.zeros(t, e, dtype=torch.bool, device=x.device).scatter(1, idx, True)
    if score_function == "sigmoid" and topk > 1:
        scores = s / (s.sum(-1, keepdim=True) + 1e-20)
    else:
        scores = s
    return scores, probs, rmap, margin


def separated_logits(tokens, experts, topk, groups, sel, fn, dtype, seed, min_gap=1e-4):
    """Fresh normal logits whose routing decisions are not near-ties (rows with a relative gap
    below min_gap are drawn again), so that the exact routing map is well defined in fp32."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, experts, device="cuda", generator=g).to(dtype)
    for _ in range(100):
        _, _, _, margin = reference(x, topk, groups, sel, fn, 1.0)
        bad = margin < min_gap
        n = int(bad.sum())
        if n == 0:
            return x
        x[bad] = torch.randn(n, experts, device="cuda", generator=g).to(dtype)
    raise AssertionError("could not draw well-separated logits")


def check_routing(tokens, experts, topk, groups, sel, fn, scaling, dtype, seed=0, grads=("probs", "scores")):
    x = separated_logits(tokens, experts, topk, groups, sel, fn, dtype, seed)
    xr = x.detach().double().requires_grad_()
    ref_scores, ref_probs, ref_map, _ = reference(xr, topk, groups, sel, fn, scaling)

    poison_allocator(3 * x.numel() * x.element_size() + (1 << 20))
    xk = x.detach().requires_grad_()
    scores, probs, rmap = route(xk, topk, groups, sel, fn, scaling)
    assert rmap.dtype == torch.bool and scores.dtype == dtype and probs.dtype == dtype
    mism = (rmap != ref_map).any(-1).nonzero().flatten()
    assert mism.numel() == 0, f"routing map differs on {mism.numel()} tokens, first {mism[:5].tolist()}"
    assert (rmap.sum(-1) == topk).all()
    assert_gate(scores, ref_scores, dtype, "scores")
    assert_gate(probs, ref_probs, dtype, "probs")
    assert (probs[~rmap] == 0).all()

    gen = torch.Generator(device="cuda").manual_seed(seed + 7)
    gp = torch.randn(x.shape, device="cuda", generator=gen).to(dtype)
    gs = torch.randn(x.shape, device="cuda", generator=gen).to(dtype)
    loss_k = 0
    loss_r = 0
    if "probs" in grads:
        loss_k = loss_k + (probs.double() * gp.double()).sum()
        loss_r = loss_r + (ref_probs * gp.double()).sum()
    if "scores" in grads:
        loss_k = loss_k + (scores.double() * gs.double()).sum()
        loss_r = loss_r + (ref_scores * gs.double()).sum()
    loss_k.backward()
    loss_r.backward()
    assert xk.grad.dtype == dtype
    assert_gate(xk.grad, xr.grad, dtype, f"grad logits ({'+'.join(grads)})")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [4096, 1000])
@pytest.mark.parametrize("model", MODELS, ids=[m[0] for m in MODELS])
def test_model_configs(model, tokens, dtype):
    _, experts, topk, groups, sel, fn, scaling = model
    check_routing(tokens, experts, topk, groups, sel, fn, scaling, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cfg", ODD, ids=lambda c: "-".join(map(str, c)))
def test_odd_configs(cfg, dtype):
    check_routing(257, *cfg, dtype, seed=3)


@pytest.mark.parametrize("grads", [("probs",), ("scores",)])
@pytest.mark.parametrize("model", MODELS, ids=[m[0] for m in MODELS])
def test_single_output_gradients(model, grads):
    _, experts, topk, groups, sel, fn, scaling = model
    check_routing(513, experts, topk, groups, sel, fn, scaling, torch.float32, seed=5, grads=grads)


def test_large_token_count_deepseek():
    check_routing(65536 + 17, 256, 8, 8, 4, "sigmoid", 2.5, torch.bfloat16, seed=11, grads=("probs", "scores"))


def test_ties_pick_lower_indices():
    # All logits equal: the first selected_groups groups, then the lowest expert indices win.
    x = torch.zeros(5, 256, device="cuda")
    _, probs, rmap = route(x, 8, 8, 4, "sigmoid", 2.5)
    want = torch.zeros(256, dtype=torch.bool, device="cuda")
    want[:8] = True
    assert (rmap == want).all()
    torch.testing.assert_close(probs[:, :8], torch.full((5, 8), 2.5 / 8, device="cuda"))
    # Equal group scores but distinct experts: groups 0 and 1 tie with groups 2, 3; lower groups win.
    x = torch.full((1, 16), -5.0, device="cuda")
    x[0, [0, 4, 8, 12]] = 1.0
    _, _, rmap = route(x, 2, 4, 2, "softmax", 1.0)
    assert rmap[0].nonzero().flatten().tolist() == [0, 4]


def test_aux_scores_match_original_formula():
    # The original library's aux score: softmax, or sigmoid normalized over the experts when topk > 1.
    x = torch.randn(300, 64, device="cuda")
    s, _, _ = route(x, 4, 1, 1, "sigmoid", 1.0)
    sig = torch.sigmoid(x.double())
    torch.testing.assert_close(s.double(), sig / (sig.sum(-1, keepdim=True) + 1e-20), rtol=1e-5, atol=1e-7)
    s, _, _ = route(x, 1, 1, 1, "sigmoid", 1.0)
    torch.testing.assert_close(s.double(), sig, rtol=1e-5, atol=1e-7)
    s, _, _ = route(x, 4, 1, 1, "softmax", 1.0)
    torch.testing.assert_close(s.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-7)


def test_non_contiguous_logits():
    base = torch.randn(64, 2 * 256, device="cuda")
    x = base[:, ::2]
    s, p, m = route(x, 8, 8, 4, "sigmoid", 2.5)
    s2, p2, m2 = route(x.contiguous(), 8, 8, 4, "sigmoid", 2.5)
    assert torch.equal(m, m2) and torch.equal(p, p2) and torch.equal(s, s2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_tokens(dtype):
    x = torch.empty(0, 256, device="cuda", dtype=dtype, requires_grad=True)
    s, p, m = route(x, 8, 8, 4, "sigmoid", 2.5)
    assert s.shape == p.shape == m.shape == (0, 256)
    (s.sum() + p.sum()).backward()
    assert x.grad.shape == (0, 256)


def test_deterministic():
    x = torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    outs = []
    for _ in range(2):
        x.grad = None
        s, p, m = route(x, 8, 8, 4, "sigmoid", 2.5)
        (s.float().square().sum() + p.float().square().sum()).backward()
        outs.append((s, p, m, x.grad.clone()))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_cuda_graph_capture_and_replay():
    x = torch.randn(2048, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gp = torch.randn(2048, 256, device="cuda", dtype=torch.bfloat16)

    def step():
        s, p, m = route(x, 8, 8, 4, "sigmoid", 2.5)
        torch.autograd.backward([p, s], [gp, gp])
        return s, p, m

    # Detached: a reference that kept its grad_fn would keep x's gradient accumulator, created on
    # the default stream, alive into the capture (autograd would then sync the legacy stream).
    s_ref, p_ref, m_ref = (t.detach() for t in step())  # compiles and loads the modules outside the capture
    g_ref = x.grad.clone()
    x.grad = None
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up on a side stream, as torch recommends before capture
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        s, p, m = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(s, s_ref) and torch.equal(p, p_ref) and torch.equal(m, m_ref)
    assert torch.equal(x.grad, g_ref)


def test_torch_compile_fullgraph():
    def fn(x):
        s, p, m = route(x, 8, 8, 4, "sigmoid", 2.5)
        return (s.float() * 3).sum() + (p.float() * m).sum()

    x = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    compiled = torch.compile(fn, fullgraph=True)
    out = compiled(x)
    out.backward()
    ref = fn(xe)
    ref.backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, xe.grad)


# ---- indices_to_multihot -----------------------------------------------------------------------


def multihot_reference(indices, probs, experts):
    t, k = indices.shape
    rmap = torch.zeros(t, experts, dtype=torch.bool, device=indices.device)
    dense = torch.zeros(t, experts, dtype=torch.float64, device=indices.device)
    for j in range(k):  # later positions overwrite earlier ones
        idx = indices[:, j]
        ok = (idx >= 0) & (idx < experts)
        rows = ok.nonzero().flatten()
        rmap[rows, idx[rows]] = True
        dense[rows, idx[rows]] = probs[rows, j].double()
    return rmap, dense


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("tokens,experts,topk", [(4096, 256, 8), (333, 7, 3), (1000, 1024, 32), (17, 16, 40)])
def test_indices_to_multihot(tokens, experts, topk, fused, dtype, idx_dtype):
    g = torch.Generator(device="cuda").manual_seed(tokens + experts)
    scores = torch.rand(tokens, experts, device="cuda", generator=g)
    if topk <= experts:
        indices = scores.topk(topk, dim=-1).indices
    else:  # more slots than experts: repeats
        indices = torch.randint(0, experts, (tokens, topk), device="cuda", generator=g)
    drop = torch.rand(tokens, topk, device="cuda", generator=g) < 0.2
    indices = indices.masked_fill(drop, -1).to(idx_dtype)
    probs = torch.randn(tokens, topk, device="cuda", generator=g).to(dtype).requires_grad_()
    poison_allocator(tokens * experts * 8 + (1 << 20))
    rmap, dense = turbo.ops.indices_to_multihot(indices, probs, experts, fused=fused)
    ref_map, ref_dense = multihot_reference(indices.long(), probs.detach(), experts)
    assert dense.dtype == (dtype if fused else torch.float32) and rmap.dtype == torch.bool
    assert torch.equal(rmap, ref_map)
    assert torch.equal(dense.double(), ref_dense.to(dense.dtype).double())
    grad = torch.randn(tokens, experts, device="cuda", generator=g).to(dense.dtype)
    dense.backward(grad)
    # Reference gradient: a position receives the grad of its expert if no later position repeats it.
    idx = indices.long()
    later_dup = torch.zeros_like(idx, dtype=torch.bool)
    for j in range(topk):
        later_dup[:, j] = (idx[:, j + 1 :] == idx[:, j : j + 1]).any(-1)
    live = (idx >= 0) & (idx < experts) & ~later_dup
    want = torch.where(
        live, grad.gather(1, idx.clamp(0, experts - 1)), torch.zeros((), dtype=grad.dtype, device="cuda")
    )
    assert probs.grad.dtype == dtype
    assert torch.equal(probs.grad, want.to(dtype))


def test_indices_to_multihot_empty_and_graph():
    idx = torch.empty(0, 8, dtype=torch.int64, device="cuda")
    probs = torch.empty(0, 8, device="cuda")
    rmap, dense = turbo.ops.indices_to_multihot(idx, probs, 32, fused=True)
    assert rmap.shape == dense.shape == (0, 32)
    idx = torch.randint(-1, 64, (512, 8), device="cuda")
    probs = torch.rand(512, 8, device="cuda")
    r0, d0 = turbo.ops.indices_to_multihot(idx, probs, 64, fused=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        r1, d1 = turbo.ops.indices_to_multihot(idx, probs, 64, fused=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(r0, r1) and torch.equal(d0, d1)


# ---- tokens_per_expert_to_mask -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("experts,num_tokens", [(8, 1000), (256, 65536 + 3), (1, 1), (300, 5)])
def test_tokens_per_expert_to_mask(experts, num_tokens, dtype):
    counts = torch.randint(0, max(2, 2 * num_tokens // experts), (experts,), device="cuda", dtype=dtype)
    mask = turbo.ops.tokens_per_expert_to_mask(counts, num_tokens)
    want = (torch.arange(num_tokens, device="cuda") < counts.long().sum()).long()
    assert mask.dtype == torch.int64 and torch.equal(mask, want)


def test_tokens_per_expert_to_mask_graph_and_compile():
    counts = torch.tensor([3, 0, 5, 1], device="cuda", dtype=torch.int32)
    graph = torch.cuda.CUDAGraph()
    turbo.ops.tokens_per_expert_to_mask(counts, 16)
    with torch.cuda.graph(graph):
        mask = turbo.ops.tokens_per_expert_to_mask(counts, 16)
    counts.copy_(torch.tensor([1, 1, 1, 1], device="cuda", dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert mask.tolist() == [1] * 4 + [0] * 12
    compiled = torch.compile(lambda c: turbo.ops.tokens_per_expert_to_mask(c, 10) * 2, fullgraph=True)
    assert compiled(counts).tolist() == [2] * 4 + [0] * 6
    assert turbo.ops.tokens_per_expert_to_mask(counts, 0).shape == (0,)
