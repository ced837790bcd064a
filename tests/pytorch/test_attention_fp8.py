"""turbo.ops.flash_attn_fp8_func / flash_attn_varlen_fp8_func on the GPU: out, lse, dq, dk, dv and
dsink against the explicit float32 softmax reference at the FP8 gate (ACCURACY.md: SNR >= 20 dB),
over odd lengths, Sq != Sk, the FP8 head dims, GQA, causal masks, windows, sinks, both block sizes,
packed sequences with empty and length-1 members and strided views; then that the forward and the
backward really are quantized (below the 16-bit accuracy), that blocks keep an outlier block from
spoiling the rest, that the FP8 backward repeats bit for bit, CUDA graphs, torch.compile and every
output element written."""

import pytest
import torch
from attention_reference import reference, varlen_reference
from test_attention import assert_snr, make, offsets
from turbo_test_utils import capture_graph, poison_allocator, snr_db

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity

pytestmark = pytest.mark.gpu

MIN_SNR = 20.0  # ACCURACY.md: FP8 attention, forward and each gradient
NAMES = ("out", "lse", "dq", "dk", "dv", "dsink")


@pytest.fixture(autouse=True)
def fp8_backward(monkeypatch):
    """Every test here runs the FP8 backward kernels (opt-in in the library) unless it says not."""
    from primus_turbo.pytorch.ops import attention_fp8

    monkeypatch.setattr(attention_fp8, "_FP8_BWD", True)
    return lambda on: monkeypatch.setattr(attention_fp8, "_FP8_BWD", on)


def config(block):
    return Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=block)


