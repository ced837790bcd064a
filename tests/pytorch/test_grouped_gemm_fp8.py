"""turbo.ops.grouped_gemm_fp8 on the GPU.

Two references per result (ACCURACY.md): the per-group float64 product of the *dequantized* FP8
operands (kernel correctness: only FP32 accumulation and output rounding differ, gate 40 dB), and
the per-group float64 product of the original bf16 operands (end-to-end quality: E4M3 >= 25 dB,
E5M2 / HYBRID >= 20 dB) for forward, dgrad and wgrad. Group-size distributions (balanced, skewed,
empty experts, G = 1 .. 256), both weight layouts, partial 128-blocks, CUDA graphs replayed after
group sizes changed in place, torch.compile(fullgraph=True), pre-quantized operands.
"""

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from grouped_test_utils import capture_training_step
from grouped_test_utils import grouped_e2e_references as _e2e_references
from grouped_test_utils import group_lens as _lens
from grouped_test_utils import grouped64 as _grouped64
from grouped_test_utils import grouped_inputs as _inputs
from turbo_test_utils import check_weight_cache_over_microbatches, poison_allocator, snr_db

import primus_turbo.pytorch as turbo
from primus_turbo._core.lib import check, lib
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScaleDtype, ScalingGranularity
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import _dtypes, quantize_rows, quantize_weight

pytestmark = pytest.mark.gpu

TW, RW, BW = ScalingGranularity.TENSORWISE, ScalingGranularity.ROWWISE, ScalingGranularity.BLOCKWISE
MX = ScalingGranularity.MX_BLOCKWISE
E2E_GATE = {Format.E4M3: 25.0, Format.E5M2: 20.0, Format.HYBRID: 20.0}
KERNEL_GATE = 40.0


def cfg(g, fmt=Format.E4M3):
    if g == MX:
        return Float8QuantConfig(format=fmt, granularity=g, block_size=32, scale_dtype=ScaleDtype.E8M0)
    return Float8QuantConfig(format=fmt, granularity=g, block_size=128 if g == BW else None)


@pytest.fixture(scope="module", autouse=True)
def warm_modules():
    """Builds the kernel modules these tests use in parallel (one nvcc each) before the first call."""
    e4, e5, bf16, f16, f32 = 3, 4, 2, 1, 0
    jobs = [(x, y, d, rows, 0) for (x, y) in ((e4, e4), (e5, e5), (e5, e4)) for rows in (1, 128) for d in (bf16,)]
    jobs += [(e4, e4, f16, 128, 0), (e4, e4, f32, 128, 0)]  # TENSORWISE states B's scale per 128 rows
    jobs += [(x, y, bf16, 0, c) for (x, y) in ((e4, e4), (e5, e5), (e5, e4)) for c in (0, 1)]  # ROWWISE: row scales
    wjobs = [(e5, e4, bf16, 0), (e4, e5, bf16, 0), (e4, e4, bf16, 0), (e5, e5, bf16, 0)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(lib.pt_grouped_gemm_fp8_prepare, *j) for j in jobs]
        futures += [pool.submit(lib.pt_grouped_gemm_fp8_wgrad_prepare, *j) for j in wjobs]
        futures += [pool.submit(lib.pt_grouped_gemm_fp8_fast_prepare, e4, e4, bf16, c) for c in (0, 1)]
        for f in futures:
            check(f.result())


def _deq_rows(q, s):
    """q [R, C] FP8, s [R, ceil(C/128)] -> float64."""
    c = q.shape[-1]
    return q.double() * s.double().repeat_interleave(128, dim=-1)[..., :c]


def _deq_weight(q, s, rows):
    """q [G, N, K], s [G, N or ceil(N/128), kb] -> float64."""
    n, k = q.shape[1], q.shape[2]
    full = s.double().repeat_interleave(128, dim=-1)[..., :k]
    if rows == 128:
        full = full.repeat_interleave(128, dim=1)[:, :n]
    return q.double() * full


