"""turbo.ops.swiglu_mlp_fp8 on the GPU. The fused TENSORWISE path (the SwiGLU kernels' amax handed
to the quantizations after them) gives the unfused chain's output and gradients bit for bit
(gemm_fp8, swiglu, gemm_fp8: the same kernels after the same scales), and both sit at the FP8
gate against float64; the reported amaxes equal a pass over the rounded tensors. Also: the
unfused fallback (ROWWISE, unaligned sizes), CUDA-graph capture, torch.compile(fullgraph=True)."""

import sys

import pytest
import torch
import torch.nn.functional as F

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format
from primus_turbo.pytorch.core.low_precision import ScalingGranularity as G
from primus_turbo.pytorch.ops.swiglu_mlp_fp8 import _swiglu_bwd, _swiglu_fwd
from turbo_test_utils import capture_graph, poison_allocator, snr_db

pytestmark = pytest.mark.gpu

FP8_SNR = 20.0  # dB: the output and each gradient against float64 (two FP8 GEMMs in a row)
TENSORWISE = [Float8QuantConfig(granularity=G.TENSORWISE), Float8QuantConfig(format=Format.HYBRID, granularity=G.TENSORWISE),
              Float8QuantConfig(format=Format.HYBRID, granularity=G.TENSORWISE, fast_accum=True)]
TENSORWISE_IDS = ["e4m3", "hybrid", "hybrid_fast_accum"]