def run_fp8(q, k, v, dout, sink=None, cu=None, **kwargs):
    """Forward (with lse) and backward: (out, lse, dq, dk, dv, dsink), with poisoned allocations so
    that an unwritten element shows as NaN."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    s = [sink.detach().requires_grad_()] if sink is not None else []
    poison_allocator(dout.numel() * dout.element_size() * 4)
    if cu is None:
        out, lse = turbo.ops.flash_attn_fp8_func(*leaves, return_lse=True, sink=s[0] if s else None, **kwargs)
    else:
        out, lse = turbo.ops.flash_attn_varlen_fp8_func(*leaves, *cu, return_lse=True, sink=s[0] if s else None, **kwargs)
    grads = torch.autograd.grad(out, leaves + s, dout)
    return (out.detach(), lse, *grads[:3], grads[3] if s else None)


# Where the exact gradient is 0 (a row that sees one key), dS = P (dP - delta) keeps what the FP8
# tensor cores' accumulation of dP (fewer bits than float32) leaves of the cancellation: ~1e-3.
ZERO_ATOL = 1e-2


def check(got, ref, q, what, min_snr=None):
    """min_snr: {name: dB} where a case is allowed below the gate (each says why)."""
    assert got[0].dtype == q.dtype and got[0].is_contiguous() and got[1].dtype == torch.float32
    for name, g, r in zip(NAMES, got, ref):
        if r is not None:
            assert_snr(g, r, (min_snr or {}).get(name, MIN_SNR), f"{what} {name}", zero_atol=ZERO_ATOL)


# (id, batch, Sq, Sk, Hq, Hkv, D, Dv)
CASES = [
    ("s128", 2, 128, 128, 4, 2, 128, 128),
    ("s1", 3, 1, 1, 4, 1, 64, 64),
    ("s17", 2, 17, 17, 6, 3, 128, 128),
    ("s1000", 1, 1000, 1000, 4, 1, 128, 128),
    ("s4097", 1, 4097, 4097, 2, 1, 128, 128),
    ("q100_k333", 2, 100, 333, 4, 2, 64, 64),
    ("q333_k100", 2, 333, 100, 4, 4, 128, 128),
    ("q1_k1000", 2, 1, 1000, 8, 1, 128, 128),
    ("d96", 2, 300, 300, 4, 2, 96, 96),
    ("mla", 2, 300, 257, 4, 4, 192, 128),
]


@pytest.mark.parametrize("bwd", ["fp8_bwd", "16bit_bwd"])
@pytest.mark.parametrize("block", [64, 128])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_fp8_attention_matches_reference(case, causal, block, bwd, fp8_backward):
    fp8_backward(bwd == "fp8_bwd")
    _, b, sq, sk, hq, hkv, d, dv = case
    q, k, v, dout, _ = make(b, sq, sk, hq, hkv, d, dv, seed=sq + sk + d)
    got = run_fp8(q, k, v, dout, causal=causal, fp8_config=config(block))
    check(got, reference(q, k, v, dout, causal=causal), q, f"{case[0]} block {block}")


@pytest.mark.parametrize("ratio", [1, 4, 8, 16])
def test_fp8_gqa_ratios_fp16(ratio):
    q, k, v, dout, _ = make(2, 256, 256, 16, 16 // ratio, 128, 128, dtype=torch.float16, seed=ratio)
    got = run_fp8(q, k, v, dout, causal=True)
    check(got, reference(q, k, v, dout, causal=True), q, f"gqa {ratio}")


@pytest.mark.parametrize(
    "window,causal,sq,sk,sink",
    [((64, 0), False, 500, 500, True), ((16, 9), False, 300, 200, False), ((128, -1), True, 257, 513, True)],
)
def test_fp8_windows_and_sinks(window, causal, sq, sk, sink):
    q, k, v, dout, s = make(2, sq, sk, 8, 2, 64, 64, sink=sink, seed=sq)
    got = run_fp8(q, k, v, dout, s, causal=causal, window_size=window)
    ref = reference(q, k, v, dout, s, causal=causal, window_size=window)
    check(got, ref, q, f"window {window}")


@pytest.mark.parametrize("dims", [(128, 128), (64, 64), (192, 128)], ids=str)
@pytest.mark.parametrize("same_lengths", [True, False], ids=["q=k", "q!=k"])
def test_fp8_varlen_matches_reference(same_lengths, dims):
    lens_q = [5, 0, 1, 300, 17, 64, 3, 129]
    lens_k = lens_q if same_lengths else [5, 0, 1, 200, 40, 64, 0, 129]
    d, dv = dims
    torch.manual_seed(d)
    q = torch.randn(sum(lens_q), 8, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lens_k), 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(lens_k), 2, dv, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(sum(lens_q), 8, dv, device="cuda", dtype=torch.bfloat16)
    s = torch.randn(8, device="cuda")
    cu_q, cu_k = offsets(lens_q), offsets(lens_k)
    for slack in (0, 7):
        got = run_fp8(q, k, v, dout, s, cu=(cu_q, cu_k, max(lens_q) + slack, max(lens_k) + slack), causal=True)
        assert got[1].shape == (8, sum(lens_q))
        check(got, varlen_reference(q, k, v, dout, cu_q, cu_k, s, causal=True), q, f"varlen slack {slack}")


@pytest.mark.parametrize("layout", ["sbhd", "bhsd"])
def test_fp8_strided_views(layout):
    torch.manual_seed(3)
    shape = {"sbhd": (300, 2, 4, 128), "bhsd": (2, 4, 300, 128)}[layout]
    perm = {"sbhd": (1, 0, 2, 3), "bhsd": (0, 2, 1, 3)}[layout]
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16).permute(perm) for _ in range(3))
    dout = torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.bfloat16)
    got = run_fp8(q, k, v, dout, causal=True)
    check(got, reference(q, k, v, dout, causal=True), q, layout)


@pytest.mark.parametrize("softmax_scale", [-0.09, 0.3])
def test_fp8_softmax_scale_of_either_sign(softmax_scale):
    q, k, v, dout, _ = make(2, 200, 200, 4, 2, 128, 128, seed=5)
    got = run_fp8(q, k, v, dout, causal=True, softmax_scale=softmax_scale)
    # At 0.3 (3.4x the usual 1/sqrt(128)) rows attend almost to one key: dS = P (dP - delta) is a
    # small difference whose E4M3 rounding shows in dq and dk (18.8-19.5 dB measured on an H100).
    relaxed = {"dq": 18.0, "dk": 18.0} if softmax_scale == 0.3 else None
    check(got, reference(q, k, v, dout, softmax_scale=softmax_scale, causal=True), q, f"scale {softmax_scale}", relaxed)


def test_fp8_forward_is_quantized_and_blockwise():
    """The output is below 16-bit accuracy (q, k, v and P really go through E4M3), and a block of
    keys 100x larger than the rest leaves the other blocks' accuracy intact."""
    q, k, v, dout, _ = make(2, 512, 512, 4, 4, 128, 128, seed=7)
    ref = reference(q, k, v)[0]
    out = turbo.ops.flash_attn_fp8_func(q, k, v)
    snr = snr_db(out.double(), ref.double())
    assert MIN_SNR <= snr < 38.0, f"FP8 forward SNR {snr:.1f} dB: expected FP8 accuracy, between {MIN_SNR} and 38 dB"
    v2 = v.clone()
    v2[:, 128:192] *= 100.0  # one 64-row block of values per sequence
    ref2 = reference(q, k, v2)[0]
    for block in (64, 128):
        out2 = turbo.ops.flash_attn_fp8_func(q, k, v2, fp8_config=config(block))
        assert_snr(out2, ref2, MIN_SNR, f"outlier block, block {block}")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_fp8_forward_with_value_scales_growing_along_the_keys(causal):
    """V's magnitude grows 10^6-fold along 4096 keys (and K's by up to 2x at random): O's v unit
    moves at almost every block, also where no row maximum does, so O's rescale must run then."""
    q, k, v, _, _ = make(1, 4096, 4096, 4, 2, 128, 128, seed=51)
    with torch.no_grad():
        v = v * torch.logspace(-3, 3, 4096, device=v.device).view(1, -1, 1, 1).to(v.dtype)
        k = k * torch.rand(1, 4096, 1, 1, device=k.device).mul(2).to(k.dtype)
        out = turbo.ops.flash_attn_fp8_func(q, k, v, causal=causal)
    assert_snr(out, reference(q, k, v, causal=causal)[0], MIN_SNR, "growing v scales")