def _run_and_check(lens, k, n, g, gran, fmt, trans_b, dtype=torch.bfloat16, out_dtype=None):
    a, b = _inputs(lens, k, n, g, dtype, trans_b)
    a.requires_grad_(True)
    b.requires_grad_(True)
    poison_allocator(a.shape[0] * n * 4)
    out = turbo.ops.grouped_gemm_fp8(a, b, lens, trans_b=trans_b, out_dtype=out_dtype, config=cfg(gran, fmt))
    assert out.dtype == (out_dtype or dtype) and out.shape == (a.shape[0], n)
    assert torch.isfinite(out).all(), "forward: non-finite values (unwritten rows?)"
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    fwd_dtype, grad_dtype = _dtypes(fmt)

    # Kernel correctness: the float64 product of the operands as quantized.
    with torch.no_grad():
        qa, sa = quantize_rows(a.detach(), fwd_dtype, gran)
        qb, sb, rows = quantize_weight(b.detach(), fwd_dtype, gran, transpose=not trans_b)
        ref_q = _grouped64(_deq_rows(qa, sa), _deq_weight(qb, sb, rows), lens)
        snr = snr_db(out, ref_q)
        assert snr >= KERNEL_GATE, f"forward vs dequantized operands: SNR {snr:.1f} dB"
        qg, sg = quantize_rows(grad_out.to(dtype) if out.dtype != dtype else grad_out, grad_dtype, gran)
        qbt, sbt, rows_t = quantize_weight(b.detach(), fwd_dtype, gran, transpose=trans_b)
        ref_dq = _grouped64(_deq_rows(qg, sg), _deq_weight(qbt, sbt, rows_t), lens)
        snr = snr_db(a.grad, ref_dq)
        assert snr >= KERNEL_GATE - 5, f"dgrad vs dequantized operands: SNR {snr:.1f} dB"

    # End-to-end quality against the bf16 operands.
    ref_out, ref_da, ref_db = _e2e_references(a.detach(), b.detach(), lens, grad_out.to(dtype), trans_b)
    gate = E2E_GATE[fmt]
    for what, got, ref in (("forward", out, ref_out), ("dgrad", a.grad, ref_da), ("wgrad", b.grad, ref_db)):
        assert torch.isfinite(got).all(), f"{what}: non-finite values"
        snr = snr_db(got, ref)
        assert snr >= gate, f"{what} vs bf16 operands ({gran.name}, {fmt.name}): SNR {snr:.1f} dB < {gate}"
    # Experts with no tokens: exactly zero weight gradient.
    for e in torch.nonzero(lens.cpu() == 0).flatten().tolist():
        assert torch.count_nonzero(b.grad[e]) == 0, f"expert {e} has no tokens but a non-zero gradient"
    return out


@pytest.mark.parametrize("gran", [TW, RW, BW, MX])
@pytest.mark.parametrize("fmt", [Format.E4M3, Format.E5M2, Format.HYBRID])
@pytest.mark.parametrize("trans_b", [True, False])
def test_forward_dgrad_wgrad(gran, fmt, trans_b):
    _run_and_check(_lens("random", 4, 96, seed=1), 512, 256, 4, gran, fmt, trans_b)


@pytest.mark.parametrize(
    "dist,g,m_per,k,n",
    [
        ("balanced", 1, 200, 256, 128),
        ("balanced", 8, 128, 384, 256),
        ("skewed", 16, 64, 256, 384),
        ("zeros", 6, 50, 272, 144),  # partial 128-blocks along K and N (rowwise B scales per row)
        ("random", 32, 20, 128, 128),
        ("random", 256, 4, 128, 128),
    ],
)
@pytest.mark.parametrize("gran", [TW, RW, BW, MX])
def test_group_distributions(dist, g, m_per, k, n, gran):
    _run_and_check(_lens(dist, g, m_per, seed=g), k, n, g, gran, Format.E4M3, trans_b=True)


@pytest.mark.parametrize("gran", [TW, RW, BW])
def test_weight_rows_not_multiple_of_128(gran):
    # trans_b=False with K=272: no stack quantization of b [G, K, N] (its experts' rows are not whole
    # 128-row tiles): TENSORWISE / BLOCKWISE quantize it flat and transpose, ROWWISE transposes first
    # and quantizes again in the backward.
    _run_and_check(_lens("random", 3, 40, seed=3), 272, 128, 3, gran, Format.HYBRID, trans_b=False)


