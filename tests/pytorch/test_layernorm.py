"""turbo.ops.layernorm and turbo.modules.LayerNorm on the GPU: forward, dx, dgamma and dbeta
against float64 references under the gates of ACCURACY.md, odd sizes and empty inputs, views,
determinism, CUDA graphs, torch.compile and the module against torch.nn.LayerNorm."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from turbo_test_utils import GATES, assert_gate, poison_allocator

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
HIDDEN = [1, 127, 128, 1024, 4096, 4097, 7168, 16384, 20000]
ROWS = [0, 1, 3, 1000, 8192]
EPS = 1e-5


def make_inputs(rows, hidden, dtype, param_dtype=None, seed=0):
    torch.manual_seed(seed)
    param_dtype = param_dtype or dtype
    # A non-zero mean per row exercises the centring (and the two-pass variance).
    x = (torch.randn(rows, hidden, device="cuda") + 3.0 * torch.randn(rows, 1, device="cuda")).to(dtype)
    gamma = (1.0 + 0.1 * torch.randn(hidden, device="cuda")).to(param_dtype)
    beta = (0.1 * torch.randn(hidden, device="cuda")).to(param_dtype)
    dy = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    return x, gamma, beta, dy


def reference(x, gamma, beta, dy, eps=EPS):
    x64 = x.detach().double().requires_grad_()
    g64 = gamma.detach().double().requires_grad_()
    b64 = beta.detach().double().requires_grad_()
    y = torch.nn.functional.layer_norm(x64, x64.shape[-1:], g64, b64, eps)
    y.backward(dy.double())
    return y.detach(), x64.grad, g64.grad, b64.grad


def run_turbo(x, gamma, beta, dy, eps=EPS):
    x, gamma, beta = (t.detach().requires_grad_() for t in (x, gamma, beta))
    y = turbo.ops.layernorm(x, gamma, beta, eps)
    y.backward(dy)
    return y.detach(), x.grad, gamma.grad, beta.grad


def check_all(got, ref, dtype, param_dtype, hidden):
    y, dx, dg, db = got
    ry, rdx, rdg, rdb = ref
    assert_gate(y, ry, dtype, "y")
    if hidden > 1:  # hidden 1: x_hat is 0 and dx the residue of a cancellation, only near zero
        assert_gate(dx, rdx, dtype, "dx")
        assert_gate(dg, rdg, param_dtype, "dgamma")
    else:  # and dgamma = sum of dy * 0
        assert torch.allclose(dx.double(), rdx, atol=GATES[dtype][0], rtol=GATES[dtype][0])
        assert torch.allclose(dg.double(), rdg, atol=GATES[param_dtype][0], rtol=GATES[param_dtype][0])
    assert_gate(db, rdb, param_dtype, "dbeta")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_layernorm_matches_float64(hidden, rows, dtype):
    x, gamma, beta, dy = make_inputs(rows, hidden, dtype, seed=hidden * 3 + rows)
    poison_allocator(rows * hidden * dtype.itemsize)
    got = run_turbo(x, gamma, beta, dy)
    assert got[0].dtype == dtype and got[1].dtype == dtype and got[2].dtype == dtype
    check_all(got, reference(x, gamma, beta, dy), dtype, dtype, hidden)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("hidden", [127, 1024, 4096, 5000])
def test_float32_parameters(dtype, hidden):
    x, gamma, beta, dy = make_inputs(777, hidden, dtype, param_dtype=torch.float32, seed=5)
    got = run_turbo(x, gamma, beta, dy)
    assert got[2].dtype == torch.float32 and got[3].dtype == torch.float32
    check_all(got, reference(x, gamma, beta, dy), dtype, torch.float32, hidden)


def test_wide_rows_and_views_and_unaligned():
    x, gamma, beta, dy = make_inputs(64, 65536, torch.bfloat16, seed=6)
    check_all(run_turbo(x, gamma, beta, dy), reference(x, gamma, beta, dy), torch.bfloat16, torch.bfloat16, 65536)
    torch.manual_seed(7)
    base = torch.randn(4, 4096, 6, device="cuda", dtype=torch.bfloat16)
    xv = base.transpose(1, 2)  # last dimension strided
    _, gamma, beta, _ = make_inputs(1, 4096, torch.bfloat16, seed=7)
    dyv = torch.randn(4, 6, 4096, device="cuda", dtype=torch.bfloat16)
    check_all(run_turbo(xv, gamma, beta, dyv), reference(xv, gamma, beta, dyv), torch.bfloat16, torch.bfloat16, 4096)
    storage = torch.randn(64 * 4096 + 1, device="cuda", dtype=torch.bfloat16)
    xu = storage[1:].view(64, 4096)  # 2 bytes off a 16-byte boundary: the scalar path
    dyu = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    check_all(run_turbo(xu, gamma, beta, dyu), reference(xu, gamma, beta, dyu), torch.bfloat16, torch.bfloat16, 4096)


@pytest.mark.parametrize("hidden", [128, 4096, 4097])
def test_backward_is_bitwise_deterministic(hidden):
    x, gamma, beta, dy = make_inputs(8192, hidden, torch.bfloat16, seed=9)
    first, second = run_turbo(x, gamma, beta, dy), run_turbo(x, gamma, beta, dy)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_cuda_graph_capture_and_replay():
    x, gamma, beta, dy = make_inputs(1024, 4096, torch.bfloat16, seed=10)
    fwd = torch.ops.primus_turbo.layernorm_fwd.default
    bwd = torch.ops.primus_turbo.layernorm_bwd.default
    y, mean, rstd = fwd(x, gamma, beta, EPS)
    bwd(dy, x, gamma, mean, rstd)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, mean, rstd = fwd(x, gamma, beta, EPS)
        dx, dgamma, dbeta = bwd(dy, x, gamma, mean, rstd)
    for seed in range(2):
        torch.manual_seed(100 + seed)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        check_all((y, dx, dgamma, dbeta), reference(x, gamma, beta, dy), torch.bfloat16, torch.bfloat16, 4096)


def test_torch_compile_fullgraph_forward_and_backward():
    x, gamma, beta, dy = make_inputs(512, 4096, torch.bfloat16, seed=11)

    def fn(a, g, b):
        return turbo.ops.layernorm(a * 2.0, g, b) + 1.0

    compiled = torch.compile(fn, fullgraph=True)
    results = []
    for f in (compiled, fn):
        a, g, b = (t.clone().requires_grad_() for t in (x, gamma, beta))
        out = f(a, g, b)
        out.backward(dy)
        results.append((out.detach(), a.grad, g.grad, b.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_module_matches_torch_layernorm(affine, bias, dtype):
    torch.manual_seed(12)
    shape = (4, 1024)
    m = turbo.modules.LayerNorm(shape, eps=1e-5, elementwise_affine=affine, bias=bias, device="cuda", dtype=dtype)
    ref = torch.nn.LayerNorm(shape, eps=1e-5, elementwise_affine=affine, bias=bias, device="cuda", dtype=torch.float64)
    with torch.no_grad():
        if affine:
            m.weight.copy_(1.0 + 0.1 * torch.randn(shape, device="cuda"))
            ref.weight.copy_(m.weight.double())
        if bias:
            m.bias.copy_(0.1 * torch.randn(shape, device="cuda"))
            ref.bias.copy_(m.bias.double())
    x = torch.randn(2, 3, *shape, device="cuda", dtype=dtype, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    dy = torch.randn_like(x)
    y, ry = m(x), ref(x64)
    y.backward(dy)
    ry.backward(dy.double())
    assert_gate(y.detach(), ry.detach(), dtype, "module y")
    assert_gate(x.grad, x64.grad, dtype, "module dx")
    if affine:
        assert_gate(m.weight.grad, ref.weight.grad, dtype, "module dweight")
    if bias:
        assert_gate(m.bias.grad, ref.bias.grad, dtype, "module dbias")
