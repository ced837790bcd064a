"""turbo.ops.gemm_fp4 (MXFP4, emulated on Hopper through the FP8 tensor cores) on the GPU.

Two references, as for gemm_fp8: the GEMM against the float64 product of its dequantized MXFP4
operands (the emulation must be exact up to FP32 accumulation), and forward / dgrad / wgrad of the
whole op against float64 products of the bf16 operands (FP4 gate: >= 10 dB), for every recipe
switch (2-D weight blocks, Hadamard transform of the wgrad operands, stochastic rounding)."""

import warnings

import pytest
import torch
from turbo_test_utils import capture_graph, poison_allocator, snr_db

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float4QuantConfig, ScalingGranularity, ScalingRecipe

pytestmark = pytest.mark.gpu

MX = ScalingGranularity.MX_BLOCKWISE
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]
OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (M, N, K): K = 48 and N = 272 are not multiples of 32 / 128 (partial blocks), a large one.
SHAPES = [(128, 272, 1040), (256, 512, 384), (32, 48, 48), (2048, 4096, 2048)]
GATE = 10.0
RECIPES = {
    "paper": None,  # the default: 2-D weight blocks + RHT + SR
    "plain": ScalingRecipe(),
    "2d": ScalingRecipe(use_2d_block=True),
    "rht": ScalingRecipe(use_rht=True),
    "sr": ScalingRecipe(use_sr=True),
}


def config(recipe_name="paper"):
    return Float4QuantConfig(scaling_recipe_for_trans=RECIPES[recipe_name])


def references(a, b, grad, ta, tb):
    a64 = a.detach().double().t() if ta else a.detach().double()
    b64 = b.detach().double().t() if tb else b.detach().double()
    g64 = grad.double()
    ref = a64 @ b64
    da = g64 @ b64.t()
    db = a64.t() @ g64
    return ref, (da.t() if ta else da), (db.t() if tb else db)


# ---- GEMM only: against the dequantized MXFP4 operands ----------------------------------------