@pytest.mark.parametrize("out_dtype,gran", [(torch.float16, TW), (torch.float32, BW)])
def test_out_dtypes(out_dtype, gran):
    dtype = torch.float16 if out_dtype == torch.float16 else torch.bfloat16
    lens = _lens("random", 4, 64, seed=5)
    a, b = _inputs(lens, 256, 128, 4, dtype, True)
    out = turbo.ops.grouped_gemm_fp8(a, b, lens, out_dtype=out_dtype, config=cfg(gran))
    assert out.dtype == out_dtype
    assert snr_db(out, _grouped64(a, b, lens)) >= 25.0


def test_group_offs_and_non_contiguous_input():
    lens = _lens("random", 5, 64, seed=7)
    a, b = _inputs(lens, 256, 128, 5, torch.bfloat16, True)
    offs = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), torch.cumsum(lens, 0)])
    a_t = a.t().contiguous().t()  # same values, column-major view
    c = cfg(BW)
    ref = turbo.ops.grouped_gemm_fp8(a, b, lens, config=c)
    torch.testing.assert_close(turbo.ops.grouped_gemm_fp8(a, b, lens, offs, config=c), ref, rtol=0, atol=0)
    torch.testing.assert_close(turbo.ops.grouped_gemm_fp8(a_t, b, lens, config=c), ref, rtol=0, atol=0)


def test_sizes_that_overrun_are_clamped():
    """sum(group_lens) > M cannot be checked without a sync: groups are clipped to [0, M)."""
    lens = torch.tensor([40, 50, 60], device="cuda")
    a, b = _inputs(torch.tensor([40, 50, 10], device="cuda"), 128, 128, 3, torch.bfloat16, True)
    out = turbo.ops.grouped_gemm_fp8(a, b, lens, config=cfg(RW))
    torch.cuda.synchronize()
    ref = _grouped64(a, b, torch.tensor([40, 50, 10], device="cuda"))
    assert snr_db(out, ref) >= 25.0


