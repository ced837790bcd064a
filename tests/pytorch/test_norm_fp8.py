"""turbo.ops.rmsnorm_fp8 / rmsnorm_residual_fp8 on the GPU.

The contract: (q, scale_inv) is bit-identical to turbo.ops.quantize_fp8 of the unfused rmsnorm
output (quantization of the output rounded to x's dtype), y bit-identical to turbo.ops.rmsnorm.
Also: the dequantized output against a float64 reference under the FP8 gate of ACCURACY.md, the
backward through y against float64 autograd, model and odd hidden sizes 128..65536 (warp, cached
block and streaming block paths, partial last 1x128 block), empty inputs, views, CUDA graphs,
torch.compile(fullgraph=True), and gemm_fp8 consuming the output."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity
from primus_turbo.pytorch.ops import _fp8_quant
from turbo_test_utils import assert_gate, poison_allocator, snr_db

pytestmark = pytest.mark.gpu

EPS = 1e-6
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# 1024: last warp-path size; 16384 (2-byte) / 8192 (fp32): last register-cached block size; above:
# streaming. 1000, 2880, 4104, 16392: partial last 1x128 block. 65536: the maximum.
HIDDEN = [128, 136, 1000, 1024, 2880, 4096, 4104, 5120, 7168, 8192, 16384, 16392, 65536]
ROWS = [0, 1, 3, 1000]
FMT = {Format.E4M3: torch.float8_e4m3fn, Format.E5M2: torch.float8_e5m2}
FP8_SNR = {Format.E4M3: 25.0, Format.E5M2: 20.0}  # ACCURACY.md


def config(granularity: str, fmt=Format.E4M3) -> Float8QuantConfig:
    if granularity == "rowwise":
        return Float8QuantConfig(format=fmt, granularity=ScalingGranularity.ROWWISE)
    return Float8QuantConfig(format=fmt, granularity=ScalingGranularity.BLOCKWISE, block_size=128)


def unfused_quant(y, granularity: str, fmt=Format.E4M3):
    g = ScalingGranularity.ROWWISE if granularity == "rowwise" else ScalingGranularity.BLOCKWISE
    block = None if granularity == "rowwise" else 128
    return turbo.ops.quantize_fp8(y, FMT[fmt], g, block_size=block, axis=-1)


def dequant(q, s, granularity: str):
    rows, hidden = q.numel() // q.shape[-1], q.shape[-1]
    qf = q.reshape(rows, hidden).double()
    if granularity == "rowwise":
        return (qf * s.double().reshape(rows, 1)).reshape(q.shape)
    rep = s.double().repeat_interleave(128, dim=1)[:, :hidden]
    return (qf * rep).reshape(q.shape)


def make_inputs(rows, hidden, dtype, seed, gamma_dtype=None, outliers=True):
    torch.manual_seed(seed)
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.float32)
    if outliers and rows and hidden >= 64:
        x[:, ::61] *= 8.0  # a few large channels: per-block scales differ from the row scale
    gamma = 1.0 + 0.2 * torch.randn(hidden, device="cuda", dtype=torch.float32)
    dy = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    return x.to(dtype), gamma.to(gamma_dtype or dtype), dy


def reference(x, gamma, eps=EPS, zero_centered=False):
    x64 = x.detach().double().requires_grad_()
    g64 = gamma.detach().double().requires_grad_()
    w = 1.0 + g64 if zero_centered else g64
    return x64, g64, x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w


def assert_bits_equal(got, want, what):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if got.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        raise AssertionError(f"{what}: {bad.shape[0]} elements differ, first at {bad[0].tolist()}")


# ---- bit-exact against the unfused chain --------------------------------------------------------


@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_bit_exact_vs_rmsnorm_then_quantize(hidden, rows, dtype, granularity):
    x, gamma, _ = make_inputs(rows, hidden, dtype, seed=hidden * 13 + rows)
    poison_allocator(rows * hidden * 2)
    cfg = config(granularity)
    q, s, y = turbo.ops.rmsnorm_fp8(x, gamma, EPS, config=cfg, return_hp=True)
    y_ref = turbo.ops.rmsnorm(x, gamma, EPS)
    q_ref, s_ref = unfused_quant(y_ref, granularity)
    assert_bits_equal(y, y_ref, "y")
    assert_bits_equal(q, q_ref, "q")
    assert_bits_equal(s, s_ref, "scale_inv")
    q2, s2 = turbo.ops.rmsnorm_fp8(x, gamma, EPS, config=cfg)  # without y: the same bits
    assert_bits_equal(q2, q_ref, "q (no y)")
    assert_bits_equal(s2, s_ref, "scale_inv (no y)")


@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
@pytest.mark.parametrize("hidden", [1000, 4096, 16392])
def test_e5m2_zero_centered_and_float32_gamma(hidden, granularity):
    x, gamma, _ = make_inputs(257, hidden, torch.bfloat16, seed=3, gamma_dtype=torch.float32)
    cfg = config(granularity, Format.E5M2)
    q, s = turbo.ops.rmsnorm_fp8(x, gamma, 1e-5, zero_centered=True, config=cfg)
    q_ref, s_ref = unfused_quant(turbo.ops.rmsnorm(x, gamma, 1e-5, zero_centered=True), granularity, Format.E5M2)
    assert q.dtype == torch.float8_e5m2
    assert_bits_equal(q, q_ref, "q")
    assert_bits_equal(s, s_ref, "scale_inv")


def test_hybrid_format_is_e4m3_and_default_is_rowwise():
    x, gamma, _ = make_inputs(64, 4096, torch.bfloat16, seed=4)
    hybrid = Float8QuantConfig(format=Format.HYBRID, granularity=ScalingGranularity.ROWWISE)
    q, s = turbo.ops.rmsnorm_fp8(x, gamma, config=hybrid)
    q0, s0 = turbo.ops.rmsnorm_fp8(x, gamma)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 1)
    assert_bits_equal(q, q0, "q")
    assert_bits_equal(s, s0, "scale_inv")


def test_zero_rows_and_a_zero_row():
    x, gamma, _ = make_inputs(4, 4096, torch.bfloat16, seed=5)
    x[2].zero_()
    for granularity in ("rowwise", "blockwise"):
        q, s = turbo.ops.rmsnorm_fp8(x, gamma, config=config(granularity))
        q_ref, s_ref = unfused_quant(turbo.ops.rmsnorm(x, gamma), granularity)
        assert_bits_equal(q, q_ref, "q")
        assert_bits_equal(s, s_ref, "scale_inv")
        assert torch.isfinite(s).all() and (q[2].float() == 0).all()
    q, s = turbo.ops.rmsnorm_fp8(x[:0], gamma, config=config("blockwise"))
    assert q.shape == (0, 4096) and s.shape == (0, 32)


def test_views_leading_dims_and_unaligned_input():
    torch.manual_seed(6)
    base = torch.randn(2, 4096, 6, device="cuda", dtype=torch.bfloat16)
    x = base.transpose(1, 2)  # [2, 6, 4096], strided
    gamma = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    storage = torch.randn(12 * 4096 + 1, device="cuda", dtype=torch.bfloat16)
    x_odd = storage[1:].view(2, 6, 4096)  # contiguous, 2 bytes off a 16-byte boundary
    for inp in (x, x_odd):
        q, s = turbo.ops.rmsnorm_fp8(inp, gamma, config=config("blockwise"))
        q_ref, s_ref = unfused_quant(turbo.ops.rmsnorm(inp, gamma), "blockwise")
        assert q.shape == (2, 6, 4096) and s.shape == (2, 6, 32)
        assert_bits_equal(q, q_ref, "q")
        assert_bits_equal(s, s_ref, "scale_inv")


# ---- accuracy and backward ----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [Format.E4M3, Format.E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [128, 1000, 4096, 7168, 16392])
def test_dequantized_output_and_backward_vs_float64(hidden, dtype, granularity, fmt):
    x, gamma, dy = make_inputs(333, hidden, dtype, seed=hidden + 1)
    xr = x.clone().requires_grad_()
    gr = gamma.clone().requires_grad_()
    q, s, y = turbo.ops.rmsnorm_fp8(xr, gr, EPS, config=config(granularity, fmt), return_hp=True)
    x64, g64, y64 = reference(x, gamma)
    snr = snr_db(dequant(q, s, granularity), y64.detach())
    assert snr >= FP8_SNR[fmt], f"dequantized output SNR {snr:.1f} dB < {FP8_SNR[fmt]} dB"
    assert_gate(y, y64.detach(), dtype, "y")
    y.backward(dy)
    y64.backward(dy.double())
    assert_gate(xr.grad, x64.grad, dtype, "dx")
    assert_gate(gr.grad, g64.grad, dtype, "dgamma")


def test_backward_matches_unfused_rmsnorm_bitwise():
    x, gamma, dy = make_inputs(2048, 4096, torch.bfloat16, seed=7)
    grads = []
    for fused in (True, False):
        xr, gr = x.clone().requires_grad_(), gamma.clone().requires_grad_()
        if fused:
            y = turbo.ops.rmsnorm_fp8(xr, gr, config=config("blockwise"), return_hp=True)[2]
        else:
            y = turbo.ops.rmsnorm(xr, gr)
        y.backward(dy)
        grads.append((xr.grad, gr.grad))
    assert_bits_equal(grads[0][0], grads[1][0], "dx")
    assert_bits_equal(grads[0][1], grads[1][1], "dgamma")


@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
@pytest.mark.parametrize("hidden", [128, 4096, 4104, 16392])
def test_residual_variant_bit_exact_and_backward(hidden, granularity):
    x, gamma, dy = make_inputs(500, hidden, torch.bfloat16, seed=8)
    torch.manual_seed(9)
    r = torch.randn_like(x)
    ds = torch.randn_like(x)
    xr, rr, gr = x.clone().requires_grad_(), r.clone().requires_grad_(), gamma.clone().requires_grad_()
    q, sc, y, s = turbo.ops.rmsnorm_residual_fp8(xr, rr, gr, config=config(granularity), return_hp=True)
    xu, ru, gu = x.clone().requires_grad_(), r.clone().requires_grad_(), gamma.clone().requires_grad_()
    y_ref, s_ref = turbo.ops.rmsnorm_residual(xu, ru, gu)
    q_ref, sc_ref = unfused_quant(y_ref.detach(), granularity)
    assert_bits_equal(y, y_ref, "y")
    assert_bits_equal(s, s_ref, "x + residual")
    assert_bits_equal(q, q_ref, "q")
    assert_bits_equal(sc, sc_ref, "scale_inv")
    torch.autograd.backward([y, s], [dy, ds])  # one pass: both outputs come from one node
    torch.autograd.backward([y_ref, s_ref], [dy, ds])
    for got, want, what in ((xr.grad, xu.grad, "dx"), (rr.grad, ru.grad, "dresidual"), (gr.grad, gu.grad, "dgamma")):
        assert_bits_equal(got, want, what)


# ---- CUDA graphs, torch.compile -----------------------------------------------------------------


@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
def test_cuda_graph_capture_and_replay(granularity):
    x, gamma, _ = make_inputs(1024, 4096, torch.bfloat16, seed=10)
    cfg = config(granularity)
    turbo.ops.rmsnorm_fp8(x, gamma, config=cfg, return_hp=True)  # warm-up: compile and load the module
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s, y = turbo.ops.rmsnorm_fp8(x, gamma, config=cfg, return_hp=True)
    for seed in range(3):
        torch.manual_seed(100 + seed)
        x.copy_(torch.randn_like(x) * (seed + 1))
        graph.replay()
        torch.cuda.synchronize()
        q_ref, s_ref = unfused_quant(turbo.ops.rmsnorm(x, gamma), granularity)
        assert_bits_equal(q, q_ref, "q (replay)")
        assert_bits_equal(s, s_ref, "scale_inv (replay)")


def test_torch_compile_fullgraph_forward_and_backward():
    x, gamma, dy = make_inputs(512, 4096, torch.bfloat16, seed=11)

    def fn(a, g):
        q, s, y = turbo.ops.rmsnorm_fp8(a * 2.0, g, config=config("blockwise"), return_hp=True)
        return q, s, y + 1.0

    compiled = torch.compile(fn, fullgraph=True)
    results = []
    for f in (compiled, fn):
        a, g = x.clone().requires_grad_(), gamma.clone().requires_grad_()
        q, s, out = f(a, g)
        out.backward(dy)
        results.append((q, s, out.detach(), a.grad, g.grad))
    assert_bits_equal(results[0][0], results[1][0], "q")
    assert_bits_equal(results[0][1], results[1][1], "scale_inv")
    for got, want in zip(results[0][2:], results[1][2:]):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


# ---- gemm_fp8 consumes the output -----------------------------------------------------------------


@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
@pytest.mark.parametrize("m,k,n", [(256, 4096, 512), (128, 1040, 272)])
def test_gemm_fp8_consumes_the_fused_output(m, k, n, granularity):
    x, gamma, _ = make_inputs(m, k, torch.bfloat16, seed=12)
    torch.manual_seed(13)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    cfg = config(granularity)
    q, s = turbo.ops.rmsnorm_fp8(x, gamma, config=cfg)
    # The weight quantized exactly as gemm_fp8 quantizes it (128x128 blocks for BLOCKWISE).
    two_d = granularity == "blockwise"
    wq, ws = _fp8_quant.quantize_with_trans(w, torch.float8_e4m3fn, cfg.granularity, 128, two_d)[:2]
    fused = turbo.ops.gemm_fp8((q, s), (wq, ws), trans_b=True, out_dtype=torch.bfloat16, config=cfg)
    y = turbo.ops.rmsnorm(x, gamma)
    unfused = turbo.ops.gemm_fp8(y, w, trans_b=True, config=cfg)
    assert_bits_equal(fused, unfused, "gemm_fp8 output")
    ref = y.double() @ w.double().t()
    assert snr_db(fused, ref) >= 25.0


@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
def test_gemm_fp8_training_step_on_the_fused_output_matches_unfused(granularity):
    """gemm_fp8(a=(q, scale_inv, y)): forward reads q; dgrad flows to y and into the rmsnorm
    backward; wgrad uses y quantized along M. Bit-identical to gemm_fp8(rmsnorm(x), w)."""
    from primus_turbo.pytorch.ops.gemm_fp8 import _quantize_col

    m, k, n = 256, 4096, 512
    x, gamma, _ = make_inputs(m, k, torch.bfloat16, seed=14)
    torch.manual_seed(15)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    dout = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    cfg = config(granularity)
    y = turbo.ops.rmsnorm(x, gamma)
    # The column copy quantized alone equals the one quantize_with_trans gives (the unfused path's).
    q_col, s_col = _quantize_col(y, torch.float8_e4m3fn, cfg.granularity)
    ref_col = _fp8_quant.quantize_with_trans(y, torch.float8_e4m3fn, cfg.granularity, 128, False)[2:]
    assert_bits_equal(q_col, ref_col[0], "column copy")
    assert_bits_equal(s_col, ref_col[1], "column scales")
    results = []
    for fused in (True, False):
        xr, gr, wr = x.clone().requires_grad_(), gamma.clone().requires_grad_(), w.clone().requires_grad_()
        if fused:
            a = turbo.ops.rmsnorm_fp8(xr, gr, config=cfg, return_hp=True)
        else:
            a = turbo.ops.rmsnorm(xr, gr)
        out = turbo.ops.gemm_fp8(a, wr, trans_b=True, config=cfg)
        out.backward(dout)
        results.append((out.detach(), xr.grad, gr.grad, wr.grad))
    for got, want, what in zip(results[0], results[1], ("out", "dx", "dgamma", "dw")):
        assert_bits_equal(got, want, what)
