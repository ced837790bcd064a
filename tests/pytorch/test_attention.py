"""turbo.ops.flash_attn_func / flash_attn_varlen_func on the GPU: out, lse, dq, dk, dv and dsink
against an explicit float32 softmax reference (ACCURACY.md: SNR >= 40 dB for bf16 and fp16), over
sequence lengths (1 to 4097, Sq != Sk both ways), every head-dim pair, GQA ratios, causal masks
and windows, sinks, packed sequences with empty and length-1 members, strided layouts; then
determinism, CUDA graphs, torch.compile, every output element written, the module and the
transformers integration. Tests taking the ``backend`` fixture run once on our kernel (TURBO) and once
on cuDNN (CUDNN; skipped, with cuDNN's reason, where cuDNN does not take the problem — unset, the
library then runs ours); the others run with the backend unset."""

import pytest
import torch
from attention_reference import reference, varlen_reference
from turbo_test_utils import capture_graph, poison_allocator, snr_db

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.backend import GlobalBackendManager

pytestmark = pytest.mark.gpu

MIN_SNR = 40.0  # ACCURACY.md: attention bf16/fp16, forward and each gradient
DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = [(64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256)]
NAMES = ("out", "lse", "dq", "dk", "dv", "dsink")


def assert_snr(out: torch.Tensor, ref: torch.Tensor, min_db: float, what: str, zero_atol: float = 1e-3) -> None:
    """SNR of ``out`` against ``ref`` >= min_db; +inf in ``ref`` (the lse of a query that sees no
    key) must be +inf in ``out``; NaN/Inf anywhere else fails whatever the SNR; an all-zero ``ref``
    wants |out| <= zero_atol."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    out64, ref64 = out.detach().double(), ref.detach().double()
    inf = torch.isinf(ref64)
    if inf.any():
        assert torch.equal(out64[inf], ref64[inf]), f"{what}: queries that see no key must give +inf"
        out64, ref64 = out64[~inf], ref64[~inf]
    bad = (~torch.isfinite(out64)).sum().item()
    assert bad == 0, f"{what}: {bad} NaN/Inf values (unwritten or overflowed elements)"
    if ref64.numel() == 0:
        return
    if ref64.abs().max() == 0:  # e.g. dq when every query sees one key: only rounding noise may remain
        assert out64.abs().max().item() <= zero_atol, f"{what}: expected zeros, max |out| {out64.abs().max():.3g}"
        return
    snr = snr_db(out64, ref64)
    assert snr >= min_db, f"{what}: SNR {snr:.1f} dB < {min_db} dB"


# ---- running ours ------------------------------------------------------------------------------


@pytest.fixture(params=["TURBO", "CUDNN"])
def backend(request):
    GlobalBackendManager.set_attn_backend(request.param)
    yield request.param
    GlobalBackendManager.set_attn_backend(None)


def _attn(fn, *args, **kwargs):
    """fn(*args, **kwargs), with a problem the forced CUDNN backend refuses turned into a skip."""
    try:
        return fn(*args, **kwargs)
    except (NotImplementedError, RuntimeError) as e:  # RuntimeError: raised inside autograd's backward
        if "CUDNN attention backend cannot run" in str(e):
            pytest.skip(str(e).split(": ", 1)[-1])
        raise


def make(b, sq, sk, hq, hkv, d, dv, dtype=torch.bfloat16, sink=False, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hkv, dv, device="cuda", dtype=dtype)
    dout = torch.randn(b, sq, hq, dv, device="cuda", dtype=dtype)
    s = torch.randn(hq, device="cuda") if sink else None
    return q, k, v, dout, s


def run_turbo(q, k, v, dout, sink=None, cu=None, **kwargs):
    """Forward (with lse) and backward of ours: (out, lse, dq, dk, dv, dsink). Leaves are detached
    views of the inputs, so strided layouts reach the op as they are."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    s = [sink.detach().requires_grad_()] if sink is not None else []
    kwargs["sink"] = s[0] if s else None
    poison_allocator(dout.numel() * dout.element_size())  # unwritten output elements would stay NaN
    if cu is None:
        out, lse = _attn(turbo.ops.flash_attn_func, *leaves, return_lse=True, **kwargs)
    else:
        out, lse = _attn(turbo.ops.flash_attn_varlen_func, *leaves, *cu, return_lse=True, **kwargs)
    poison_allocator(max(t.numel() * t.element_size() for t in (q, k, v)))
    grads = _attn(torch.autograd.grad, out, leaves + s, dout)
    return (out.detach(), lse, *grads[:3], grads[3] if s else None)