def test_zero_sized():
    lens = torch.zeros(3, dtype=torch.int64, device="cuda")
    a = torch.randn(0, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(3, 64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = turbo.ops.grouped_gemm_fp8(a, b, lens, config=cfg(BW))
    assert out.shape == (0, 64)
    out.sum().backward()
    assert torch.count_nonzero(b.grad) == 0


@pytest.mark.parametrize("gran", [TW, RW, BW])
def test_prequantized_forward_matches(gran):
    lens = _lens("random", 4, 64, seed=9)
    a, b = _inputs(lens, 256, 128, 4, torch.bfloat16, True)
    g, n, k = b.shape
    q = turbo.ops.quantize_fp8
    e4 = torch.float8_e4m3fn
    if gran == BW:
        from primus_turbo.pytorch.core.low_precision import ScalingRecipe

        qa, sa = q(a, e4, gran, block_size=128, axis=-1)
        qb, sb = q(b.reshape(g * n, k), e4, gran, block_size=128, scaling_recipe=ScalingRecipe(use_2d_block=True))
        sb = sb.reshape(g, n // 128, -1)
    elif gran == RW:
        qa, sa = q(a, e4, gran, axis=-1)
        qb, sb = q(b.reshape(g * n, k), e4, gran, axis=-1)
        sb = sb.reshape(g, n, 1)
    else:
        qa, sa = q(a, e4, gran)
        qb, sb = q(b.reshape(g * n, k), e4, gran)
    out = turbo.ops.grouped_gemm_fp8(
        (qa, sa), (qb.reshape(g, n, k), sb), lens, out_dtype=torch.bfloat16, config=cfg(gran)
    )
    ref = turbo.ops.grouped_gemm_fp8(a, b, lens, config=cfg(gran))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("gran", [TW, RW, BW])
def test_cuda_graph_replay_with_new_group_sizes(gran):
    g, k, n = 4, 256, 256
    lens = torch.tensor([64, 32, 96, 64], device="cuda")
    a, b = _inputs(lens, k, n, g, torch.bfloat16, True)
    a.requires_grad_(True)
    b.requires_grad_(True)
    c = cfg(gran, Format.HYBRID)
    grad_out = torch.randn(a.shape[0], n, device="cuda", dtype=torch.bfloat16)
    graph, out = capture_training_step(lambda: turbo.ops.grouped_gemm_fp8(a, b, lens, config=c), a, b, grad_out)
    for new in ([64, 32, 96, 64], [0, 128, 0, 128], [256, 0, 0, 0], [1, 2, 3, 250]):
        lens.copy_(torch.tensor(new, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_da, ref_db = _e2e_references(a.detach(), b.detach(), lens, grad_out, True)
        assert snr_db(out, ref_out) >= 25.0, f"forward after replay with {new}"
        assert snr_db(a.grad, ref_da) >= 20.0, f"dgrad after replay with {new}"
        assert snr_db(b.grad, ref_db) >= 20.0, f"wgrad after replay with {new}"
        for e, length in enumerate(new):
            if length == 0:
                assert torch.count_nonzero(b.grad[e]) == 0


@pytest.mark.parametrize("gran", [RW, BW])
def test_torch_compile_fullgraph(gran):
    lens = _lens("random", 4, 64, seed=11)
    a, b = _inputs(lens, 256, 128, 4, torch.bfloat16, True)
    c = cfg(gran, Format.HYBRID)

    def fn(x, w, gl):
        return torch.nn.functional.gelu(turbo.ops.grouped_gemm_fp8(x, w, gl, config=c))

    compiled = torch.compile(fn, fullgraph=True)
    a1, b1 = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    a2, b2 = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    out_c = compiled(a1, b1, lens)
    out_e = fn(a2, b2, lens)
    # The GEMMs are the same kernels; only the fused gelu may round differently.
    torch.testing.assert_close(out_c, out_e, rtol=1e-2, atol=1e-2)
    go = torch.randn_like(out_e)
    out_c.backward(go)
    out_e.backward(go)
    torch.testing.assert_close(a1.grad, a2.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(b1.grad, b2.grad, rtol=1e-2, atol=1e-2)


def test_num_cu_limits_the_grid_not_the_result():
    lens = _lens("random", 6, 100, seed=13)
    a, b = _inputs(lens, 256, 256, 6, torch.bfloat16, True)
    c = cfg(BW)
    ref = turbo.ops.grouped_gemm_fp8(a, b, lens, config=c)
    # Every tile is computed the same way whichever SM runs it.
    torch.testing.assert_close(turbo.ops.grouped_gemm_fp8(a, b, lens, config=c, num_cu=8), ref, rtol=0, atol=0)


# ---- the experimental FP8 wgrad (PRIMUS_TURBO_GROUPED_GEMM_FP8_WGRAD=1) -------------------------


@pytest.fixture
def fp8_wgrad(monkeypatch):
    monkeypatch.setattr(sys.modules["primus_turbo.pytorch.ops.grouped_gemm_fp8"], "FP8_WGRAD", True)


@pytest.mark.parametrize("gran", [TW, RW, BW])
@pytest.mark.parametrize("fmt", [Format.E4M3, Format.E5M2, Format.HYBRID])
@pytest.mark.parametrize("trans_b", [True, False])
def test_fp8_wgrad(fp8_wgrad, gran, fmt, trans_b):
    _run_and_check(_lens("random", 5, 90, seed=17), 384, 256, 5, gran, fmt, trans_b)


@pytest.mark.parametrize(
    "dist,g,m_per,k,n",
    [
        ("balanced", 1, 300, 256, 128),
        ("skewed", 16, 64, 256, 384),
        ("zeros", 6, 50, 272, 144),
        ("random", 64, 9, 128, 128),
    ],
)
@pytest.mark.parametrize("gran", [TW, BW])
def test_fp8_wgrad_group_distributions(fp8_wgrad, dist, g, m_per, k, n, gran):
    _run_and_check(_lens(dist, g, m_per, seed=g + 1), k, n, g, gran, Format.HYBRID, trans_b=True)


def test_fp8_wgrad_with_group_offs_and_cuda_graph(fp8_wgrad):
    g, k, n = 4, 256, 256
    lens = torch.tensor([64, 32, 96, 64], device="cuda")
    a, b = _inputs(lens, k, n, g, torch.bfloat16, True)
    offs = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), torch.cumsum(lens, 0)])
    a.requires_grad_(True)
    b.requires_grad_(True)
    c = cfg(BW, Format.HYBRID)
    grad_out = torch.randn(a.shape[0], n, device="cuda", dtype=torch.bfloat16)
    turbo.ops.grouped_gemm_fp8(a, b, lens, offs, config=c).backward(grad_out)
    with_offs = b.grad.clone()
    a.grad = b.grad = None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            a.grad = b.grad = None
            turbo.ops.grouped_gemm_fp8(a, b, lens, config=c).backward(grad_out)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(b.grad, with_offs, rtol=0, atol=0)
    graph = torch.cuda.CUDAGraph()
    a.grad = b.grad = None
    with torch.cuda.graph(graph):
        turbo.ops.grouped_gemm_fp8(a, b, lens, config=c).backward(grad_out)
    for new in ([64, 32, 96, 64], [0, 128, 0, 128], [256, 0, 0, 0], [1, 2, 3, 250]):
        lens.copy_(torch.tensor(new, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        _, _, ref_db = _e2e_references(a.detach(), b.detach(), lens, grad_out, True)
        assert snr_db(b.grad, ref_db) >= 20.0, f"FP8 wgrad after replay with {new}"
        for e, length in enumerate(new):
            if length == 0:
                assert torch.count_nonzero(b.grad[e]) == 0


def test_rows_no_group_covers_are_zero_and_debug_check(monkeypatch):
    """As for the bf16 op: rows past the last group are zeros; PRIMUS_TURBO_CHECK_GROUP_LENS=1
    rejects negative lengths and sums larger than the rows."""
    a = torch.randn(100, 128, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(3, 64, 128, dtype=torch.bfloat16, device="cuda")
    lens = torch.tensor([30, 0, 20], dtype=torch.int64, device="cuda")
    poison_allocator(100 * 64 * 2)
    out = turbo.ops.grouped_gemm_fp8(a, b, lens)
    assert (out[50:] == 0).all(), "rows no group covers must be zero"
    assert snr_db(out[:30].float(), (a[:30].double() @ b[0].double().t()).float()) > 20
    monkeypatch.setenv("PRIMUS_TURBO_CHECK_GROUP_LENS", "1")
    with pytest.raises(ValueError, match="is negative"):
        turbo.ops.grouped_gemm_fp8(a, b, torch.tensor([-1, 50, 0], dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="more than the 100 rows"):
        turbo.ops.grouped_gemm_fp8(a, b, torch.tensor([50, 50, 1], dtype=torch.int64, device="cuda"))


@pytest.mark.parametrize("g", [RW, TW], ids=lambda v: v.name)
@pytest.mark.parametrize("lens", [[700, 0, 300, 1048], [0, 0, 2048, 0], [3, 29, 0, 1]], ids=["skewed", "one_group",
                                                                                           "odd_starts"])
def test_fast_accum_changes_the_forward_product_only(lens, g):
    # ROWWISE runs the row-scaled kernel, and TENSORWISE does with fast_accum: the forward then skips
    # the FP32 promotion of the partial sums, while the dgrad (and the bf16 wgrad) are the default
    # config's bit for bit. Odd group starts: each group's row scales start anywhere.
    torch.manual_seed(5)
    k, n = 2048, 384
    group_lens = torch.tensor(lens, dtype=torch.int64, device="cuda")
    a = torch.randn(sum(lens), k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(len(lens), n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    dy = torch.randn(sum(lens), n, device="cuda", dtype=torch.bfloat16)
    results = {}
    for fast in (False, True):
        config = Float8QuantConfig(format=Format.HYBRID, granularity=g, fast_accum=fast)
        ai, bi = a.clone().requires_grad_(), b.clone().requires_grad_()
        out = turbo.ops.grouped_gemm_fp8(ai, bi, group_lens, trans_b=True, config=config)
        out.backward(dy)
        results[fast] = (out.detach(), ai.grad, bi.grad)
    (full, da, db), (fast, da_fast, db_fast) = results[False], results[True]
    assert torch.equal(da, da_fast) and torch.equal(db, db_fast), "the backward changed with fast_accum"
    starts = [0] + list(torch.tensor(lens).cumsum(0)[:-1])
    ref = torch.cat([a[s:s + m].double() @ b[g].double().t() for g, (s, m) in enumerate(zip(starts, lens))])
    for got in (full, fast):
        assert snr_db(got, ref) >= E2E_GATE[Format.E4M3]
    assert snr_db(fast, full.double()) >= 35.0


def _uncached_and_cached(groups: int, k: int, n: int, config):
    """Two bf16 GroupedLinear layers with the same weights: one quantizing per call, one caching."""
    ref = turbo.modules.GroupedLinear(groups, k, n, device="cuda", dtype=torch.bfloat16, config=config)
    cached = turbo.modules.GroupedLinear(groups, k, n, device="cuda", dtype=torch.bfloat16, config=config,
                                         cache_quantized_weight=True)
    cached.load_state_dict(ref.state_dict())
    return ref, cached


def _layer_step(layer, x, lens, dy, x_grad: bool):
    """(output, x's gradient or None, the weight's gradient) of one forward and backward of
    ``layer`` on a copy of ``x``; the layer's weight gradient is cleared after."""
    xi = x.clone().requires_grad_(x_grad)
    y = layer(xi, lens)
    y.backward(dy)
    dw, layer.weight.grad = layer.weight.grad.clone(), None
    return y.detach(), xi.grad, dw


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("g", [ScalingGranularity.TENSORWISE, ScalingGranularity.ROWWISE, ScalingGranularity.BLOCKWISE],
                         ids=lambda v: v.name)
def test_grouped_linear_fp8_weight_cache_matches_and_refreshes(g, native, monkeypatch):
    # Two steps of two micro-batches: the cached layer quantizes its experts' weights once per step
    # and matches the layer that quantizes per call, in outputs and accumulated gradients. native:
    # the cached copies feed the native training op (with the C++ autograd); python: the
    # QuantizedTensorPair path.
    import primus_turbo.pytorch.modules._weight_cache as wc
    import primus_turbo.pytorch.modules.grouped_linear as gl
    from primus_turbo.pytorch.core import native as native_core

    if native and not native_core.CPP_AUTOGRAD:
        pytest.skip("the C++ autograd library is not loaded")
    calls, native_calls = [], []
    gf = sys.modules["primus_turbo.pytorch.ops.grouped_gemm_fp8"]
    rows_form = native and g == ScalingGranularity.ROWWISE  # both copies from one native pass
    # The quantization counted: create_quantized_weight, or grouped_weight_rows for the ROWWISE form.
    module, name = (gf, "grouped_weight_rows") if rows_form else (wc, "create_quantized_weight")
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    native_name = "grouped_gemm_fp8_rows_cached" if rows_form else "grouped_gemm_fp8_cached_weight"
    real_native = getattr(gl, native_name)
    monkeypatch.setattr(gl, native_name, lambda *a, **k: native_calls.append(1) or real_native(*a, **k))
    if not native:
        monkeypatch.setattr(gl, "cached_weight_native_ok", lambda *a: False)
    torch.manual_seed(11)
    ref, cached = _uncached_and_cached(4, 256, 128, cfg(g, Format.HYBRID))
    lens = torch.tensor([40, 0, 72, 16], dtype=torch.int64, device="cuda")
    check_weight_cache_over_microbatches(
        ref, cached, lambda: torch.randn(128, 256, device="cuda", dtype=torch.bfloat16),
        lambda layer, x: layer(x, lens), calls,
    )
    assert bool(native_calls) == native


def test_grouped_linear_rows_cache_is_the_uncached_layer_bit_for_bit():
    """ROWWISE cached weights come from one native pass in the kernels' own form (one scale a row,
    b_rows / d_rows 0): the layer gives the uncached layer's output and gradients bit for bit, with
    an empty expert and a frozen input too; the copies have the documented shapes."""
    from primus_turbo.pytorch.core import native as native_core
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_weight_rows

    if not native_core.CPP_AUTOGRAD:
        pytest.skip("the C++ autograd library is not loaded")
    torch.manual_seed(5)
    ref, cached = _uncached_and_cached(3, 256, 384, cfg(RW, Format.HYBRID))
    q, s, q_t, s_t = grouped_weight_rows(cached.weight, torch.float8_e4m3fn)
    assert (q.shape, s.shape, q_t.shape, s_t.shape) == ((3, 384, 256), (3, 384), (3, 256, 384), (3, 256))
    lens = torch.tensor([100, 0, 92], dtype=torch.int64, device="cuda")
    for x_grad in (True, False):
        x = torch.randn(192, 256, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(192, 384, device="cuda", dtype=torch.bfloat16)
        (yr, dxr, dwr), (yc, dxc, dwc) = (_layer_step(layer, x, lens, dy, x_grad) for layer in (ref, cached))
        assert torch.equal(yc, yr) and torch.equal(dwc, dwr)
        assert (dxr is None and dxc is None) or torch.equal(dxc, dxr)
    assert cached._weight_rows is not None
    cached.invalidate_weight_cache()
    assert cached._weight_rows is None


@pytest.mark.parametrize("g", [ScalingGranularity.TENSORWISE, RW, ScalingGranularity.BLOCKWISE], ids=lambda v: v.name)
def test_grouped_linear_cached_takes_what_the_uncached_layer_takes(g):
    """A cached layer takes every input the uncached one takes, with the same results: a batch with
    no tokens (an expert-parallel rank that got none: an empty output, a zero weight gradient) and,
    at BLOCKWISE, experts whose rows are not whole 128-row blocks (out_features 192: the cached
    form cannot hold their blocks, so the layer quantizes per call)."""
    torch.manual_seed(7)
    ref, cached = _uncached_and_cached(3, 256, 192, cfg(g, Format.HYBRID))
    for lens in ([0, 0, 0], [40, 0, 56]):
        rows = sum(lens)
        lens = torch.tensor(lens, dtype=torch.int64, device="cuda")
        x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(rows, 192, device="cuda", dtype=torch.bfloat16)
        (yr, dxr, dwr), (yc, dxc, dwc) = (_layer_step(layer, x, lens, dy, True) for layer in (ref, cached))
        assert yc.shape == yr.shape == (rows, 192) and dxc.shape == (rows, 256)
        if rows == 0:
            assert dwc.abs().max().item() == 0 and dwr.abs().max().item() == 0
        else:
            assert snr_db(yc, yr) >= 40.0 and snr_db(dxc, dxr) >= 40.0 and snr_db(dwc, dwr) >= 40.0
    assert cached._weight_cached_now() == (g != ScalingGranularity.BLOCKWISE)
    assert cached.step_refresh() == {ScalingGranularity.TENSORWISE: "amax", RW: None, BW: None}[g]


def test_native_forward_fake_matches_the_op_blockwise_k_not_multiple_of_128():
    """The training forward's fake gives the dgrad copy's block scales the real op's shape,
    [G, ceil(K/128), N/128], when K (here 208) is not a multiple of 128 (trans_b)."""
    gf = sys.modules["primus_turbo.pytorch.ops.grouped_gemm_fp8"]
    a = torch.randn(64, 208, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, 256, 208, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([30, 34], dtype=torch.int64, device="cuda")
    args = (a, b, lens, None, True, torch.bfloat16, torch.float8_e4m3fn, gf._NATIVE_GRANULARITY[BW], 0, True)
    real = gf._fwd_op(*args)
    fake = gf._fwd_fake(*args)
    assert [tuple(t.shape) for t in real] == [tuple(t.shape) for t in fake]
    assert tuple(real[2].shape) == (2, 2, 2)


def test_grouped_weight_rows_checks():
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_weight_rows

    w = torch.randn(2, 100, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 128"):
        grouped_weight_rows(w, torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="out_dtype"):
        grouped_weight_rows(torch.randn(2, 128, 64, device="cuda", dtype=torch.bfloat16), torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        grouped_weight_rows(torch.randn(2, 128, 64, device="cuda"), torch.float8_e4m3fn)


@pytest.mark.parametrize("trans_b", [True, False])
@pytest.mark.parametrize("gran", [TW, RW, BW])
def test_forward_without_grad_equals_training_forward(gran, trans_b):
    """A call with no backward to follow (no_grad, or inputs without requires_grad) runs the
    forward op alone (no autograd node, no dgrad copy of the weight) and gives the training
    forward's product bit for bit."""
    lens = torch.tensor([128, 0, 64, 200], device="cuda")
    a, b = _inputs(lens, 256, 384, 4, torch.bfloat16, trans_b)
    train = turbo.ops.grouped_gemm_fp8(a.requires_grad_(True), b.requires_grad_(True), lens, trans_b=trans_b,
                                       config=cfg(gran))
    assert train.grad_fn is not None
    with torch.no_grad():
        infer = turbo.ops.grouped_gemm_fp8(a, b, lens, trans_b=trans_b, config=cfg(gran))
    plain = turbo.ops.grouped_gemm_fp8(a.detach(), b.detach(), lens, trans_b=trans_b, config=cfg(gran))
    assert infer.grad_fn is None and plain.grad_fn is None
    assert torch.equal(infer, train.detach()) and torch.equal(plain, train.detach())


@pytest.mark.parametrize("gran", [RW, BW])
def test_every_config_gives_the_same_product(gran):
    """Each autotune candidate (cooperative 128x128 and pingpong 64x128 tiles, 1x1 and 1x2 clusters)
    on one set of quantized operands: skewed groups, an empty one, partial tiles. A tile's K blocks
    are accumulated in the same order whatever its shape, so the products agree to rounding."""
    from primus_turbo.pytorch.core.backend import BackendType
    from primus_turbo.pytorch.core.tensor_bridge import to_pt
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import GroupedGemmFp8Problem

    lens = torch.tensor([70, 0, 200, 33, 129], dtype=torch.int64, device="cuda")
    g, n, k, rows = 5, 384, 640, int(lens.sum())
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
    qa, sa = quantize_rows(a, torch.float8_e4m3fn, gran)
    qb, sb, b_scale_rows = quantize_weight(w, torch.float8_e4m3fn, gran, False)
    outs = []
    for config in range(lib.pt_grouped_gemm_fp8_num_configs(BackendType.CUTLASS.value)):
        out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        pts = [to_pt(t) for t in (qa, sa, qb, sb.contiguous(), lens, out)]
        GroupedGemmFp8Problem(pts, None, b_scale_rows, 0, False, rows, a.device).run(BackendType.CUTLASS, config)
        outs.append(out)
    ref = _deq_rows(qa, sa)
    deq_b = qb.double() * (sb.double().repeat_interleave(b_scale_rows, 1)[:, :n].repeat_interleave(128, 2)[..., :k])
    starts = [0] + torch.cumsum(lens, 0).tolist()
    expect = torch.cat([ref[starts[i]:starts[i + 1]] @ deq_b[i].t() for i in range(g)])
    for config, out in enumerate(outs):
        assert snr_db(out.double(), expect) >= KERNEL_GATE, f"config {config}"
        torch.testing.assert_close(out, outs[0], rtol=1e-2, atol=1e-2, msg=f"config {config} against config 0")


def test_given_weight_copies_on_another_device_are_refused_by_name():
    """The weight copies a cache passes (b_q / b_s, d_q / d_s) are device-checked with the other
    arguments before any launch."""
    from primus_turbo.pytorch.core import native as native_core
    from primus_turbo.pytorch.ops.gemm_fp8 import _NATIVE_GRANULARITY
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_weight_rows

    a = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([32, 32], dtype=torch.int64, device="cuda")
    q, s, q_t, s_t = grouped_weight_rows(w, torch.float8_e4m3fn)
    fwd = native_core.raises_python_errors(torch.ops.primus_turbo.grouped_gemm_fp8_fwd.default)
    code = _NATIVE_GRANULARITY[RW]
    with pytest.raises(ValueError, match="'b_s' is on cpu"):
        fwd(a, w, lens, None, True, torch.bfloat16, torch.float8_e4m3fn, code, 0, True, q, s.cpu(), 0, False)
    out = fwd(a, w, lens, None, True, torch.bfloat16, torch.float8_e4m3fn, code, 0, True, q, s, 0, False)[0]
    bwd = native_core.raises_python_errors(torch.ops.primus_turbo.grouped_gemm_fp8_bwd.default)
    empty = torch.empty(0, device="cuda")
    with pytest.raises(ValueError, match="'d_q' is on cpu"):
        bwd(torch.randn_like(out), a, w, empty, empty, lens, None, True, torch.float8_e5m2, torch.float8_e4m3fn, code,
            0, True, False, q_t.cpu(), s_t, 0)


def test_weight_cache_is_not_read_under_cuda_graph_capture():
    """A captured graph would read copies the next optimizer step replaces: under capture the layer
    quantizes per call."""
    layer = turbo.modules.GroupedLinear(2, 256, 128, device="cuda", dtype=torch.bfloat16, config=cfg(RW),
                                        cache_quantized_weight=True)
    assert layer._weight_cached_now()
    graph, x = torch.cuda.CUDAGraph(), torch.zeros(4, device="cuda")
    with torch.cuda.graph(graph):
        x.add_(1)
        assert not layer._weight_cached_now()
    assert layer._weight_cached_now()