def fp4_operand(x, two_d=False):
    recipe = ScalingRecipe(use_2d_block=two_d)
    q, s = turbo.ops.quantize_fp4(x, axis=-1, scaling_recipe=recipe)
    ref = turbo.ops.dequantize_fp4(q, torch.float32, axis=-1, scale_inv=s, scaling_recipe=recipe).double()
    return q, s, ref


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("two_d", [False, True], ids=["b1d", "b2d"])
@pytest.mark.parametrize("shape", SHAPES + [(15, 48, 272)], ids=lambda s: "x".join(map(str, s)))
def test_gemm_matches_dequantized_fp4_product(shape, two_d, out_dtype):
    m, n, k = shape
    torch.manual_seed(hash(("fp4", shape)) % 2**31)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    a[:, : k // 2] *= 500.0  # sub-blocks of very different scales inside one 128-block
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    qa, sa, ra = fp4_operand(a)
    qb, sb, rb = fp4_operand(b, two_d)
    poison_allocator(m * n * out_dtype.itemsize)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # M=15: cuBLASLt refuses, CUTLASS takes it (warned)
        out = turbo.ops.gemm_fp4((qa, sa), (qb, sb), trans_b=True, out_dtype=out_dtype)
    assert out.shape == (m, n) and out.dtype == out_dtype and torch.isfinite(out).all()
    floor = {torch.float32: 60.0, torch.float16: 50.0, torch.bfloat16: 40.0}[out_dtype]
    snr = snr_db(out, ra @ rb.t())
    assert snr >= floor, f"SNR {snr:.1f} dB against the dequantized FP4 product"


def test_fp4_expansion_reproduces_the_dequantization():
    from primus_turbo.pytorch.ops import _mx_blocks

    x = torch.randn(128, 1056, device="cuda", dtype=torch.bfloat16)
    x[:, ::5] *= 100.0
    for two_d in (False, True):
        q, s, ref = fp4_operand(x, two_d)
        q8, s8 = _mx_blocks.mx_fp4_to_1x128(q, s)
        got = q8.double() * s8.double().repeat_interleave(128, 1)[:, : q8.shape[1]]  # K padded to 128
        block_max = ref.abs().amax(1, keepdim=True)
        assert ((got - ref).abs() <= block_max * 2.0**-17).all()


# ---- end to end: forward, dgrad, wgrad ---------------------------------------------------------


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("trans", TRANSPOSES, ids=lambda t: f"ta{int(t[0])}tb{int(t[1])}")
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: "x".join(map(str, s)))
def test_forward_dgrad_wgrad_gates(shape, trans, out_dtype):
    m, n, k = shape
    ta, tb = trans
    torch.manual_seed(hash((shape, trans)) % 2**31)
    a = torch.randn((k, m) if ta else (m, k), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = (torch.randn((n, k) if tb else (k, n), device="cuda", dtype=torch.bfloat16) / k**0.5).requires_grad_()
    grad = torch.randn(m, n, device="cuda", dtype=out_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = turbo.ops.gemm_fp4(a, b, ta, tb, out_dtype=out_dtype, config=config())
        out.backward(grad)
    assert out.dtype == out_dtype and out.shape == (m, n)
    assert a.grad.dtype == a.dtype and b.grad.dtype == b.dtype
    ref, ref_da, ref_db = references(a, b, grad, ta, tb)
    for what, got, want in (("forward", out, ref), ("dgrad", a.grad, ref_da), ("wgrad", b.grad, ref_db)):
        assert torch.isfinite(got).all(), f"{what}: non-finite values"
        snr = snr_db(got, want)
        assert snr >= GATE, f"{what}: SNR {snr:.1f} dB < {GATE} dB"


@pytest.mark.parametrize("recipe", list(RECIPES), ids=str)
def test_each_recipe_switch_meets_the_gate(recipe):
    m, n, k = 256, 384, 512
    torch.manual_seed(7)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5).requires_grad_()
    grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    out = turbo.ops.gemm_fp4(a, b, trans_b=True, config=config(recipe))
    out.backward(grad)
    ref, ref_da, ref_db = references(a, b, grad, False, True)
    for what, got, want in (("forward", out, ref), ("dgrad", a.grad, ref_da), ("wgrad", b.grad, ref_db)):
        assert snr_db(got, want) >= GATE, f"{recipe} {what}: SNR {snr_db(got, want):.1f} dB"


def test_recipe_switches_change_what_they_should():
    m, n, k = 128, 256, 512
    torch.manual_seed(8)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

    def run(recipe):
        x, w = a.clone().requires_grad_(), b.clone().requires_grad_()
        y = turbo.ops.gemm_fp4(x, w, trans_b=True, config=config(recipe))
        y.backward(grad)
        return y, x.grad, w.grad

    plain, again, rht, sr, sr2 = run("plain"), run("plain"), run("rht"), run("sr"), run("sr")
    for p, q in zip(plain, again):  # deterministic without SR
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    torch.testing.assert_close(rht[0], plain[0], rtol=0, atol=0)  # RHT: the wgrad operands only
    torch.testing.assert_close(rht[1], plain[1], rtol=0, atol=0)
    assert not torch.equal(rht[2], plain[2])
    torch.testing.assert_close(sr[0], plain[0], rtol=0, atol=0)  # SR: the gradients only
    assert not torch.equal(sr[1], sr2[1])  # a new seed per eager call


def test_stochastic_rounding_is_unbiased_on_average():
    m, n, k = 64, 128, 256
    torch.manual_seed(9)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    acc = torch.zeros(m, k, device="cuda", dtype=torch.float64)
    runs = 32
    for _ in range(runs):
        a.grad = None
        turbo.ops.gemm_fp4(a, b, trans_b=True, config=config("sr")).backward(grad)
        acc += a.grad.double()
    single = snr_db(a.grad, grad.double() @ b.detach().double())
    averaged = snr_db(acc / runs, grad.double() @ b.detach().double())
    assert averaged > single + 2.0, f"averaged {averaged:.1f} dB vs single {single:.1f} dB"


def test_large_shape():
    m, n, k = SHAPES[3]
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5).requires_grad_()
    out = turbo.ops.gemm_fp4(a, b, trans_b=True)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref, ref_da, ref_db = references(a, b, grad, False, True)
    assert snr_db(out, ref) >= GATE and snr_db(a.grad, ref_da) >= GATE and snr_db(b.grad, ref_db) >= GATE


