"""turbo.ops.rmsnorm on the GPU: forward, dx and dgamma against float64 references under the
gates of ACCURACY.md, odd sizes and empty inputs, views, unaligned pointers, determinism, CUDA
graphs, torch.compile and the module."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from turbo_test_utils import GATES, assert_gate, poison_allocator

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# Around the warp/block boundary (1024), vector widths (8 and 4 elements) and the model sizes.
HIDDEN = [1, 127, 128, 4096, 4097, 7168, 16384]
ROWS = [0, 1, 3, 1000, 8192]
EPS = 1e-6


def make_inputs(rows, hidden, dtype, gamma_dtype=None, zero_centered=False, seed=0):
    torch.manual_seed(seed)
    gamma_dtype = gamma_dtype or dtype
    x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    gamma = 0.1 * torch.randn(hidden, device="cuda", dtype=torch.float32) + (0.0 if zero_centered else 1.0)
    dy = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    return x, gamma.to(gamma_dtype), dy


def reference(x, gamma, dy, eps, zero_centered):
    """(y, dx, dgamma) in float64 from the same low-precision inputs."""
    x64 = x.detach().double().requires_grad_()
    g64 = gamma.detach().double().requires_grad_()
    w = 1.0 + g64 if zero_centered else g64
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w
    y.backward(dy.double())
    return y.detach(), x64.grad, g64.grad


def run_turbo(x, gamma, dy, eps=EPS, zero_centered=False):
    x = x.detach().requires_grad_()
    gamma = gamma.detach().requires_grad_()
    y = turbo.ops.rmsnorm(x, gamma, eps, zero_centered)
    y.backward(dy)
    return y.detach(), x.grad, gamma.grad


def check_dx(dx, ref, dtype, hidden):
    if hidden == 1:
        # x_hat = +-1 up to eps/x^2, so dx is the cancellation residue of (1 - x_hat^2): no fp32
        # implementation resolves it to an SNR; it must only be (close to) zero.
        tol = GATES[dtype][0]
        assert torch.allclose(dx.double(), ref, rtol=tol, atol=tol)
    else:
        assert_gate(dx, ref, dtype, "dx")


@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "1+gamma"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rmsnorm_matches_float64(hidden, rows, dtype, zero_centered):
    x, gamma, dy = make_inputs(rows, hidden, dtype, zero_centered=zero_centered, seed=hidden * 7 + rows)
    poison_allocator(rows * hidden * dtype.itemsize)
    y, dx, dgamma = run_turbo(x, gamma, dy, zero_centered=zero_centered)
    ry, rdx, rdgamma = reference(x, gamma, dy, EPS, zero_centered)
    assert y.dtype == dtype and dx.dtype == dtype and dgamma.dtype == gamma.dtype
    assert_gate(y, ry, dtype, "y")
    check_dx(dx, rdx, dtype, hidden)
    assert_gate(dgamma, rdgamma, gamma.dtype, "dgamma")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("hidden", [127, 1024, 4096, 5000])
def test_float32_gamma(dtype, hidden):
    x, gamma, dy = make_inputs(777, hidden, dtype, gamma_dtype=torch.float32, seed=5)
    y, dx, dgamma = run_turbo(x, gamma, dy)
    ry, rdx, rdgamma = reference(x, gamma, dy, EPS, False)
    assert dgamma.dtype == torch.float32
    assert_gate(y, ry, dtype, "y")
    assert_gate(dx, rdx, dtype, "dx")
    assert_gate(dgamma, rdgamma, torch.float32, "dgamma")


@pytest.mark.parametrize("hidden", [1000, 65536])
def test_wide_and_unspecialized_rows(hidden):
    """65536 takes the streaming (x read twice, dgamma in the workspace) block path."""
    x, gamma, dy = make_inputs(300, hidden, torch.bfloat16, seed=6)
    y, dx, dgamma = run_turbo(x, gamma, dy)
    ry, rdx, rdgamma = reference(x, gamma, dy, EPS, False)
    assert_gate(y, ry, torch.bfloat16, "y")
    assert_gate(dx, rdx, torch.bfloat16, "dx")
    assert_gate(dgamma, rdgamma, torch.bfloat16, "dgamma")


def test_leading_dimensions_and_non_contiguous_input():
    torch.manual_seed(7)
    base = torch.randn(4, 4096, 6, device="cuda", dtype=torch.bfloat16)
    x = base.transpose(1, 2)  # [4, 6, 4096], last dimension strided
    gamma = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(4, 6, 4096, device="cuda", dtype=torch.bfloat16)
    y, dx, dgamma = run_turbo(x, gamma, dy)
    ry, rdx, rdgamma = reference(x, gamma, dy, EPS, False)
    assert y.shape == x.shape and dx.shape == x.shape
    assert_gate(y, ry, torch.bfloat16, "y")
    assert_gate(dx, rdx, torch.bfloat16, "dx")
    assert_gate(dgamma, rdgamma, torch.bfloat16, "dgamma")


def test_unaligned_pointers_take_the_scalar_path():
    torch.manual_seed(8)
    rows, hidden = 64, 4096
    storage = torch.randn(rows * hidden + 1, device="cuda", dtype=torch.bfloat16)
    x = storage[1:].view(rows, hidden)  # contiguous, 2 bytes off a 16-byte boundary
    gamma = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    y, dx, dgamma = run_turbo(x, gamma, dy)
    ry, rdx, rdgamma = reference(x, gamma, dy, EPS, False)
    assert_gate(y, ry, torch.bfloat16, "y")
    assert_gate(dx, rdx, torch.bfloat16, "dx")
    assert_gate(dgamma, rdgamma, torch.bfloat16, "dgamma")


@pytest.mark.parametrize("hidden", [128, 4096, 4097])
def test_backward_is_bitwise_deterministic(hidden):
    x, gamma, dy = make_inputs(8192, hidden, torch.bfloat16, seed=9)
    first = run_turbo(x, gamma, dy)
    second = run_turbo(x, gamma, dy)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_cuda_graph_capture_and_replay():
    x, gamma, dy = make_inputs(1024, 4096, torch.bfloat16, seed=10)
    fwd = torch.ops.primus_turbo.rmsnorm_fwd.default
    bwd = torch.ops.primus_turbo.rmsnorm_bwd.default
    y, rstd = fwd(x, gamma, EPS, False)  # warm-up: compile and load the module
    bwd(dy, x, gamma, rstd, False)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, rstd = fwd(x, gamma, EPS, False)
        dx, dgamma = bwd(dy, x, gamma, rstd, False)
    for seed in range(3):
        torch.manual_seed(100 + seed)
        x.copy_(torch.randn_like(x))
        dy.copy_(torch.randn_like(dy))
        graph.replay()
        torch.cuda.synchronize()
        ry, rdx, rdgamma = reference(x, gamma, dy, EPS, False)
        assert_gate(y, ry, torch.bfloat16, "y (replay)")
        assert_gate(dx, rdx, torch.bfloat16, "dx (replay)")
        assert_gate(dgamma, rdgamma, torch.bfloat16, "dgamma (replay)")


def test_torch_compile_fullgraph_forward_and_backward():
    x, gamma, dy = make_inputs(512, 4096, torch.bfloat16, seed=11)

    def fn(a, g):
        return turbo.ops.rmsnorm(a * 2.0, g) + 1.0

    compiled = torch.compile(fn, fullgraph=True)
    results = []
    for f in (compiled, fn):
        a, g = x.clone().requires_grad_(), gamma.clone().requires_grad_()
        out = f(a, g)
        out.backward(dy)
        results.append((out.detach(), a.grad, g.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("zero_centered", [False, True])
def test_module_matches_torch_rmsnorm(zero_centered):
    torch.manual_seed(12)
    m = turbo.modules.RMSNorm(4096, eps=1e-5, zero_centered_gamma=zero_centered, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.RMSNorm(4096, eps=1e-5, device="cuda", dtype=torch.float64)
    with torch.no_grad():
        m.weight.copy_(0.1 * torch.randn(4096, device="cuda"))
        ref.weight.copy_(m.weight.double() + (1.0 if zero_centered else 0.0))
    x = torch.randn(2, 64, 4096, device="cuda", dtype=torch.bfloat16)
    assert_gate(m(x), ref(x.double()).detach(), torch.bfloat16, "module")


# ---- rmsnorm_residual: (rmsnorm(x + residual), x + residual) -----------------------------------


def residual_reference(x, r, gamma, dy, ds, eps):
    """The unfused math: s = x + residual rounded to x's dtype, then RMSNorm in float64."""
    s = (x + r).detach()
    s64 = s.double().requires_grad_()
    g64 = gamma.detach().double().requires_grad_()
    y = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + eps) * g64
    y.backward(dy.double())
    return y.detach(), s, s64.grad + ds.double(), g64.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", [0, 3, 1000])
