"""turbo.ops.gemm on the GPU: accuracy against float64 references, backward, views, graphs,
torch.compile, Megatron-style gradient accumulation and autotune."""

import warnings

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.backend import BackendType, GlobalBackendManager
from turbo_test_utils import assert_gate, poison_allocator

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]
# (M, N, K): odd sizes around tile and vector boundaries, then large ones.
SHAPES = [
    (1, 1, 1),
    (1, 4096, 1024),
    (15, 127, 129),
    (127, 129, 15),
    (129, 4095, 127),
    (4095, 15, 129),
    (256, 512, 4095),
    (2048, 1024, 512),
    (4096, 4096, 4096),
]
BACKENDS = [None, BackendType.CUBLASLT, BackendType.CUTLASS]


def make_operands(m, n, k, dtype, trans_a, trans_b, requires_grad=False):
    """Fresh random operands scaled so outputs are O(1) whatever K is."""
    a = torch.randn((k, m) if trans_a else (m, k), device="cuda", dtype=dtype)
    b = torch.randn((n, k) if trans_b else (k, n), device="cuda", dtype=dtype) / k**0.5
    return a.requires_grad_(requires_grad), b.requires_grad_(requires_grad)


def reference(a, b, trans_a, trans_b):
    a64, b64 = a.detach().double(), b.detach().double()
    return (a64.t() if trans_a else a64) @ (b64.t() if trans_b else b64)


def force_backend(backend):
    if backend is not None:
        GlobalBackendManager.set_gemm_backend(backend)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name if b else "default")
@pytest.mark.parametrize("trans", TRANSPOSES, ids=lambda t: f"ta{int(t[0])}tb{int(t[1])}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_forward_matches_float64(shape, dtype, trans, backend):
    m, n, k = shape
    torch.manual_seed(hash((shape, trans)) % 2**31)
    force_backend(backend)
    a, b = make_operands(m, n, k, dtype, *trans)
    poison_allocator(m * n * dtype.itemsize)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CUTLASS forced on unaligned shapes falls back, warned
        out = turbo.ops.gemm(a, b, trans_a=trans[0], trans_b=trans[1])
    assert out.dtype == dtype and out.shape == (m, n)
    assert_gate(out, reference(a, b, *trans), dtype)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name if b else "default")