def check(q, k, v, dout, sink=None, what="", **kwargs):
    got = run_turbo(q, k, v, dout, sink, **kwargs)
    ref = reference(q, k, v, dout, sink, **kwargs)
    check_outputs(got, ref, q, k, v, sink, what)
    return got


def check_outputs(got, ref, q, k, v, sink, what):
    out, lse, dq, dk, dv, dsink = got
    assert out.dtype == q.dtype and out.is_contiguous() and lse.dtype == torch.float32
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and dq.dtype == q.dtype
    for name, g, r in zip(NAMES, got, ref):
        if r is not None:
            assert_snr(g, r, MIN_SNR, f"{what} {name}")
    if sink is not None:
        assert dsink.dtype == sink.dtype and dsink.shape == sink.shape


# ---- fixed length ------------------------------------------------------------------------------

# (id, batch, Sq, Sk, Hq, Hkv, D, Dv): odd and long sequences (fewer heads to stay quick), Sq != Sk
# both ways (bottom-right aligned masks; with Sq > Sk the first causal queries see no key).
CASES = [
    ("s128", 2, 128, 128, 4, 2, 128, 128),
    ("s1", 3, 1, 1, 4, 1, 64, 64),
    ("s17", 2, 17, 17, 6, 3, 128, 128),
    ("s1000", 1, 1000, 1000, 4, 1, 128, 128),
    ("s4097", 1, 4097, 4097, 2, 1, 128, 128),
    ("q100_k333", 2, 100, 333, 4, 2, 64, 64),
    ("q333_k100", 2, 333, 100, 4, 4, 128, 128),
    ("q1_k1000", 2, 1, 1000, 8, 1, 128, 128),
    ("q17_k1", 2, 17, 1, 4, 2, 64, 64),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_attention_matches_reference(case, causal, dtype, backend):
    _, b, sq, sk, hq, hkv, d, dv = case
    q, k, v, dout, _ = make(b, sq, sk, hq, hkv, d, dv, dtype, seed=sq + sk)
    check(q, k, v, dout, causal=causal, what=case[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dims", HEAD_DIMS, ids=lambda p: f"d{p[0]}_{p[1]}")
def test_every_head_dim_pair(dims, dtype, backend):
    d, dv = dims
    q, k, v, dout, _ = make(2, 200, 230, 4, 2, d, dv, dtype, seed=d + dv)
    check(q, k, v, dout, causal=True, what=f"d{d}/{dv}")
    check(q, k, v, dout, softmax_scale=0.05, what=f"d{d}/{dv} scale")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("ratio", [1, 4, 8, 16])
def test_gqa_ratios(ratio, causal, backend):
    q, k, v, dout, _ = make(2, 256, 256, 16, 16 // ratio, 128, 128, seed=ratio)
    check(q, k, v, dout, causal=causal, what=f"gqa{ratio}")


# ((left, right), causal, Sq, Sk): windows from none to wider than the sequence, with Sq != Sk.
WINDOWS = [
    ((16, 0), True, 300, 300),
    ((0, 0), False, 64, 64),  # each query sees one key: dq is zero
    ((0, -1), False, 64, 64),
    ((-1, 0), False, 100, 60),  # the same as causal; the first 40 queries see nothing
    ((5, 3), False, 200, 200),
    ((3, 7), False, 50, 80),
    ((7, 3), False, 80, 50),
    ((10000, 10000), False, 77, 77),  # wider than the sequence: full attention
    ((10000, 5), True, 77, 77),  # causal overrides the right side
    ((128, 0), True, 1000, 1000),
]


@pytest.mark.parametrize("window,causal,sq,sk", WINDOWS, ids=lambda x: str(x).replace(" ", ""))
def test_windows(window, causal, sq, sk, backend):
    q, k, v, dout, _ = make(2, sq, sk, 4, 2, 64, 64, seed=sq + 3 * sk)
    check(q, k, v, dout, causal=causal, window_size=window, what=f"window {window}")


@pytest.mark.parametrize(
    "b,sq,sk,hq,hkv,d,window,causal",
    [
        (2, 300, 300, 8, 1, 64, (128, 0), True),  # GPT-OSS: window 128 and sinks, GQA 8
        (2, 100, 100, 4, 2, 128, (-1, -1), False),
        (2, 90, 40, 4, 4, 64, (-1, -1), True),  # queries without keys: all weight on the sink
        (1, 64, 64, 4, 2, 64, (0, 0), False),
        (1, 1, 1, 8, 8, 128, (-1, -1), False),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sinks(dtype, b, sq, sk, hq, hkv, d, window, causal, backend):
    q, k, v, dout, sink = make(b, sq, sk, hq, hkv, d, d, dtype, sink=True, seed=sq * 7 + hq)
    check(q, k, v, dout, sink, causal=causal, window_size=window, what="sink")


def test_bf16_sink_parameter():
    q, k, v, dout, sink = make(2, 128, 128, 8, 2, 64, 64, sink=True, seed=3)
    got = run_turbo(q, k, v, dout, sink.bfloat16(), causal=True)
    ref = reference(q, k, v, dout, sink.bfloat16(), causal=True)
    assert got[5].dtype == torch.bfloat16
    assert_snr(got[0], ref[0], MIN_SNR, "out")
    assert_snr(got[5].float(), ref[5], 35.0, "dsink (rounded to bf16)")


# ---- packed sequences --------------------------------------------------------------------------

# Lengths per sequence of q and k: empty sequences, length 1, q longer and shorter than k, and a
# query block without keys (3 queries, 0 keys).
SEQLENS_Q = [5, 0, 1, 300, 17, 64, 3, 129]
SEQLENS_K = [5, 0, 1, 200, 40, 64, 0, 129]


def flash_attn_varlen_on_turbo(*args, **kwargs):
    """Packed sequences run on our kernel whatever the fixture forced (cuDNN does not take them)."""
    forced = GlobalBackendManager.get_attn_backend("bf16")
    GlobalBackendManager.set_attn_backend("TURBO")
    try:
        return turbo.ops.flash_attn_varlen_func(*args, **kwargs)
    finally:
        GlobalBackendManager.set_attn_backend(forced.backend if forced else None)


def offsets(lens, dtype=torch.int32):
    return torch.tensor([0] + lens, device="cuda").cumsum(0).to(dtype)


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize(
    "causal,window,sink,dims",
    [
        (True, (-1, -1), False, (128, 128)),
        (False, (-1, -1), False, (128, 128)),
        (True, (16, 0), True, (64, 64)),
        (False, (4, 9), True, (192, 128)),
        (True, (-1, -1), True, (256, 256)),
    ],
)
@pytest.mark.parametrize("same_lengths", [True, False], ids=["q=k", "q!=k"])
def test_varlen_matches_reference(same_lengths, causal, window, sink, dims, cu_dtype):
    lens_q = SEQLENS_Q
    lens_k = SEQLENS_Q if same_lengths else SEQLENS_K
    d, dv = dims
    torch.manual_seed(sum(dims) + len(lens_k))
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, 8, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tk, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(tk, 2, dv, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(tq, 8, dv, device="cuda", dtype=torch.bfloat16)
    s = torch.randn(8, device="cuda") if sink else None
    cu_q, cu_k = offsets(lens_q, cu_dtype), offsets(lens_k, cu_dtype)
    kwargs = {"causal": causal, "window_size": window}
    # max_seqlen_* are upper bounds: a looser bound must give the same result.
    for slack in (0, 7):
        bounds = (max(lens_q) + slack, max(lens_k) + slack)
        got = run_turbo(q, k, v, dout, s, cu=(cu_q, cu_k, *bounds), **kwargs)
        ref = varlen_reference(q, k, v, dout, cu_q, cu_k, s, **kwargs)
        assert got[1].shape == (8, tq)
        check_outputs(got, ref, q, k, v, s, f"varlen slack {slack}")


@pytest.mark.parametrize(
    "causal,window,dims,heads",
    [
        (True, (-1, -1), (128, 128), (8, 2)),
        (False, (-1, -1), (64, 64), (4, 4)),
        (True, (32, 0), (128, 128), (8, 1)),
        (False, (-1, -1), (192, 128), (4, 2)),
    ],
)
def test_varlen_on_cudnn_with_one_cu_seqlens(causal, window, dims, heads):
    # One cu_seqlens tensor for q and k (packed documents attending to themselves): the CUDNN
    # backend runs them as ragged tensors. Rows past the last document are set as our kernel sets
    # them (zero output and gradients, lse +inf); an empty document and bounds with slack are fine.
    lens, tail = [37, 0, 511, 1, 300], 13
    (d, dv), (hq, hkv) = dims, heads
    n = sum(lens)
    torch.manual_seed(d + hq + n)
    q = torch.randn(n + tail, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n + tail, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(n + tail, hkv, dv, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(n + tail, hq, dv, device="cuda", dtype=torch.bfloat16)
    cu = offsets(lens)
    kwargs = {"causal": causal, "window_size": window}
    ref = varlen_reference(q[:n], k[:n], v[:n], dout[:n], cu, cu, None, **kwargs)
    for slack in (0, 9):
        GlobalBackendManager.set_attn_backend("CUDNN")
        try:
            got = run_turbo(q, k, v, dout, None, cu=(cu, cu, max(lens) + slack, max(lens) + slack), **kwargs)
        finally:
            GlobalBackendManager.set_attn_backend(None)
        out, lse, dq, dk, dv_, _ = got
        assert lse.shape == (hq, n + tail)
        cut = (out[:n], lse[:, :n], dq[:n], dk[:n], dv_[:n], None)
        check_outputs(cut, ref, q[:n], k[:n], v[:n], None, f"cuDNN varlen slack {slack}")
        assert (out[n:] == 0).all() and torch.isinf(lse[:, n:]).all() and (lse[:, n:] > 0).all()
        assert (dq[n:] == 0).all() and (dk[n:] == 0).all() and (dv_[n:] == 0).all()


def test_autotune_measures_both_backends_once_and_stays_correct(monkeypatch):
    from primus_turbo.pytorch.core import autotune
    from primus_turbo.pytorch.ops import attention as attn

    measured = []
    real_run = attn.AttentionProblem.run

    def run(self, backend, config, for_tuning=False):
        measured.append(backend.name)
        return real_run(self, backend, config, for_tuning)

    monkeypatch.setattr(attn.AttentionProblem, "run", run)
    monkeypatch.setattr(attn, "_tuned", {})
    monkeypatch.setattr(autotune, "_decided", {})
    monkeypatch.setattr(autotune, "_lookup", lambda key: None)  # measure even if the disk cache knows it
    GlobalBackendManager.set_attn_backend(auto_tune=True)
    try:
        q, k, v, dout, sink = make(2, 300, 300, 8, 2, 128, 128, sink=True, seed=3)
        state = torch.cuda.get_rng_state()
        check(q, k, v, dout, sink, "autotuned, causal", causal=True)
        assert {"TURBO", "CUDNN"} <= set(measured)  # both ran forward and backward for the training call
        assert torch.equal(torch.cuda.get_rng_state(), state)  # tuning drew from its own generator
        picked = [key for key in autotune._decided if key.startswith("ATTN|") and "|bwd" in key]
        assert picked and all(autotune._decided[key][0].name in ("TURBO", "CUDNN") for key in picked)
        n = len(measured)
        check(q, k, v, dout, sink, "autotuned, again", causal=True)
        assert len(measured) == n  # remembered: nothing measured again
        cu = offsets([100, 0, 200])
        tq = torch.randn(300, 8, 128, device="cuda", dtype=torch.bfloat16)
        out = turbo.ops.flash_attn_varlen_func(tq, tq[:, :2], tq[:, :2], cu, cu, 200, 200, causal=True)
        assert torch.isfinite(out).all() and len(measured) == n  # packed: the core's choice, nothing measured
    finally:
        GlobalBackendManager.reset()


BAD_OFFSETS = [
    ([0, 20, 10, 64], "decreases at index 2"),
    ([0, 30, 60, 90], "ends at 90, past the 64 tokens"),
    ([-5, 30, 50, 64], "is negative"),
    ([0, 10, 50, 64], "sequence of 40 tokens"),
]


@pytest.mark.parametrize("cu_list,message", BAD_OFFSETS, ids=["decreasing", "past_end", "negative", "too_long"])
def test_bad_offsets_never_access_outside_and_the_debug_check_names_them(monkeypatch, backend, cu_list, message):
    # Offsets are device data read without a host sync: bad ones give meaningless rows but no access
    # outside the tensors (both backends clamp them); PRIMUS_TURBO_CHECK_CU_SEQLENS=1 reports them.
    torch.manual_seed(7)
    q = torch.randn(64, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(64, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(64, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cu = torch.tensor(cu_list, device="cuda", dtype=torch.int32)
    GlobalBackendManager.set_attn_backend(backend)
    try:
        out = turbo.ops.flash_attn_varlen_func(q, k, v, cu, cu, 32, 32, causal=True)
        out.float().sum().backward()
        torch.cuda.synchronize()
        assert out.shape == (64, 8, 128) and q.grad.shape == q.shape
        monkeypatch.setenv("PRIMUS_TURBO_CHECK_CU_SEQLENS", "1")
        with pytest.raises(ValueError, match=message):
            turbo.ops.flash_attn_varlen_func(q, k, v, cu, cu, 32, 32, causal=True)
        good = offsets([20, 0, 44])
        assert turbo.ops.flash_attn_varlen_func(q, k, v, good, good, 44, 44).shape == (64, 8, 128)
    finally:
        GlobalBackendManager.set_attn_backend(None)


# ---- layouts and views -------------------------------------------------------------------------


def _views(layout, b, s, hq, hkv, d, dtype=torch.bfloat16):
    """q, k, v as [B, S, H, D] views of differently laid out storage."""
    if layout == "sbhd":
        return [torch.randn(s, b, h, d, device="cuda", dtype=dtype).transpose(0, 1) for h in (hq, hkv, hkv)]
    if layout == "bhsd":
        return [torch.randn(b, h, s, d, device="cuda", dtype=dtype).transpose(1, 2) for h in (hq, hkv, hkv)]
    if layout == "qkv_packed":  # slices of one fused projection output [B, S, (Hq + 2 Hkv) * D]
        x = torch.randn(b, s, (hq + 2 * hkv) * d, device="cuda", dtype=dtype)
        qs, ks, vs = x.split([hq * d, hkv * d, hkv * d], dim=-1)
        return qs.view(b, s, hq, d), ks.view(b, s, hkv, d), vs.view(b, s, hkv, d)
    if layout == "unaligned":  # 2 bytes off a 16-byte boundary: the op copies
        return [torch.randn(b * s * h * d + 1, device="cuda", dtype=dtype)[1:].view(b, s, h, d) for h in (hq, hkv, hkv)]
    raise ValueError(layout)


@pytest.mark.parametrize("layout", ["sbhd", "bhsd", "qkv_packed", "unaligned"])
def test_strided_views(layout, backend):
    torch.manual_seed(11)
    q, k, v = _views(layout, 2, 200, 8, 2, 128)
    dout = torch.randn(2, 200, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(0, 1).contiguous().transpose(0, 1)
    check(q, k, v, dout, causal=True, what=layout)


def test_expanded_output_gradient():
    # out.sum() hands the backward an all-stride-0 gradient
    q, k, v, _, _ = make(2, 64, 64, 4, 2, 64, 64, seed=12)
    ones = torch.ones(2, 64, 4, 64, device="cuda", dtype=torch.bfloat16)
    q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
    turbo.ops.flash_attn_func(q_, k_, v_, causal=True).sum().backward()
    ref = reference(q, k, v, ones, causal=True)
    for name, g, r in (("dq", q_.grad, ref[2]), ("dk", k_.grad, ref[3]), ("dv", v_.grad, ref[4])):
        assert_snr(g, r, MIN_SNR, name)


# ---- return conventions, determinism, capture, compile ------------------------------------------


def test_return_conventions():
    q, k, v, _, _ = make(2, 32, 32, 4, 2, 64, 64, seed=13)
    out = turbo.ops.flash_attn_func(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 32, 4, 64) and out.grad_fn is None
    out2, lse = turbo.ops.flash_attn_func(q, k, v, causal=True, return_lse=True, deterministic=True)
    assert torch.equal(out, out2) and lse.shape == (2, 4, 32) and lse.dtype == torch.float32
    scale = q.shape[-1] ** -0.5
    assert torch.equal(turbo.ops.flash_attn_func(q, k, v, softmax_scale=scale, causal=True), out)


@pytest.mark.parametrize("with_sink", [True, False], ids=["sink", "nosink"])
@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_backward_is_bitwise_deterministic(varlen, with_sink, backend):
    q, k, v, dout, sink = make(2, 1024, 1024, 16, 2, 128, 128, sink=with_sink, seed=14)
    if varlen:
        cu = offsets([1000, 1048])
        args = [t.flatten(0, 1) for t in (q, k, v, dout)] + [sink]
        runs = [run_turbo(*args, cu=(cu, cu, 1048, 1048), causal=True, deterministic=True) for _ in range(2)]
    else:
        runs = [run_turbo(q, k, v, dout, sink, causal=True, deterministic=True) for _ in range(2)]
    for name, a, b in zip(NAMES, *runs):
        assert (a is None and b is None) or torch.equal(a, b), f"{name} differs between two runs"


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_fused_dq_backward_matches_the_deterministic_one(varlen):
    """TURBO at head dims 128/128 on Hopper: the default backward adds dQ up in float32 (bulk
    reductions, no fixed order) inside the dK/dV kernel, deterministic=True takes the separate dQ
    kernel. Each against the reference
    (GQA, a sink, a causal window, odd lengths), and the two dq's within float32 rounding."""
    GlobalBackendManager.set_attn_backend("TURBO")
    try:
        q, k, v, dout, sink = make(2, 777, 777, 8, 2, 128, 128, sink=True, seed=22)
        kw = dict(causal=True, window_size=(300, 0))
        if varlen:
            cu = offsets([777, 0, 1, 776])
            q, k, v, dout = (t.flatten(0, 1)[: int(cu[-1])] for t in (q, k, v, dout))
            kw["cu"] = (cu, cu, 777, 777)
        runs = []
        for det in (False, True):
            got = run_turbo(q, k, v, dout, sink, deterministic=det, **kw)
            if varlen:
                refs = varlen_reference(q, k, v, dout, cu, cu, sink, causal=True, window_size=(300, 0))
            else:
                refs = reference(q, k, v, dout, sink, **kw)
            check_outputs(got, refs, q, k, v, sink, f"deterministic={det}")
            runs.append(got)
        assert snr_db(runs[0][2].double(), runs[1][2].double()) >= 60, "fused and separate dq differ"
    finally:
        GlobalBackendManager.set_attn_backend(None)


@pytest.mark.parametrize("op", ["TURBO", "CUDNN", "FP8"])
def test_varlen_rows_past_the_last_sequence(op):
    """Tokens past cu_seqlens_q[-1] belong to no sequence: every path gives them a zero output and
    the log-sum-exp of a row that sees nothing, +inf (our kernels once wrote 0 there, cuDNN +inf)."""
    lens, tail = [37, 0, 100], 11
    n = sum(lens)
    torch.manual_seed(n)
    q, k, v = (torch.randn(n + tail, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = offsets(lens)
    GlobalBackendManager.set_attn_backend("CUDNN" if op == "CUDNN" else "TURBO")
    try:
        fn = turbo.ops.flash_attn_varlen_fp8_func if op == "FP8" else turbo.ops.flash_attn_varlen_func
        poison_allocator(q.numel() * q.element_size())
        out, lse = fn(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
    finally:
        GlobalBackendManager.set_attn_backend(None)
    assert (out[n:] == 0).all() and torch.isinf(lse[:, n:]).all() and (lse[:, n:] > 0).all()
    assert torch.isfinite(lse[:, :n]).all() and torch.isfinite(out[:n]).all()


def test_cudnn_varlen_graphs_keep_each_calls_mask():
    """Packed calls on cuDNN share a graph across max lengths of one bucket; a mask side that
    constrains at one max length and hides nothing at another must not carry over (window (100, 0)
    at max 80 then 128; causal at max 1 then 50). Each call matches the reference."""
    cases = (({"window_size": (100, 0)}, ([80, 40], [128, 60])), ({"causal": True}, ([1, 1], [50, 14])))
    GlobalBackendManager.set_attn_backend("CUDNN")
    try:
        for kwargs, runs in cases:
            for lens in runs:
                n = sum(lens)
                torch.manual_seed(n)
                q, k, v, dout = (torch.randn(n, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                cu = offsets(lens)
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                out = turbo.ops.flash_attn_varlen_func(*leaves, cu, cu, max(lens), max(lens), **kwargs)
                grads = torch.autograd.grad(out, leaves, dout)
                ref = varlen_reference(q, k, v, dout, cu, cu, None, **kwargs)
                for name, g, r in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref[0], *ref[2:5])):
                    assert_snr(g, r, MIN_SNR, f"cuDNN varlen {lens} {kwargs} {name}")
    finally:
        GlobalBackendManager.set_attn_backend(None)


def test_forced_cudnn_takes_a_decode_window():
    """One query against 1000 keys, causal with window (128, 0), backend CUDNN: the right bound 0
    hides nothing for one query but stays with the left one, so cuDNN runs it (it refused "a left
    window without a right bound" before) and matches the reference."""
    q, k, v, dout, _ = make(1, 1, 1000, 4, 4, 128, 128, seed=21)
    GlobalBackendManager.set_attn_backend("CUDNN")
    try:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = turbo.ops.flash_attn_func(*leaves, causal=True, window_size=(128, 0))
        grads = torch.autograd.grad(out, leaves, dout)
    finally:
        GlobalBackendManager.set_attn_backend(None)
    ref = reference(q, k, v, dout, None, causal=True, window_size=(128, 0))
    for name, g, r in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref[0], *ref[2:5])):
        assert_snr(g, r, MIN_SNR, f"decode window {name}")


def test_unset_backend_runs_what_cudnn_refuses_on_our_kernel():
    # rows that see no key (causal, Sq > Sk) and a left window alone: cuDNN is skipped, not failed
    q, k, v, dout, sink = make(2, 333, 100, 4, 2, 128, 128, sink=True, seed=17)
    check(q, k, v, dout, sink, causal=True, what="no-key rows")
    q, k, v, dout, _ = make(2, 64, 64, 4, 2, 64, 64, seed=18)
    check(q, k, v, dout, window_size=(0, -1), what="left window only")


def test_forced_cudnn_names_its_reason():
    GlobalBackendManager.set_attn_backend("CUDNN")
    try:
        q = torch.randn(10, 4, 64, device="cuda", dtype=torch.bfloat16)
        cu = offsets([4, 6])
        with pytest.raises(NotImplementedError, match="CUDNN attention backend cannot run this forward: packed"):
            turbo.ops.flash_attn_varlen_func(q, q, q, cu, cu.clone(), 6, 6)  # separate lengths for q and k
    finally:
        GlobalBackendManager.set_attn_backend(None)


def test_cuda_graph_capture_of_forward_and_backward(backend):
    q, k, v, dout, sink = make(2, 256, 256, 8, 2, 128, 128, sink=True, seed=15)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    cu = offsets([100, 0, 156])
    packed = [t.detach().flatten(0, 1)[:256].clone().requires_grad_() for t in (q, k, v)]

    def step():
        out, lse = _attn(turbo.ops.flash_attn_func, *leaves[:3], sink=leaves[3], causal=True, return_lse=True)
        grads = _attn(torch.autograd.grad, out, leaves, dout)
        pout = flash_attn_varlen_on_turbo(*packed, cu, cu, 156, 156, window_size=(32, 32))
        pgrads = torch.autograd.grad(pout, packed, dout[0])
        return (out, lse, *grads, pout, *pgrads)

    # Two warm-up calls on a side stream: module loading and allocator growth stay out of the graph.
    graph, static = capture_graph(step, warmup=2)
    for seed in range(2):
        torch.manual_seed(100 + seed)
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


def test_torch_compile_fullgraph_forward_and_backward():
    q, k, v, dout, sink = make(2, 256, 256, 8, 2, 128, 128, sink=True, seed=16)

    def fn(q, k, v, s):
        out, lse = turbo.ops.flash_attn_func(q * 2.0, k, v, causal=True, window_size=(64, 0), sink=s, return_lse=True)
        return out + 1.0, lse

    compiled = torch.compile(fn, fullgraph=True)
    results = []
    for f in (compiled, fn):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sink)]
        out, lse = f(*leaves)
        grads = torch.autograd.grad(out, leaves, dout)
        results.append((out.detach(), lse, *grads))
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv", "dsink"), *results):
        assert_snr(got, want, MIN_SNR, f"compiled vs eager {name}")  # cuDNN's backward may use atomics


# ---- the seed example and the module ------------------------------------------------------------


def test_seed_example_large():
    """The examples page: [4, 4096, 32, 128] bf16, causal; forward against the reference computed
    per batch element and head group (the float32 scores would need 8 GB at once)."""
    b, s, h, d = 4, 4096, 32, 128
    torch.manual_seed(17)
    q, k, v = (torch.randn((b, s, h, d), dtype=torch.bfloat16, device="cuda") for _ in range(3))
    softmax_scale = q.shape[-1] ** (-0.5)
    o = turbo.ops.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=True)
    assert o.shape == (b, s, h, d) and o.dtype == torch.bfloat16
    for i in range(b):
        for h0 in range(0, h, 8):
            sl = (slice(i, i + 1), slice(None), slice(h0, h0 + 8))
            ref = reference(q[sl], k[sl], v[sl], softmax_scale=softmax_scale, causal=True)[0]
            assert_snr(o[sl], ref, MIN_SNR, f"batch {i} heads {h0}..{h0 + 7}")


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
def test_module_layouts_and_learnable_sink(layout):
    torch.manual_seed(18)
    m = turbo.modules.TurboAttention(causal=True, layout=layout, learnable_sink=True, num_heads=8, device="cuda")
    with torch.no_grad():
        m.sinks.normal_()
    q, k, v = _views(layout if layout != "bshd" else "qkv_packed", 2, 100, 8, 2, 64)
    perm = {"bshd": (0, 1, 2, 3), "sbhd": (1, 0, 2, 3), "bhsd": (0, 2, 1, 3)}[layout]
    q_in, k_in, v_in = (t.permute(*perm).detach().requires_grad_() for t in (q, k, v))  # the module's layout
    out = m(q_in, k_in, v_in)
    assert out.shape == q_in.shape
    dout = torch.randn_like(out)
    out.backward(dout)
    ref = reference(q, k, v, dout.permute(*perm), m.sinks, causal=True)
    assert_snr(out.permute(*perm), ref[0], MIN_SNR, "out")
    assert_snr(q_in.grad.permute(*perm), ref[2], MIN_SNR, "dq")
    assert_snr(m.sinks.grad, ref[5], MIN_SNR, "dsink")


# ---- transformers ----------------------------------------------------------------------------


def test_hf_attention_with_padding_and_packing():
    from types import SimpleNamespace

    from primus_turbo.pytorch.integrations.hf import primus_turbo_attention_forward

    torch.manual_seed(19)
    b, s, hq, hkv, d = 3, 50, 8, 2, 64
    query = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)  # transformers' [B, H, S, D]
    key = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    value = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    module = SimpleNamespace(is_causal=True)
    lens = [50, 31, 1]
    mask = torch.zeros(b, s, dtype=torch.bool, device="cuda")
    for i, n in enumerate(lens):
        mask[i, s - n :] = True  # left padding
    out, weights = primus_turbo_attention_forward(module, query, key, value, mask, scaling=0.1, sliding_window=20)
    assert weights is None and out.shape == (b, s, hq, d)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    for i, n in enumerate(lens):
        one = (slice(i, i + 1), slice(s - n, s))
        ref = reference(q[one], k[one], v[one], softmax_scale=0.1, causal=True, window_size=(19, 19))[0]
        assert_snr(out[one], ref, MIN_SNR, f"padded row {i}")
        assert out[i, : s - n].eq(0).all()
    # One packed row (padding-free batch): positions restart at 0 at every sequence start.
    t = sum(lens)
    query, key, value = (torch.randn(1, h, t, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    pos = torch.cat([torch.arange(n, device="cuda") for n in lens])[None]
    out, _ = primus_turbo_attention_forward(module, query, key, value, None, position_ids=pos)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    for a, n in zip([0, 50, 81], lens):
        one = (slice(0, 1), slice(a, a + n))
        ref = reference(q[one], k[one], v[one], causal=True)[0]
        assert_snr(out[one], ref, MIN_SNR, f"packed sequence at {a}")


def test_hf_model_with_primus_turbo_attention():
    transformers = pytest.importorskip("transformers")
    from primus_turbo.pytorch.integrations.hf import register_hf_attention

    register_hf_attention()
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=256,
    )
    torch.manual_seed(20)
    models = {}
    for impl in ("primus_turbo", "eager"):
        torch.manual_seed(20)
        models[impl] = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl)
        models[impl].to(device="cuda", dtype=torch.bfloat16).eval()
    models["eager"].load_state_dict(models["primus_turbo"].state_dict())
    ids = torch.randint(0, 512, (2, 96), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :30] = 0  # left padding
    with torch.no_grad():
        ours = models["primus_turbo"](input_ids=ids, attention_mask=mask).logits.float()
        eager = models["eager"](input_ids=ids, attention_mask=mask).logits.float()
    keep = mask.bool()
    assert snr_db(ours[keep], eager[keep]) >= 30.0  # two bf16 implementations through two layers


@pytest.mark.parametrize("choice", ["mma"])
def test_kernel_choice_matches_reference(choice):
    """PRIMUS_TURBO_ATTN_KERNEL (read once per process: a child runs attention_kernel_choice_check.py):
    "mma", the mma.sync kernels that the sm90 ones replace on Hopper. Forward and backward against
    the float32 reference."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = dict(
        os.environ, PRIMUS_TURBO_ATTN_KERNEL=choice, PYTHONPATH=f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    run = subprocess.run(
        [sys.executable, "-P", str(here / "attention_kernel_choice_check.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
