"""turbo.ops.grouped_gemm on the GPU: forward, dgrad and wgrad against a per-group float64
reference, group-size distributions, CUDA graphs with sizes changed between replays, torch.compile."""

import pytest
import torch
from grouped_test_utils import group_lens as _lens
from grouped_test_utils import grouped_inputs as _inputs
from turbo_test_utils import assert_gate, capture_graph, poison_allocator

import primus_turbo.pytorch as turbo

pytestmark = pytest.mark.gpu




def _reference(a, b, lens, grad_out, trans_b):
    """Per-group float64: out, dgrad, wgrad."""
    offs = [0] + torch.cumsum(lens.cpu(), 0).tolist()
    a64, b64, go64 = a.double(), b.double(), grad_out.double()
    out = torch.zeros(a.shape[0], grad_out.shape[1], dtype=torch.float64, device=a.device)
    da = torch.zeros_like(a64)
    db = torch.zeros_like(b64)
    for g in range(b.shape[0]):
        s, e = offs[g], offs[g + 1]
        w = b64[g].t() if trans_b else b64[g]  # [K, N]
        out[s:e] = a64[s:e] @ w
        da[s:e] = go64[s:e] @ w.t()
        dw = a64[s:e].t() @ go64[s:e]  # [K, N]
        db[g] = dw.t() if trans_b else dw
    return out, da, db


def _check_all(lens, k, n, g, dtype, trans_b):
    a, b = _inputs(lens, k, n, g, dtype, trans_b)
    a.requires_grad_(True)
    b.requires_grad_(True)
    out = turbo.ops.grouped_gemm(a, b, lens, trans_b=trans_b)
    grad_out = torch.randn_like(out)
    poison_allocator(b.numel() * b.element_size())  # an unwritten wgrad element shows up as NaN
    out.backward(grad_out)
    ref, da, db = _reference(a.detach(), b.detach(), lens, grad_out, trans_b)
    assert_gate(out, ref, dtype, "forward")
    assert_gate(a.grad, da, dtype, "dgrad")
    assert_gate(b.grad, db, dtype, "wgrad")
    empty = (lens == 0).nonzero().flatten().tolist()
    if empty:
        assert (b.grad[empty] == 0).all(), "an expert with no tokens must get an exact zero gradient"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("dist", ["balanced", "skewed", "zeros"])
def test_grouped_gemm_fwd_bwd(dtype, trans_b, dist):
    _check_all(_lens(dist, 8, 192), 256, 384, 8, dtype, trans_b)


@pytest.mark.parametrize("g", [1, 2, 17, 64, 256, 300])
@pytest.mark.parametrize("trans_b", [False, True])
def test_grouped_gemm_group_counts(g, trans_b):
    _check_all(_lens("random", g, 40, seed=g), 128, 256, g, torch.bfloat16, trans_b)


def test_grouped_gemm_large_skewed():
    _check_all(_lens("skewed", 16, 1024, seed=3), 1024, 2048, 16, torch.bfloat16, True)


def test_group_offs_matches_default():
    lens = _lens("zeros", 6, 100)
    a, b = _inputs(lens, 128, 128, 6, torch.bfloat16, False)
    offs = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
    torch.testing.assert_close(turbo.ops.grouped_gemm(a, b, lens, offs), turbo.ops.grouped_gemm(a, b, lens))


def test_group_offs_with_gaps():
    """Explicit offsets may leave rows between groups (e.g. padded layouts); those rows are not
    part of any group."""
    lens = torch.tensor([30, 0, 50], dtype=torch.int64, device="cuda")
    offs = torch.tensor([8, 40, 40, 96], dtype=torch.int64, device="cuda")
    a = torch.randn(96, 64, dtype=torch.bfloat16, device="cuda")
    b = (torch.randn(3, 64, 32, device="cuda") / 8).to(torch.bfloat16)
    out = turbo.ops.grouped_gemm(a, b, lens, offs)
    for g, (s, n) in enumerate([(8, 30), (40, 0), (40, 50)]):
        if n:
            assert_gate(out[s : s + n], a[s : s + n].double() @ b[g].double(), torch.bfloat16, f"group {g}")


