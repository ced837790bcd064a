"""turbo.ops.swiglu_fp8 / geglu_fp8 on the GPU: (q, scale_inv) bit-identical to
turbo.ops.quantize_fp8 of the unfused swiglu/geglu output, out bit-identical to the unfused op, the
dequantized output against float64 under the FP8 gate, the backward through out against float64
autograd, sizes from 8 to 40960 (cached and streaming block paths, partial last 1x128 block),
empty inputs, CUDA graphs, torch.compile(fullgraph=True), gemm_fp8 consuming the output."""

import pytest
import torch
import torch.nn.functional as F

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Format
from primus_turbo.pytorch.ops import _fp8_quant
from test_norm_fp8 import FP8_SNR, assert_bits_equal, config, dequant, unfused_quant
from turbo_test_utils import assert_gate, poison_allocator, snr_db

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# H (the output width): 2-byte rows up to 32768 and fp32 rows up to 16384 are held in registers,
# wider ones (40960) take the two-pass path; 8, 120, 1000, 1416, 2880: partial 1x128 blocks.
COLS = [8, 120, 128, 1000, 1408, 1416, 2880, 4096, 14336, 16392, 40960]
ROWS = [0, 1, 3, 700]
OPS = {
    "swiglu_fp8": (turbo.ops.swiglu, F.silu),
    "geglu_fp8": (turbo.ops.geglu, lambda g: F.gelu(g, approximate="none")),
}


def make_x(rows, cols, dtype, seed):
    torch.manual_seed(seed)
    x = torch.randn(rows, 2 * cols, device="cuda", dtype=torch.float32) * 2.0
    if rows and cols >= 64:
        x[:, cols::53] *= 6.0  # a few large "up" channels
    return x.to(dtype)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("cols", COLS)
def test_bit_exact_vs_unfused_then_quantize(cols, rows, dtype, granularity, name):
    if name == "geglu_fp8" and cols not in (120, 4096, 16392, 40960):
        pytest.skip("GeGLU shares the kernel: a few sizes suffice")
    x = make_x(rows, cols, dtype, seed=cols * 3 + rows)
    poison_allocator(rows * cols * 2)
    fused, plain = getattr(turbo.ops, name), OPS[name][0]
    q, s, out = fused(x, config=config(granularity), return_hp=True)
    out_ref = plain(x)
    q_ref, s_ref = unfused_quant(out_ref, granularity)
    assert_bits_equal(out, out_ref, "out")
    assert_bits_equal(q, q_ref, "q")
    assert_bits_equal(s, s_ref, "scale_inv")
    q2, s2 = fused(x, config=config(granularity))
    assert_bits_equal(q2, q_ref, "q (no out)")
    assert_bits_equal(s2, s_ref, "scale_inv (no out)")


@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
def test_e5m2_and_leading_dims(granularity):
    x = make_x(96, 4096, torch.bfloat16, seed=1).view(4, 24, 8192)
    q, s = turbo.ops.swiglu_fp8(x, config=config(granularity, Format.E5M2))
    q_ref, s_ref = unfused_quant(turbo.ops.swiglu(x), granularity, Format.E5M2)
    assert q.shape == (4, 24, 4096) and q.dtype == torch.float8_e5m2
    assert_bits_equal(q, q_ref, "q")
    assert_bits_equal(s, s_ref, "scale_inv")