@pytest.mark.parametrize("hidden", [1, 127, 1024, 4096, 4097, 16384])
def test_rmsnorm_residual_matches_float64(hidden, rows, dtype):
    x, gamma, dy = make_inputs(rows, hidden, dtype, seed=hidden + rows)
    r = torch.randn_like(x)
    ds = torch.randn_like(x)
    poison_allocator(rows * hidden * dtype.itemsize)
    xa, ra, ga = x.clone().requires_grad_(), r.clone().requires_grad_(), gamma.clone().requires_grad_()
    y, s = turbo.ops.rmsnorm_residual(xa, ra, ga, EPS)
    torch.autograd.backward((y, s), (dy, ds))
    ry, rs, rdx, rdg = residual_reference(x, r, gamma, dy, ds, EPS)
    assert torch.equal(s.detach(), rs), "x + residual must match the unfused add bitwise"
    assert_gate(y.detach(), ry, dtype, "y")
    if hidden > 1:
        assert_gate(xa.grad, rdx, dtype, "dx")
        assert_gate(ra.grad, rdx, dtype, "dresidual")
    assert_gate(ga.grad, rdg, dtype, "dgamma")


def test_rmsnorm_residual_only_y_used_and_views():
    torch.manual_seed(21)
    base = torch.randn(4096, 6, 2, device="cuda", dtype=torch.bfloat16)
    x = base[:, :, 0].t()  # [6, 4096], non-contiguous
    r = torch.randn(6, 4096, device="cuda", dtype=torch.bfloat16)
    gamma = torch.randn(4096, device="cuda", dtype=torch.float32)
    dy = torch.randn(6, 4096, device="cuda", dtype=torch.bfloat16)
    xa, ra, ga = x.clone().requires_grad_(), r.clone().requires_grad_(), gamma.clone().requires_grad_()
    y, _ = turbo.ops.rmsnorm_residual(xa, ra, ga)
    y.backward(dy)
    ry, _, rdx, rdg = residual_reference(x, r, gamma, dy, torch.zeros_like(dy), EPS)
    assert_gate(y.detach(), ry, torch.bfloat16, "y")
    assert_gate(xa.grad, rdx, torch.bfloat16, "dx")
    assert_gate(ga.grad, rdg, torch.float32, "dgamma")