def test_fp8_backward_is_quantized_and_deterministic(fp8_backward):
    """The FP8 backward kernels run (their gradients differ from the 16-bit backward's of the same
    forward by FP8 rounding, not by 16-bit rounding), agree with the reference at the FP8 gate, and
    repeat bit for bit."""
    q, k, v, dout, _ = make(2, 700, 700, 8, 2, 128, 128, seed=41)
    ref = reference(q, k, v, dout, causal=True)
    first = run_fp8(q, k, v, dout, causal=True)
    again = run_fp8(q, k, v, dout, causal=True)
    check(first, ref, q, "FP8 backward")
    for name, a, b in zip(NAMES[2:5], first[2:5], again[2:5]):
        assert torch.equal(a, b), f"FP8 backward {name} differs between two runs"
    fp8_backward(False)
    wide = run_fp8(q, k, v, dout, causal=True)
    for name, g, w in zip(NAMES[2:5], first[2:5], wide[2:5]):
        snr = snr_db(g.double(), w.double())
        assert MIN_SNR <= snr < 40.0, f"{name}: FP8 against the 16-bit backward {snr:.1f} dB"


def test_fp8_extreme_blocks_stay_finite():
    """A block of tiny values (amax ~1e-37: the scale's exponent is clamped), fp16 values near its
    limit (the dequantized copy saturates instead of overflowing), and an infinite input, which
    must show as NaN as it would in 16 bits rather than as a large finite value."""
    q, k, v, dout, _ = make(1, 256, 256, 2, 2, 128, 128, dtype=torch.float16, seed=31)
    with torch.no_grad():
        k[:, :64] = 0.0  # an all-zero block (scale 0)
        v[:, 128:192] = v[:, 128:192].sign() * 65000.0
    got = run_fp8(q, k, v, dout, causal=True)
    for name, g in zip(NAMES, got):
        if g is not None:
            assert torch.isfinite(g).all(), f"fp16 extremes: {name} has non-finite values"
    qb, kb, vb, doutb, _ = make(1, 256, 256, 2, 2, 128, 128, seed=32)
    with torch.no_grad():
        kb[:, 64:128] *= 1e-37  # bf16 holds it
    got = run_fp8(qb, kb, vb, doutb, causal=True)
    check(got, reference(qb, kb, vb, doutb, causal=True), qb, "tiny block")
    with torch.no_grad():
        vb[0, 5, 0, 3] = float("inf")
    out = turbo.ops.flash_attn_fp8_func(qb, kb, vb, causal=True)
    assert not torch.isfinite(out[0, 5:, 0]).all(), "an infinite value must not turn into a finite one"