@pytest.mark.parametrize("trans", TRANSPOSES, ids=lambda t: f"ta{int(t[0])}tb{int(t[1])}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(129, 4095, 127), (1024, 2048, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_gemm_backward_matches_autograd(shape, dtype, trans, backend):
    m, n, k = shape
    torch.manual_seed(1)
    force_backend(backend)
    a, b = make_operands(m, n, k, dtype, *trans, requires_grad=True)
    grad_out = torch.randn(m, n, device="cuda", dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = turbo.ops.gemm(a, b, trans_a=trans[0], trans_b=trans[1])
        out.backward(grad_out)
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    ref = (a64.t() if trans[0] else a64) @ (b64.t() if trans[1] else b64)
    ref.backward(grad_out.double())
    assert_gate(a.grad, a64.grad, dtype, "grad_a")
    assert_gate(b.grad, b64.grad, dtype, "grad_b")


def test_gemm_out_dtype_float32_from_bf16():
    a, b = make_operands(256, 384, 512, torch.bfloat16, False, True)
    for backend in (BackendType.CUBLASLT, BackendType.CUTLASS):
        GlobalBackendManager.set_gemm_backend(backend)
        out = turbo.ops.gemm(a, b, trans_b=True, out_dtype=torch.float32)
        assert out.dtype == torch.float32
        ref = reference(a, b, False, True)
        assert torch.allclose(out.double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("view", ["slice_lead_dim", "transposed_view", "no_unit_stride", "offset_storage"])
def test_gemm_accepts_views(view):
    torch.manual_seed(2)
    m, n, k = 256, 320, 192
    if view == "slice_lead_dim":
        a = torch.randn(m, k + 64, device="cuda", dtype=torch.bfloat16)[:, :k]
        b = torch.randn(k, n + 8, device="cuda", dtype=torch.bfloat16)[:, :n]
    elif view == "transposed_view":
        a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t()
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    elif view == "no_unit_stride":
        a = torch.randn(2 * m, 2 * k, device="cuda", dtype=torch.bfloat16)[::2, ::2]
        b = torch.randn(2 * k, 2 * n, device="cuda", dtype=torch.bfloat16)[::2, ::2]
    else:
        a = torch.randn(m * k + 3, device="cuda", dtype=torch.bfloat16)[3:].view(m, k)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    b = b / k**0.5
    for backend in BACKENDS:
        GlobalBackendManager.reset()
        force_backend(backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = turbo.ops.gemm(a, b)
        assert_gate(out, a.double() @ b.double(), torch.bfloat16, f"{view} on {backend}")


@pytest.mark.parametrize("m,n,k", [(0, 64, 32), (64, 0, 32), (64, 32, 0), (0, 0, 0)])
def test_gemm_zero_size(m, n, k):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    poison_allocator(max(m * n * 2, 1))
    out = turbo.ops.gemm(a, b)
    assert out.shape == (m, n)
    assert (out == 0).all()  # k == 0: the empty sum
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


def test_cutlass_forced_on_unaligned_shape_warns_and_falls_back():
    GlobalBackendManager.set_gemm_backend(BackendType.CUTLASS)
    a, b = make_operands(33, 17, 15, torch.bfloat16, False, False)
    with pytest.warns(UserWarning, match="CUTLASS"):
        out = turbo.ops.gemm(a, b)
    assert_gate(out, reference(a, b, False, False), torch.bfloat16)


def test_gemm_cuda_graph_capture_and_replay():
    torch.manual_seed(3)
    a, b = make_operands(512, 768, 1024, torch.bfloat16, False, True)
    for backend in (BackendType.CUBLASLT, BackendType.CUTLASS):
        GlobalBackendManager.set_gemm_backend(backend)
        turbo.ops.gemm(a, b, trans_b=True)  # warm-up: compile, heuristics
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = turbo.ops.gemm(a, b, trans_b=True)
        for _ in range(3):
            a.copy_(torch.randn_like(a))
            b.copy_(torch.randn_like(b) / 1024**0.5)
            graph.replay()
            torch.cuda.synchronize()
            assert_gate(out, reference(a, b, False, True), torch.bfloat16, f"replay on {backend.name}")


def test_gemm_torch_compile_fullgraph_forward_and_backward():
    torch.manual_seed(4)
    a, b = make_operands(256, 512, 384, torch.bfloat16, False, True, requires_grad=True)

    def fn(x, w):
        return torch.nn.functional.gelu(turbo.ops.gemm(x, w, trans_b=True)) * 2.0

    compiled = torch.compile(fn, fullgraph=True)
    out = compiled(a, b)
    out.float().sum().backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    ref = fn(a, b)
    ref.float().sum().backward()
    assert_gate(out, ref.detach(), torch.bfloat16)
    assert_gate(ga, a.grad, torch.bfloat16, "grad_a")
    assert_gate(gb, b.grad, torch.bfloat16, "grad_b")


@pytest.mark.parametrize("main_grad_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", [BackendType.CUBLASLT, BackendType.CUTLASS])
def test_megatron_wgrad_accumulates_into_main_grad(main_grad_dtype, backend):
    torch.manual_seed(5)
    GlobalBackendManager.set_gemm_backend(backend)
    x, w = make_operands(384, 256, 512, torch.bfloat16, False, True, requires_grad=True)
    w.main_grad = torch.randn(w.shape, device="cuda", dtype=main_grad_dtype)
    w.grad_added_to_main_grad = False
    before = w.main_grad.clone()
    grad_out = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16)
    out = turbo.ops.gemm(x, w, trans_b=True, fuse_bgrad_accum_pattern="megatron")
    out.backward(grad_out)
    assert w.grad_added_to_main_grad is True
    expected = before.double() + grad_out.double().t() @ x.detach().double()
    tol = 1e-4 if main_grad_dtype == torch.float32 else 2e-2
    assert torch.allclose(w.main_grad.double(), expected, rtol=tol, atol=tol)


def test_autotune_picks_persists_and_accumulates_once(tmp_path, monkeypatch):
    cache = tmp_path / "tune.tsv"
    monkeypatch.setenv("PRIMUS_TURBO_AUTOTUNE_CACHE_FILE", str(cache))
    GlobalBackendManager.set_auto_tune(True)
    torch.manual_seed(6)
    a, b = make_operands(1024, 1024, 1024, torch.bfloat16, False, True)
    out = turbo.ops.gemm(a, b, trans_b=True)
    assert_gate(out, reference(a, b, False, True), torch.bfloat16)
    text = cache.read_text()
    assert "GEMM|" in text and "1024x1024x1024" in text
    # Tuning an accumulating problem must add into the caller's buffer exactly once.
    x, w = make_operands(256, 256, 256, torch.bfloat16, False, True, requires_grad=True)
    w.main_grad = torch.zeros(w.shape, device="cuda", dtype=torch.float32)
    grad_out = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    turbo.ops.gemm(x, w, trans_b=True, fuse_bgrad_accum_pattern="megatron").backward(grad_out)
    expected = grad_out.double().t() @ x.detach().double()
    assert torch.allclose(w.main_grad.double(), expected, rtol=1e-4, atol=1e-4)


def test_env_backend_is_used(monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_GEMM_BACKEND", "bf16:CK")  # CK is the AMD name for CUTLASS
    a, b = make_operands(256, 256, 256, torch.bfloat16, False, True)
    assert GlobalBackendManager.get_gemm_backend("bf16").backend == BackendType.CUTLASS
    out = turbo.ops.gemm(a, b, trans_b=True)
    assert_gate(out, reference(a, b, False, True), torch.bfloat16)


@pytest.mark.parametrize("backend", [BackendType.CUBLASLT, BackendType.CUTLASS])
def test_gemm_on_a_fresh_thread(backend):
    """A thread that never touched CUDA (like autograd's worker) has no context bound; the first
    GEMM there must still work (CUTLASS encodes TMA descriptors through the driver API)."""
    import threading

    GlobalBackendManager.set_gemm_backend(backend)
    a, b = make_operands(256, 256, 256, torch.bfloat16, True, False)
    result = {}

    def work():
        try:
            result["out"] = turbo.ops.gemm(a, b, trans_a=True)
            torch.cuda.synchronize()
        except Exception as e:  # surfaced below with its message
            result["error"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in result, result.get("error")
    assert_gate(result["out"], reference(a, b, True, False), torch.bfloat16)