def test_rmsnorm_residual_graph_and_compile():
    x, gamma, dy = make_inputs(512, 2048, torch.bfloat16, seed=22)
    r = torch.randn_like(x)

    def fn(a, b, g):
        y, s = turbo.ops.rmsnorm_residual(a, b, g)
        return y * 2.0 + s

    compiled = torch.compile(fn, fullgraph=True)
    results = []
    for f in (compiled, fn):
        a, b, g = x.clone().requires_grad_(), r.clone().requires_grad_(), gamma.clone().requires_grad_()
        out = f(a, b, g)
        out.backward(dy)
        results.append((out.detach(), a.grad, b.grad, g.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)

    fwd = torch.ops.primus_turbo.rmsnorm_residual_fwd.default
    bwd = torch.ops.primus_turbo.rmsnorm_residual_bwd.default
    y, s, rstd = fwd(x, r, gamma, EPS, False)
    bwd(dy, dy, s, gamma, rstd, False)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, s, rstd = fwd(x, r, gamma, EPS, False)
        dx, dgamma = bwd(dy, None, s, gamma, rstd, False)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    ry, _, rdx, rdg = residual_reference(x, r, gamma, dy, torch.zeros_like(dy), EPS)
    assert_gate(y, ry, torch.bfloat16, "y (replay)")
    assert_gate(dx, rdx, torch.bfloat16, "dx (replay)")
    assert_gate(dgamma, rdg, torch.bfloat16, "dgamma (replay)")