def test_zero_input_rows_and_unaligned_input():
    x = make_x(5, 4096, torch.bfloat16, seed=2)
    x[1].zero_()
    storage = torch.empty(x.numel() + 1, device="cuda", dtype=torch.bfloat16)
    x_odd = storage[1:].view_as(x)
    x_odd.copy_(x)
    for inp in (x, x_odd):
        for granularity in ("rowwise", "blockwise"):
            q, s = turbo.ops.swiglu_fp8(inp, config=config(granularity))
            q_ref, s_ref = unfused_quant(turbo.ops.swiglu(inp), granularity)
            assert_bits_equal(q, q_ref, "q")
            assert_bits_equal(s, s_ref, "scale_inv")
            assert torch.isfinite(s).all() and (q[1].float() == 0).all()


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("fmt", [Format.E4M3, Format.E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols", [128, 1408, 4096, 40960])
def test_dequantized_output_and_backward_vs_float64(cols, dtype, granularity, fmt, name):
    x = make_x(257, cols, dtype, seed=cols + 5)
    torch.manual_seed(6)
    dy = torch.randn(257, cols, device="cuda", dtype=dtype)
    xr = x.clone().requires_grad_()
    q, s, out = getattr(turbo.ops, name)(xr, config=config(granularity, fmt), return_hp=True)
    x64 = x.double().requires_grad_()
    ref = OPS[name][1](x64[:, :cols]) * x64[:, cols:]
    snr = snr_db(dequant(q, s, granularity), ref.detach())
    assert snr >= FP8_SNR[fmt], f"dequantized output SNR {snr:.1f} dB < {FP8_SNR[fmt]} dB"
    assert_gate(out, ref.detach(), dtype, "out")
    out.backward(dy)
    ref.backward(dy.double())
    assert_gate(xr.grad, x64.grad, dtype, "dx")


def test_backward_matches_unfused_bitwise():
    x = make_x(1024, 4096, torch.bfloat16, seed=7)
    dy = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    grads = []
    for fused in (True, False):
        xr = x.clone().requires_grad_()
        out = turbo.ops.swiglu_fp8(xr, config=config("rowwise"), return_hp=True)[2] if fused else turbo.ops.swiglu(xr)
        out.backward(dy)
        grads.append(xr.grad)
    assert_bits_equal(grads[0], grads[1], "dx")


@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
def test_cuda_graph_capture_and_replay(granularity):
    x = make_x(2048, 4096, torch.bfloat16, seed=10)
    cfg = config(granularity)
    turbo.ops.swiglu_fp8(x, config=cfg)  # warm-up: compile and load the module
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = turbo.ops.swiglu_fp8(x, config=cfg)
    for seed in range(3):
        torch.manual_seed(200 + seed)
        x.copy_(torch.randn_like(x) * (seed + 1))
        graph.replay()
        torch.cuda.synchronize()
        q_ref, s_ref = unfused_quant(turbo.ops.swiglu(x), granularity)
        assert_bits_equal(q, q_ref, "q (replay)")
        assert_bits_equal(s, s_ref, "scale_inv (replay)")


def test_torch_compile_fullgraph_forward_and_backward():
    x = make_x(512, 2048, torch.bfloat16, seed=11)
    dy = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)

    def fn(a):
        q, s, out = turbo.ops.swiglu_fp8(a * 0.5, config=config("blockwise"), return_hp=True)
        return q, s, out * 3.0

    compiled = torch.compile(fn, fullgraph=True)
    results = []
    for f in (compiled, fn):
        a = x.clone().requires_grad_()
        q, s, out = f(a)
        out.backward(dy)
        results.append((q, s, out.detach(), a.grad))
    assert_bits_equal(results[0][0], results[1][0], "q")
    assert_bits_equal(results[0][1], results[1][1], "scale_inv")
    for got, want in zip(results[0][2:], results[1][2:]):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
def test_gemm_fp8_consumes_the_fused_output(granularity):
    m, k, n = 256, 1408, 512  # the down projection: K = the SwiGLU width
    x = make_x(m, k, torch.bfloat16, seed=12)
    torch.manual_seed(13)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    cfg = config(granularity)
    q, s = turbo.ops.swiglu_fp8(x, config=cfg)
    two_d = granularity == "blockwise"
    wq, ws = _fp8_quant.quantize_with_trans(w, torch.float8_e4m3fn, cfg.granularity, 128, two_d)[:2]
    fused = turbo.ops.gemm_fp8((q, s), (wq, ws), trans_b=True, out_dtype=torch.bfloat16, config=cfg)
    h = turbo.ops.swiglu(x)
    unfused = turbo.ops.gemm_fp8(h, w, trans_b=True, config=cfg)
    assert_bits_equal(fused, unfused, "gemm_fp8 output")
    assert snr_db(fused, h.double() @ w.double().t()) >= 25.0


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
@pytest.mark.parametrize("cols", [128, 1416, 40960])
def test_moe_probs_and_row_mask(cols, granularity, name):
    rows = 300
    x = make_x(rows, cols, torch.bfloat16, seed=cols + 21)
    torch.manual_seed(22)
    probs = torch.rand(rows, device="cuda")
    mask = (torch.rand(rows, device="cuda") > 0.2).to(torch.int64)
    dy = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    xr, pr = x.clone().requires_grad_(), probs.clone().requires_grad_()
    fused = getattr(turbo.ops, name + "_fp8")
    q, s, out = fused(xr, config=config(granularity), return_hp=True, probs=pr, row_mask=mask)
    xu, pu = x.clone().requires_grad_(), probs.clone().requires_grad_()
    out_ref = getattr(turbo.ops, name + "_with_probs")(xu, pu, mask)
    q_ref, s_ref = unfused_quant(out_ref.detach(), granularity)
    assert_bits_equal(out, out_ref, "out")
    assert_bits_equal(q, q_ref, "q")
    assert_bits_equal(s, s_ref, "scale_inv")
    assert (q[mask == 0].float() == 0).all()
    out.backward(dy)
    out_ref.backward(dy)
    assert_bits_equal(xr.grad, xu.grad, "dx")
    assert_bits_equal(pr.grad, pu.grad, "dprobs")


@pytest.mark.parametrize("granularity", ["rowwise", "blockwise"])
def test_gemm_fp8_training_step_on_the_fused_output_matches_unfused(granularity):
    m, k, n = 256, 1408, 512
    x = make_x(m, k, torch.bfloat16, seed=16)
    torch.manual_seed(17)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    dout = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    cfg = config(granularity)
    results = []
    for fused in (True, False):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        a = turbo.ops.swiglu_fp8(xr, config=cfg, return_hp=True) if fused else turbo.ops.swiglu(xr)
        out = turbo.ops.gemm_fp8(a, wr, trans_b=True, config=cfg)
        out.backward(dout)
        results.append((out.detach(), xr.grad, wr.grad))
    for got, want, what in zip(results[0], results[1], ("out", "dx", "dw")):
        assert_bits_equal(got, want, what)