def test_non_contiguous_inputs():
    base = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    a = base[:, ::2]  # [256, 512], strided
    b = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16).t()  # [384, 512] column-major view
    out = turbo.ops.gemm_fp4(a, b, trans_b=True, config=config("plain"))
    ref = turbo.ops.gemm_fp4(a.contiguous(), b.contiguous(), trans_b=True, config=config("plain"))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert snr_db(out, a.double() @ b.double().t()) >= GATE


def test_cuda_graph_capture_forward_backward():
    cfg = Float4QuantConfig(scaling_recipe_for_trans=ScalingRecipe(use_2d_block=True, use_rht=True))  # no SR
    x = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        x.grad = None
        w.grad = None
        y = turbo.ops.gemm_fp4(x, w, trans_b=True, config=cfg)
        y.float().square().sum().backward()
        return y

    eager = step().detach().clone()
    eager_dx, eager_dw = x.grad.clone(), w.grad.clone()
    graph, y = capture_graph(step)  # x.grad, w.grad: the graph's gradients
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, eager, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, eager_dx, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, eager_dw, rtol=0, atol=0)


def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    cfg = config("2d")  # no SR: compiled and eager draw the same numbers

    def fn(x, w):
        return turbo.ops.gemm_fp4(x, w, trans_b=True, config=cfg)

    x = torch.randn(4 * 64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = torch.compile(fn, fullgraph=True)(x, w)
    y.float().square().sum().backward()
    dx, dw = x.grad.clone(), w.grad.clone()
    x.grad = None
    w.grad = None
    y_eager = fn(x, w)
    y_eager.float().square().sum().backward()
    for got, want in ((y, y_eager), (dx, x.grad), (dw, w.grad)):
        assert snr_db(got, want) >= 40.0
    # The default recipe (with SR) compiles too.
    torch._dynamo.reset()
    y = torch.compile(lambda x, w: turbo.ops.gemm_fp4(x, w, trans_b=True), fullgraph=True)(x, w)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_zero_size():
    a = torch.randn(0, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    assert turbo.ops.gemm_fp4(a, b, trans_b=True).shape == (0, 32)


# ---- the restatement kernel against the plain-torch reference ------------------------------------


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "fp4", "fp4_2d"])
@pytest.mark.parametrize("shape", [(256, 1040), (33, 48), (1, 16), (300, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_restatement_kernel_matches_torch_reference_bitwise(fmt, shape):
    from primus_turbo.pytorch.ops import _mx_blocks

    rows, k = shape
    torch.manual_seed(hash((fmt, shape)) % 2**31)
    kb32 = -(-k // 32)
    if fmt.startswith("fp4"):
        q = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, device="cuda")
        reference = _mx_blocks.reference_mx_fp4_to_1x128
    else:
        dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
        q = (torch.randn(rows, k, device="cuda") * 100).clamp(-440, 440).to(dtype)  # no NaN bytes
        reference = _mx_blocks.reference_mx_fp8_to_1x128
    srows = -(-rows // 32) if fmt == "fp4_2d" else rows
    s = torch.randint(100, 150, (srows, kb32), dtype=torch.uint8, device="cuda")
    s[:, ::3] = 0  # extreme spreads: whole sub-blocks flushed to zero
    got_q, got_s = _mx_blocks._restate_op(q, s)
    want_q, want_s = reference(q, s)
    assert got_q.dtype == want_q.dtype and got_q.shape == want_q.shape
    assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
    torch.testing.assert_close(got_s, want_s, rtol=0, atol=0)