def test_fp8_cuda_graph_capture():
    """Fixed-length and packed (device-side cu_seqlens) forward and backward in one graph."""
    q, k, v, dout, sink = make(2, 256, 256, 8, 2, 128, 128, sink=True, seed=15)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    cu = offsets([100, 0, 156])
    packed = [t.detach().flatten(0, 1)[:256].clone().requires_grad_() for t in (q, k, v)]

    def step():
        out, lse = turbo.ops.flash_attn_fp8_func(*leaves[:3], sink=leaves[3], causal=True, return_lse=True)
        pout = turbo.ops.flash_attn_varlen_fp8_func(*packed, cu, cu, 156, 156, window_size=(32, 32))
        return (out, lse, *torch.autograd.grad(out, leaves, dout), pout, *torch.autograd.grad(pout, packed, dout[0]))

    graph, static = capture_graph(step, warmup=2)
    torch.manual_seed(101)
    for t in leaves[:3] + packed + [dout]:
        with torch.no_grad():
            t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(*leaves[:3], dout, leaves[3], causal=True)
    for name, got, r in zip(NAMES, static[:6], ref):
        assert_snr(got, r, MIN_SNR, f"replay {name}")
    pref = varlen_reference(*packed, dout[0], cu, cu, window_size=(32, 32))
    for name, got, r in zip(("out", "dq", "dk", "dv"), static[6:], (pref[0], *pref[2:5])):
        assert_snr(got, r, MIN_SNR, f"replay varlen {name}")


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_fp8_deterministic_backward_is_bitwise_reproducible(varlen):
    q, k, v, dout, sink = make(2, 300, 300, 8, 2, 128, 128, sink=True, seed=21)
    cu = offsets([300, 0, 300]) if varlen else None
    if varlen:
        q, k, v, dout = (t.flatten(0, 1) for t in (q, k, v, dout))
    runs = [
        run_fp8(q, k, v, dout, sink, cu=(cu, cu, 300, 300) if varlen else None, causal=True, deterministic=True)
        for _ in range(2)
    ]
    for name, a, b in zip(NAMES, *runs):
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"


def test_fp8_torch_compile_fullgraph():
    q, k, v, dout, sink = make(2, 256, 256, 8, 2, 128, 128, sink=True, seed=16)

    def fn(q, k, v, s):
        cfg = Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=128)
        return turbo.ops.flash_attn_fp8_func(q * 2.0, k, v, causal=True, sink=s, fp8_config=cfg) + 1.0

    compiled = torch.compile(fn, fullgraph=True)
    results = []
    for f in (compiled, fn):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sink)]
        out = f(*leaves)
        results.append((out.detach(), *torch.autograd.grad(out, leaves, dout)))
    for name, got, want in zip(("out", "dq", "dk", "dv", "dsink"), *results):
        assert_snr(got, want, 40.0, f"compiled vs eager {name}")  # the same kernels; cuDNN's backward may use atomics


def test_fp8_unsupported_head_dim_names_the_limit():
    q = torch.randn(1, 64, 2, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="head dims"):
        turbo.ops.flash_attn_fp8_func(q, q, q)


def test_fp8_module_in_megatron_layout():
    """TurboAttention(fp8_config=...) on [S, B, H, D] tensors: the FP8 function through the module."""
    q, k, v, dout, _ = make(2, 300, 300, 4, 2, 128, 128, seed=9)
    m = turbo.modules.TurboAttention(causal=True, fp8_config=config(64), layout="sbhd")
    leaves = [t.transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v)]
    out = m(*leaves)
    grads = torch.autograd.grad(out, leaves, dout.transpose(0, 1))
    ref = reference(q, k, v, dout, causal=True)
    assert_snr(out.transpose(0, 1), ref[0], MIN_SNR, "module out")
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref[2:5]):
        assert_snr(g.transpose(0, 1), r, MIN_SNR, f"module {name}")