def test_sizes_that_do_not_add_up_are_clamped():
    a = torch.randn(100, 64, dtype=torch.bfloat16, device="cuda")
    b = (torch.randn(3, 64, 32, device="cuda") / 8).to(torch.bfloat16)
    # Too many rows: groups are clamped to [0, 100); nothing out of bounds (compute-sanitizer clean).
    lens = torch.tensor([60, 60, 60], dtype=torch.int64, device="cuda")
    out = turbo.ops.grouped_gemm(a, b, lens)
    assert_gate(out[:60], a[:60].double() @ b[0].double(), torch.bfloat16, "group 0")
    assert_gate(out[60:], a[60:].double() @ b[1].double(), torch.bfloat16, "group 1 (clamped)")
    # The wgrad path: group 1 keeps 40 rows, group 2 none (an exact zero gradient).
    grad_out = torch.randn(100, 32, dtype=torch.bfloat16, device="cuda")
    dw = torch.ops.primus_turbo.grouped_gemm_wgrad(a, grad_out, lens, None, False, 0)
    assert_gate(dw[1], a[60:].double().t() @ grad_out[60:].double(), torch.bfloat16, "wgrad group 1 (clamped)")
    assert (dw[2] == 0).all()
    # Negative lengths count as zero.
    lens = torch.tensor([-5, 100, 0], dtype=torch.int64, device="cuda")
    out = turbo.ops.grouped_gemm(a, b, lens)
    assert_gate(out, a.double() @ b[1].double(), torch.bfloat16, "negative length")
    torch.cuda.synchronize()


def test_rows_no_group_covers_are_zero():
    """Lengths that add up to fewer rows than 'a' has (dropped tokens, padded buffers): the rows past
    the last group come back as zeros, never as stale memory."""
    a = torch.randn(100, 64, dtype=torch.bfloat16, device="cuda")
    b = (torch.randn(3, 64, 32, device="cuda") / 8).to(torch.bfloat16)
    lens = torch.tensor([30, 0, 20], dtype=torch.int64, device="cuda")
    poison_allocator(100 * 32 * 2)
    out = turbo.ops.grouped_gemm(a, b, lens)
    assert_gate(out[:30], a[:30].double() @ b[0].double(), torch.bfloat16, "group 0")
    assert_gate(out[30:50], a[30:50].double() @ b[2].double(), torch.bfloat16, "group 2")
    assert (out[50:] == 0).all(), "rows no group covers must be zero"
    # With explicit offsets: the rows past the last group's end as well.
    offs = torch.tensor([0, 30, 30, 50], dtype=torch.int64, device="cuda")
    poison_allocator(100 * 32 * 2)
    out = turbo.ops.grouped_gemm(a, b, lens, offs)
    assert (out[50:] == 0).all()
    # All groups empty: an all-zero output.
    poison_allocator(100 * 32 * 2)
    assert (turbo.ops.grouped_gemm(a, b, torch.zeros(3, dtype=torch.int64, device="cuda")) == 0).all()