def make(m, hidden, inter, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    x = (torch.randn(m, hidden, device="cuda") * 2).to(dtype).requires_grad_()
    wgu = (torch.randn(2 * inter, hidden, device="cuda") * hidden**-0.5).to(dtype).requires_grad_()
    wd = (torch.randn(hidden, inter, device="cuda") * inter**-0.5).to(dtype).requires_grad_()
    return x, wgu, wd


def unfused(x, wgu, wd, config):
    h = turbo.ops.gemm_fp8(x, wgu, trans_b=True, config=config)
    return turbo.ops.gemm_fp8(turbo.ops.swiglu(h), wd, trans_b=True, config=config)


def reference(x, wgu, wd):
    x, wgu, wd = (t.detach().double().requires_grad_() for t in (x, wgu, wd))
    gate, up = (x @ wgu.t()).chunk(2, -1)
    return x, wgu, wd, (F.silu(gate) * up) @ wd.t()


def run(fn, x, wgu, wd, dy):
    y = fn(x, wgu, wd)
    grads = torch.autograd.grad(y, (x, wgu, wd), dy)
    # Detached: a kept graph would keep the leaves' gradient accumulators bound to this call's
    # stream, and a later capture on another stream would have to wait on it (capture error).
    return (y.detach(), *grads)


@pytest.mark.parametrize("config", TENSORWISE, ids=TENSORWISE_IDS)
@pytest.mark.parametrize("m,hidden,inter", [(256, 512, 768), (48, 256, 1408), (4096, 1024, 2816)])
def test_fused_matches_the_unfused_chain_bitwise_and_float64(config, m, hidden, inter):
    x, wgu, wd = make(m, hidden, inter)
    dy = torch.randn(m, hidden, device="cuda").to(x.dtype)
    poison_allocator(m * hidden * 2)
    fused = run(lambda *a: turbo.ops.swiglu_mlp_fp8(*a, config=config), x, wgu, wd, dy)
    chain = run(lambda *a: unfused(*a, config), x, wgu, wd, dy)
    for name, a, b in zip(("out", "dx", "dw_gate_up", "dw_down"), fused, chain):
        assert torch.equal(a, b), f"{name} differs from the unfused chain"
    xr, wgur, wdr, yr = reference(x, wgu, wd)
    ref = (yr, *torch.autograd.grad(yr, (xr, wgur, wdr), dy.double()))
    for name, a, r in zip(("out", "dx", "dw_gate_up", "dw_down"), fused, ref):
        assert snr_db(a.double(), r) >= FP8_SNR, f"{name}: {snr_db(a.double(), r):.1f} dB"


@pytest.mark.parametrize("config", TENSORWISE, ids=TENSORWISE_IDS)
@pytest.mark.parametrize("amax_from_optimizer", [False, True])
def test_layers_cached_weights_match_the_plain_call_bitwise(config, amax_from_optimizer, monkeypatch):
    # Float8Linear's per-step copies (quantized by the layer, or from an amax the optimizer
    # reported: the copy along K and the transposed one in one pass) feed the fused path, which
    # then quantizes only x and the SwiGLU output; the result is the plain call's bit for bit.
    mod = sys.modules["primus_turbo.pytorch.ops.swiglu_mlp_fp8"]  # the package attribute of that name is the function

    m, hidden, inter = 256, 512, 768
    x, wgu, wd = make(m, hidden, inter)
    layers = []
    for w in (wgu, wd):
        layer = turbo.modules.Float8Linear(w.shape[1], w.shape[0], bias=False, config=config, device="cuda",
                                           dtype=w.dtype, cache_quantized_weight=True)
        with torch.no_grad():
            layer.weight.copy_(w)
        if amax_from_optimizer:
            layer.refresh_weight_cache(layer.weight.detach().abs().amax().float().reshape(1))
        layers.append(layer)
    gate_up, down = layers
    calls = []
    real = mod._native_fwd_qw
    monkeypatch.setattr(mod, "_native_fwd_qw", lambda *a: calls.append(1) or real(*a))
    dy = torch.randn(m, hidden, device="cuda").to(x.dtype)
    cached = run(lambda x_, *_: turbo.ops.swiglu_mlp_fp8(x_, gate_up.weight_operand(), down.weight_operand(),
                                                         config=config), x, gate_up.weight, down.weight, dy)
    plain = run(lambda *a: turbo.ops.swiglu_mlp_fp8(*a, config=config), x, wgu, wd, dy)
    assert calls == [1]
    for name, a, b in zip(("out", "dx", "dw_gate_up", "dw_down"), cached, plain):
        assert torch.equal(a, b), f"{name} differs from the plain call"
    data, data_t = down._cached_copies()  # the transposed copy was written with the copy, not transposed after
    kept = data_t.memoized(("transposed_qdata",), lambda: None)
    assert kept is not None and torch.equal(kept.view(torch.uint8), data.qdata.t().contiguous().view(torch.uint8))


# (rows, cols): 12 takes the scalar (unvectorized) kernel, 9000 rows more than one grid's worth of
# warps (the grid-stride loop repeats).
@pytest.mark.parametrize("rows,cols", [(1, 8), (37, 1416), (700, 14336), (5, 12), (9000, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("with_probs", [False, True])
def test_reported_amax_is_the_rounded_outputs(rows, cols, dtype, with_probs):
    torch.manual_seed(rows)
    h = (torch.randn(rows, 2 * cols, device="cuda") * 3).to(dtype)
    probs = torch.rand(rows, device="cuda") if with_probs else None
    mask = (torch.arange(rows, device="cuda") % 3 != 0).long() if with_probs else None
    out, amax = _swiglu_fwd(h, probs, mask, 0)
    expect = turbo.ops.swiglu_with_probs(h, probs, mask) if with_probs else turbo.ops.swiglu(h)
    assert torch.equal(out, expect) and amax.item() == out.abs().max().float().item()
    dy = torch.randn(rows, cols, device="cuda").to(dtype)
    dx, _, damax = _swiglu_bwd(dy, h, probs, mask, 0, False)
    assert damax.item() == dx.abs().max().float().item()


def test_empty_rows_report_zero():
    h = torch.empty(0, 64, device="cuda", dtype=torch.bfloat16)
    out, amax = _swiglu_fwd(h, None, None, 0)
    assert out.shape == (0, 32) and amax.item() == 0.0


@pytest.mark.parametrize("config,m", [(Float8QuantConfig(granularity=G.ROWWISE), 256), (TENSORWISE[1], 40)],
                         ids=["rowwise", "unaligned-m"])
def test_unfused_fallback(config, m):
    x, wgu, wd = make(m, 256, 384)
    dy = torch.randn(m, 256, device="cuda").to(x.dtype)
    fused = run(lambda *a: turbo.ops.swiglu_mlp_fp8(*a, config=config), x, wgu, wd, dy)
    chain = run(lambda *a: unfused(*a, config), x, wgu, wd, dy)
    for a, b in zip(fused, chain):
        assert torch.equal(a, b)


def test_cuda_graph_and_compile():
    config = TENSORWISE[1]
    x, wgu, wd = make(128, 256, 384)
    dy = torch.randn(128, 256, device="cuda").to(x.dtype)
    eager = run(lambda *a: turbo.ops.swiglu_mlp_fp8(*a, config=config), x, wgu, wd, dy)
    compiled = torch.compile(lambda *a: turbo.ops.swiglu_mlp_fp8(*a, config=config), fullgraph=True)
    for a, b in zip(eager, run(compiled, x, wgu, wd, dy)):
        assert torch.equal(a, b)
    graph, outs = capture_graph(lambda: run(lambda *a: turbo.ops.swiglu_mlp_fp8(*a, config=config), x, wgu, wd, dy))
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, outs):
        assert torch.equal(a, b)


def test_only_the_down_weight_needs_a_gradient():
    config = TENSORWISE[1]
    x, wgu, wd = make(128, 256, 384)
    x.requires_grad_(False)
    wgu.requires_grad_(False)
    dy = torch.randn(128, 256, device="cuda").to(x.dtype)
    (fused,) = torch.autograd.grad(turbo.ops.swiglu_mlp_fp8(x, wgu, wd, config), (wd,), dy)
    (chain,) = torch.autograd.grad(unfused(x, wgu, wd, config), (wd,), dy)
    assert torch.equal(fused, chain)


@pytest.mark.parametrize("config", TENSORWISE, ids=TENSORWISE_IDS)
def test_inference_is_one_fused_call_equal_to_the_chain(config):
    # Without a backward the fused path still runs (forward only, no backward copies).
    x, wgu, wd = make(256, 512, 768)
    with torch.no_grad():
        fused = turbo.ops.swiglu_mlp_fp8(x.reshape(2, 128, 512), wgu, wd, config)
        chain = unfused(x, wgu, wd, config)
    assert fused.shape == (2, 128, 512) and torch.equal(fused.reshape(256, 512), chain)