def test_check_group_lens_debug_mode(monkeypatch):
    """PRIMUS_TURBO_CHECK_GROUP_LENS=1 reads the sizes back and rejects what the default path clamps."""
    a = torch.randn(100, 64, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(3, 64, 32, dtype=torch.bfloat16, device="cuda")
    monkeypatch.setenv("PRIMUS_TURBO_CHECK_GROUP_LENS", "1")
    with pytest.raises(ValueError, match=r"group_lens\[0\] = -5 is negative"):
        turbo.ops.grouped_gemm(a, b, torch.tensor([-5, 100, 0], dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="adds up to 180, more than the 100 rows"):
        turbo.ops.grouped_gemm(a, b, torch.tensor([60, 60, 60], dtype=torch.int64, device="cuda"))
    turbo.ops.grouped_gemm(a, b, torch.tensor([40, 60, 0], dtype=torch.int64, device="cuda"))  # fine
    monkeypatch.setenv("PRIMUS_TURBO_CHECK_GROUP_LENS", "0")
    turbo.ops.grouped_gemm(a, b, torch.tensor([60, 60, 60], dtype=torch.int64, device="cuda"))  # clamped


def test_empty_inputs():
    b = torch.randn(4, 64, 32, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    lens = torch.zeros(4, dtype=torch.int64, device="cuda")
    a = torch.randn(0, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    out = turbo.ops.grouped_gemm(a, b, lens)
    assert out.shape == (0, 32)
    out.sum().backward()
    assert (b.grad == 0).all()
    # K == 0: zeros.
    lens = torch.tensor([2, 3], dtype=torch.int64, device="cuda")
    out = turbo.ops.grouped_gemm(torch.randn(5, 0, device="cuda").bfloat16(), torch.randn(2, 0, 16, device="cuda").bfloat16(), lens)
    assert (out == 0).all()


def test_non_contiguous_input():
    lens = _lens("random", 4, 64)
    a, b = _inputs(lens, 128, 64, 4, torch.bfloat16, False)
    a_view = a.t().contiguous().t()  # column-major view of the same values
    torch.testing.assert_close(turbo.ops.grouped_gemm(a_view, b, lens), turbo.ops.grouped_gemm(a, b, lens))


def test_cuda_graph_replay_with_new_group_sizes():
    g, k, n, m = 8, 256, 128, 1024
    torch.manual_seed(0)
    a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    b = (torch.randn(g, n, k, device="cuda") / 16).to(torch.bfloat16).requires_grad_(True)
    grad_out = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    lens = torch.full((g,), m // g, dtype=torch.int64, device="cuda")

    def step():
        a.grad = b.grad = None
        out = turbo.ops.grouped_gemm(a, b, lens, trans_b=True)
        out.backward(grad_out)
        return out

    graph, static_out = capture_graph(step)  # warm up (compiles, plans) outside the capture
    for seed in range(3):
        # m tokens over a random subset of experts (the others empty), summing to m exactly.
        gen = torch.Generator().manual_seed(seed)
        experts = torch.randperm(g, generator=gen)[: max(1, g - 2 * seed)]
        picks = experts[torch.randint(0, len(experts), (m,), generator=gen)]
        lens.copy_(torch.bincount(picks, minlength=g).cuda())
        graph.replay()
        torch.cuda.synchronize()
        ref, da, db = _reference(a.detach(), b.detach(), lens, grad_out, True)
        assert_gate(static_out, ref, torch.bfloat16, f"replay {seed} forward")
        assert_gate(a.grad, da, torch.bfloat16, f"replay {seed} dgrad")
        assert_gate(b.grad, db, torch.bfloat16, f"replay {seed} wgrad")


def test_grouped_linear_torch_compile_fullgraph():
    torch.manual_seed(0)
    layer = turbo.modules.GroupedLinear(4, 256, 128, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([100, 0, 60, 96], dtype=torch.int64, device="cuda")
    x = torch.randn(256, 256, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True)
    out = compiled(x, lens)
    out.float().pow(2).sum().backward()
    ref, _, _ = _reference(x.detach(), layer.weight.detach(), lens, torch.zeros_like(out), True)
    assert_gate(out, ref, torch.bfloat16, "compiled forward")
    assert x.grad is not None and layer.weight.grad is not None
    assert (layer.weight.grad[1] == 0).all()


def test_autotune_picks_a_candidate():
    from primus_turbo.pytorch.core.backend import GlobalBackendManager

    GlobalBackendManager.set_grouped_gemm_backend(auto_tune=True)
    lens = _lens("skewed", 8, 256)
    a, b = _inputs(lens, 256, 256, 8, torch.bfloat16, False)
    ref, _, _ = _reference(a, b, lens, torch.zeros(a.shape[0], 256, device="cuda"), False)
    assert_gate(turbo.ops.grouped_gemm(a, b, lens), ref, torch.bfloat16, "autotuned forward")


@pytest.mark.parametrize("trans_b", [False, True], ids=["nn", "nt"])
def test_num_cu_and_megatron_main_grad(trans_b):
    # num_cu: the persistent kernels on fewer SMs compute the same tiles (bitwise equal; 7 runs
    # as 6, whole 2-CTA clusters);
    # fuse_bgrad_accum_pattern="megatron": the weight gradient lands in main_grad.
    lens = torch.tensor([100, 0, 257, 31], dtype=torch.int64, device="cuda")
    a, b = _inputs(lens, 256, 384, 4, torch.bfloat16, trans_b)
    grad_out = torch.randn(a.shape[0], 384, device="cuda", dtype=torch.bfloat16)
    runs = []
    for num_cu, fuse in ((None, False), (7, False), (None, True)):
        a_, b_ = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        if fuse:
            b_.main_grad = torch.ones(b.shape, device="cuda", dtype=torch.float32)
        out = turbo.ops.grouped_gemm(
            a_, b_, lens, trans_b=trans_b, num_cu=num_cu, fuse_bgrad_accum_pattern="megatron" if fuse else None
        )
        out.backward(grad_out)
        runs.append((out, a_.grad, b_.main_grad - 1 if fuse else b_.grad.float()))
        if fuse:
            assert b_.grad_added_to_main_grad
    for name, x, y in zip(("out", "da", "db"), runs[0], runs[1]):
        assert torch.equal(x, y), f"num_cu=7: {name} differs"
    torch.testing.assert_close(runs[2][2], runs[0][2], rtol=0, atol=1e-2)

