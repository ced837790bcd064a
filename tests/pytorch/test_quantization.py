"""FP8 / FP4 quantization on the GPU against torch references of the same math (quant_reference.py),
through the unpadded layouts the GEMMs read (the public functions' padded MX layouts: their own test):
every granularity x axis x FP8 dtype x input dtype on odd shapes, quantized values within one unit
in the last place of the target format (in practice bitwise), scales exact, dequantization and the
round trip, with_trans against two separate calls, FP4 recipes (2-D blocks, RHT, stochastic
rounding), empty inputs, CUDA graphs and torch.compile."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import quant_reference as R
import torch
from turbo_test_utils import capture_graph, poison_allocator

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.ops import quantization as QZ
from primus_turbo.pytorch.core.low_precision import ScalingGranularity as G
from primus_turbo.pytorch.core.low_precision import ScalingRecipe

pytestmark = pytest.mark.gpu

IN_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]
FP4 = turbo.float4_e2m1fn_x2 or torch.uint8
SHAPES = [(1, 77), (127, 200), (4097, 4096), (256, 128), (129, 4097)]
# (granularity, block_size, axis, 2-D): every way quantize_fp8 can group elements.
FP8_CONFIGS = [
    (G.TENSORWISE, None, None, False),
    (G.ROWWISE, None, -1, False),
    (G.ROWWISE, None, 0, False),
    (G.BLOCKWISE, 128, -1, False),
    (G.BLOCKWISE, 128, 0, False),
    (G.BLOCKWISE, 128, None, True),
    (G.MX_BLOCKWISE, 32, -1, False),
    (G.MX_BLOCKWISE, 32, 0, False),
]
CONFIG_IDS = ["tensor", "row-1", "row0", "block-1", "block0", "block2d", "mx-1", "mx0"]


@pytest.fixture(scope="module", autouse=True)
def compile_modules_in_parallel():
    """Builds every module these tests need at once (the JIT cache makes later calls cheap)."""
    from primus_turbo._core.lib import check, lib
    from primus_turbo.pytorch.core.tensor_bridge import _DTYPE_CODES

    jobs = [(_DTYPE_CODES[i], _DTYPE_CODES[q]) for i in IN_DTYPES for q in FP8_DTYPES + [FP4]]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        list(pool.map(lambda j: check(lib.pt_quantize_prepare(*j)), jobs))


def groups(g, block, axis, two_d, m, k):
    """(gm, gk): the rows x columns an element's scale covers."""
    if g == G.TENSORWISE:
        return m, k
    if g == G.ROWWISE:
        return (1, k) if axis == -1 else (m, 1)
    if two_d:
        return block, block
    return (1, block) if axis == -1 else (block, 1)


def make_x(m, k, dtype, seed):
    torch.manual_seed(seed)
    # Rows of different magnitudes so that per-group scales differ.
    x = torch.randn(m, k, device="cuda", dtype=torch.float32) * torch.exp2(torch.randint(-6, 7, (m, 1), device="cuda"))
    return x.to(dtype)


def reference_fp8(x, dtype, gm, gk, mx):
    """(q_ref, scale grid [ceil(M/gm), ceil(K/gk)] (fp32 scale_inv or E8M0 bytes), v, inv_full)."""
    m, k = x.shape
    xf = x.float()
    fmax = R.FMT[dtype][0]
    amax = R.group_amax(xf, gm, gk)
    if mx:
        mult, inv, byte = R.mx_scales(amax, fmax)
        s_ref = byte
    else:
        mult, inv = R.fp32_scales(amax, fmax)
        s_ref = inv
    v = xf * R.expand(mult.float(), gm, gk, m, k)
    return R.fp8_cast(v, dtype), s_ref, v, R.expand(inv.float(), gm, gk, m, k)


def assert_fp8_close(q, q_ref, dtype, what="q"):
    """Within one unit in the last place of the format, elementwise."""
    assert q.dtype == dtype and q.shape == q_ref.shape, f"{what}: {q.dtype} {tuple(q.shape)}"
    a, b = q.double(), q_ref.double()
    assert torch.isfinite(a).all(), f"{what}: non-finite values"
    bad = (a - b).abs() > R.fp8_ulp(b, dtype)
    assert not bad.any(), f"{what}: {int(bad.sum())} elements differ by more than 1 ulp"
    exact = (q.view(torch.uint8) == q_ref.view(torch.uint8)).double().mean().item()
    assert exact > 0.999, f"{what}: only {exact:.4%} bitwise equal to the reference"


def assert_scales(s, s_ref, mx, what="scale_inv"):
    if mx:
        assert s.dtype == torch.float8_e8m0fnu
        assert torch.equal(s.view(torch.uint8).reshape(s_ref.shape), s_ref), f"{what}: E8M0 exponents differ"
    else:
        assert s.dtype == torch.float32 and s.is_contiguous()
        assert torch.equal(s.reshape(s_ref.shape), s_ref), f"{what}: fp32 scales differ"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("in_dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", FP8_DTYPES, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("config", FP8_CONFIGS, ids=CONFIG_IDS)
def test_quantize_fp8_matches_reference(config, dtype, in_dtype, shape):
    g, block, axis, two_d = config
    m, k = shape
    x = make_x(m, k, in_dtype, seed=m * 31 + k)
    recipe = ScalingRecipe(use_2d_block=True) if two_d else None
    poison_allocator(m * k * 4)
    q, s = QZ.quantize_fp8_unpadded(x, dtype, g, block_size=block, axis=axis, scaling_recipe=recipe)
    gm, gk = groups(g, block, axis, two_d, m, k)
    mx = g == G.MX_BLOCKWISE
    q_ref, s_ref, v, inv = reference_fp8(x, dtype, gm, gk, mx)
    assert q.shape == x.shape and q.is_contiguous()
    if g == G.TENSORWISE:
        assert s.dim() == 0
    else:
        assert s.shape == s_ref.shape
    assert_scales(s, s_ref, mx)
    assert_fp8_close(q, q_ref, dtype)

    # Dequantize: exactly q * scale_inv rounded once to the output dtype.
    out = QZ.dequantize_fp8_unpadded(q, in_dtype, g, block_size=block, axis=axis, scale_inv=s, scaling_recipe=recipe)
    assert out.dtype == in_dtype and out.shape == x.shape
    assert torch.equal(out, (q.float() * inv).to(in_dtype))
    # Round trip: within one unit in the last place of the format at the same scale (unsaturated).
    fmax = R.FMT[dtype][0]
    ok = v.abs() <= fmax
    err = (out.double() - x.double()).abs()
    bound = R.fp8_ulp(v, dtype) * inv.double() + x.double().abs() * 2.0**-7
    assert (err <= bound)[ok].all()


@pytest.mark.parametrize("shape", [(1, 77), (127, 200), (300, 4096), (4097, 129)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("in_dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize(
    "config",
    [(G.TENSORWISE, None, False), (G.ROWWISE, None, False), (G.BLOCKWISE, 128, False), (G.BLOCKWISE, 128, True),
     (G.MX_BLOCKWISE, 32, False)],
    ids=["tensor", "row", "block", "block2d", "mx"],
)
def test_with_trans_matches_two_calls(config, in_dtype, shape):
    g, block, two_d = config
    dtype = torch.float8_e4m3fn
    m, k = shape
    x = make_x(m, k, in_dtype, seed=7 * m + k)
    recipe = ScalingRecipe(use_2d_block=True) if two_d else None
    q_row, s_row, q_col, s_col = QZ.quantize_fp8_with_trans_unpadded(x, dtype, g, block_size=block, scaling_recipe=recipe)
    r_q, r_s = QZ.quantize_fp8_unpadded(x, dtype, g, block_size=block, axis=-1, scaling_recipe=recipe)
    assert torch.equal(q_row.view(torch.uint8), r_q.view(torch.uint8)) and torch.equal(s_row, r_s)
    if g == G.BLOCKWISE and not two_d:  # in place, as the original: quantize_fp8(axis=0)'s output
        c_q, c_s = QZ.quantize_fp8_unpadded(x, dtype, g, block_size=block, axis=0)
        assert q_col.shape == (m, k) and torch.equal(q_col.view(torch.uint8), c_q.view(torch.uint8))
        assert torch.equal(s_col, c_s)
        out = QZ.dequantize_fp8_unpadded(q_col, torch.float32, g, block_size=block, axis=0, scale_inv=s_col)
        assert (out - x.float()).abs().max() <= x.float().abs().max() * 0.07
        return
    assert q_col.shape == (k, m) and q_col.is_contiguous()
    if g == G.TENSORWISE:
        assert s_col.dim() == 0 and torch.equal(s_col, s_row)
        assert torch.equal(q_col.view(torch.uint8), q_row.view(torch.uint8).t())
        return
    # The column quantization of x is the row quantization of x^T.
    c_q, c_s = QZ.quantize_fp8_unpadded(x.t().contiguous(), dtype, g, block_size=block, axis=-1, scaling_recipe=recipe)
    assert torch.equal(q_col.view(torch.uint8), c_q.view(torch.uint8))
    assert torch.equal(s_col.view(torch.uint8), c_s.view(torch.uint8))
    if two_d:
        assert torch.equal(s_col, s_row.t())
    # And q_col dequantizes along its own rows.
    out = QZ.dequantize_fp8_unpadded(q_col, torch.float32, g, block_size=block, axis=-1, scale_inv=s_col,
                                   scaling_recipe=recipe)
    # E4M3 keeps 3 mantissa bits (relative error <= 2^-4; MX scales round up, so nothing clips).
    assert (out - x.float().t()).abs().max() <= x.float().abs().max() * 0.07


@pytest.mark.parametrize("shape", [(1, 128), (127, 200), (300, 4096), (4097, 129)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_mn_major_block_scales_are_the_gemm_layout_of_the_same_values(shape):
    """PT_QUANT_SCALES_MN_MAJOR (the native FP8 GEMM's layout): the same q and scales as the default
    layout, stored [blocks, round_up(rows, 4)] with the padding zeroed."""
    m, k = shape
    x = make_x(m, k, torch.bfloat16, seed=m + 3 * k)
    e4m3, g = torch.float8_e4m3fn, 2  # pt_quant_granularity BLOCKWISE
    ref = QZ._quantize_op(x, e4m3, g, 128, True, True, True, 0, 0)
    ru4 = lambda n: -(-n // 4) * 4
    poison_allocator(4 * QZ._cdiv(k, 128) * ru4(m))  # unwritten padding would read as NaN
    q_row, s_row, q_col, s_col = QZ._quantize_op(x, e4m3, g, 128, True, True, True, QZ._FLAG_MN_MAJOR, 0)
    assert s_row.shape == (QZ._cdiv(k, 128), ru4(m)) and s_col.shape == (QZ._cdiv(m, 128), ru4(k))
    assert torch.equal(q_row.view(torch.uint8), ref[0].view(torch.uint8))
    assert torch.equal(q_col.view(torch.uint8), ref[2].view(torch.uint8))
    assert torch.equal(s_row[:, :m], ref[1].t()) and torch.equal(s_col[:, :k], ref[3].t())
    assert not s_row[:, m:].any() and not s_col[:, k:].any()
    row_only = QZ._quantize_op(x, e4m3, g, 128, True, False, True, QZ._FLAG_MN_MAJOR, 0)  # the rows kernel
    assert torch.equal(row_only[0].view(torch.uint8), ref[0].view(torch.uint8)) and torch.equal(row_only[1], s_row)


def test_all_zero_groups_and_empty_inputs():
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    x[:, :128] = 0
    x[5] = 0
    for g, b, axis in [(G.ROWWISE, None, -1), (G.BLOCKWISE, 128, -1), (G.BLOCKWISE, 128, 0), (G.MX_BLOCKWISE, 32, -1)]:
        q, s = QZ.quantize_fp8_unpadded(x, torch.float8_e4m3fn, g, block_size=b, axis=axis)
        sf = s.float()
        assert torch.isfinite(sf).all() and torch.isfinite(q.float()).all()
        assert (q.float()[x == 0] == 0).all()
    q, s = QZ.quantize_fp8_unpadded(torch.zeros(8, 8, device="cuda"), torch.float8_e4m3fn, G.TENSORWISE)
    assert (q.float() == 0).all() and torch.isfinite(s) and s > 0
    for shape in [(0, 64), (64, 0), (0, 0)]:
        e = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
        q, s = QZ.quantize_fp8_unpadded(e, torch.float8_e4m3fn, G.TENSORWISE)
        assert q.shape == shape and s.dim() == 0 and torch.isfinite(s)
        q, s = QZ.quantize_fp8_unpadded(e, torch.float8_e4m3fn, G.BLOCKWISE, block_size=128, axis=-1)
        assert q.shape == shape and s.shape == (shape[0], (shape[1] + 127) // 128)
        outs = QZ.quantize_fp8_with_trans_unpadded(e, torch.float8_e4m3fn, G.MX_BLOCKWISE, block_size=32)
        assert outs[2].shape == shape[::-1]
        assert QZ.dequantize_fp8_unpadded(q, torch.bfloat16, G.BLOCKWISE, block_size=128, axis=-1, scale_inv=s).shape == shape


def test_higher_rank_and_non_contiguous_input():
    x = torch.randn(4, 33, 256, device="cuda", dtype=torch.bfloat16)
    q, s = QZ.quantize_fp8_unpadded(x, torch.float8_e4m3fn, G.BLOCKWISE, block_size=128, axis=-1)
    r_q, r_s = QZ.quantize_fp8_unpadded(x.reshape(-1, 256), torch.float8_e4m3fn, G.BLOCKWISE, block_size=128, axis=-1)
    assert q.shape == x.shape and s.shape == (4, 33, 2)
    assert torch.equal(q.view(torch.uint8).reshape(-1, 256), r_q.view(torch.uint8)) and torch.equal(s.reshape(-1, 2), r_s)
    # Along a middle or leading dim: the same as moving that dim last (ROWWISE and 1-D blocks).
    for g, block, axis in ((G.ROWWISE, None, 1), (G.ROWWISE, None, -3), (G.BLOCKWISE, 32, 1), (G.MX_BLOCKWISE, 32, 0)):
        q, s = QZ.quantize_fp8_unpadded(x, torch.float8_e4m3fn, g, block_size=block, axis=axis)
        r_q, r_s = QZ.quantize_fp8_unpadded(x.movedim(axis, -1).contiguous(), torch.float8_e4m3fn, g, block_size=block, axis=-1)
        assert torch.equal(q.view(torch.uint8), r_q.view(torch.uint8).movedim(-1, axis))
        as_bits = (lambda t: t.view(torch.uint8)) if s.element_size() == 1 else (lambda t: t)  # E8M0
        assert torch.equal(as_bits(s), as_bits(r_s.movedim(-1, axis)))
        back = QZ.dequantize_fp8_unpadded(q, torch.float32, g, block_size=block, axis=axis, scale_inv=s)
        assert back.shape == x.shape and (back - x.float()).abs().max() <= x.float().abs().max() * 0.07
    xt = torch.randn(256, 300, device="cuda", dtype=torch.bfloat16).t()  # a transposed view
    q, s = QZ.quantize_fp8_unpadded(xt, torch.float8_e4m3fn, G.ROWWISE, axis=-1)
    r_q, r_s = QZ.quantize_fp8_unpadded(xt.contiguous(), torch.float8_e4m3fn, G.ROWWISE, axis=-1)
    assert torch.equal(q.view(torch.uint8), r_q.view(torch.uint8)) and torch.equal(s, r_s)


@pytest.mark.parametrize("dtype,rel", [(torch.float8_e4m3fn, 2.0**-4), (torch.float8_e5m2, 2.0**-3)], ids=["e4m3", "e5m2"])
def test_mx_scales_round_up_so_nothing_clips(dtype, rel):
    # The E8M0 exponent is ceil(log2(amax / max)): a round trip errs by at most half an FP8 ulp
    # (relative 2^-4 for E4M3, 2^-3 for E5M2) on every element, the block's largest included.
    torch.manual_seed(5)
    x = torch.randn(4, 1024, 256, device="cuda", dtype=torch.bfloat16) * 3
    q, s = QZ.quantize_fp8_unpadded(x, dtype, G.MX_BLOCKWISE, block_size=32, axis=-1)
    back = QZ.dequantize_fp8_unpadded(q, torch.float32, G.MX_BLOCKWISE, block_size=32, axis=-1, scale_inv=s)
    err = (back - x.float()).abs()
    tiny = 1e-5 * x.abs().max().item()  # subnormal spacing near zero
    assert (err <= rel * x.float().abs() + tiny).all(), f"max error {err.max().item():.3g}"


# ---- FP4 ---------------------------------------------------------------------------------------------


def test_fp4_of_a_3d_input_equals_each_group_quantized_alone():
    torch.manual_seed(9)
    x = torch.randn(3, 64, 96, device="cuda", dtype=torch.bfloat16)
    for axis, axis_2d in ((2, -1), (1, 0)):
        q, s = QZ.quantize_fp4_unpadded(x, axis=axis)
        for g in range(3):
            rq, rs = QZ.quantize_fp4_unpadded(x[g], axis=axis_2d)
            assert torch.equal(q[g].view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s[g].view(torch.uint8), rs.view(torch.uint8))
        back = turbo.ops.dequantize_fp4(q, torch.float32, axis=axis, scale_inv=s)
        assert back.shape == x.shape and (back - x.float()).abs().max() <= x.float().abs().max() * 0.26


def reference_fp4_codes(x, gm, gk):
    m, k = x.shape
    xf = x.float()
    amax = R.group_amax(xf, gm, gk)
    mult, inv, byte = R.mx_scales(amax, 6.0)
    v = xf * R.expand(mult.float(), gm, gk, m, k)
    return R.e2m1_codes(v), byte, R.expand(inv.float(), gm, gk, m, k)


@pytest.mark.parametrize("shape", [(1, 64), (127, 200), (4096, 4096), (130, 4098)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("in_dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("axis,two_d", [(-1, False), (0, False), (-1, True), (0, True)], ids=["row", "col", "row2d", "col2d"])
def test_quantize_fp4_matches_reference(axis, two_d, in_dtype, shape):
    m, k = shape
    if axis == 0 and m % 2:
        pytest.skip("FP4 along an odd dim is rejected (covered by the checks tests)")
    x = make_x(m, k, in_dtype, seed=m + 3 * k)
    recipe = ScalingRecipe(use_2d_block=two_d)
    q, s = QZ.quantize_fp4_unpadded(x, axis=axis, scaling_recipe=recipe)
    xs = x if axis == -1 else x.t()  # the quantized dim last
    rows, cols = xs.shape
    assert q.dtype == FP4 and q.shape == (rows, cols // 2) and s.dtype == torch.float8_e8m0fnu
    codes, byte, inv = reference_fp4_codes(xs, 32 if two_d else 1, 32)
    assert s.shape == byte.shape
    assert torch.equal(s.view(torch.uint8), byte)
    got = R.unpack_fp4(q)
    assert torch.equal(got, codes), f"{int((got != codes).sum())} FP4 codes differ"
    out = turbo.ops.dequantize_fp4(q, in_dtype, axis=axis, scale_inv=s, scaling_recipe=recipe)
    assert out.shape == (m, k)
    ref = (R.e2m1_values(codes).float() * inv).to(in_dtype)
    assert torch.equal(out if axis == -1 else out.t(), ref)
    if two_d and m % 2 == 0:  # the weight's transpose reuses the scales
        _, s_t = QZ.quantize_fp4_unpadded(x, axis=1 if axis == 0 else 0, scaling_recipe=recipe)
        assert torch.equal(s_t.view(torch.uint8), s.view(torch.uint8).t())


@pytest.mark.parametrize("axis", [-1, 0])
def test_fp4_hadamard_is_invertible(axis):
    x = make_x(256, 512, torch.bfloat16, seed=11)
    assert torch.allclose(R.inverse_rht(R.rht(x, 1 if axis == -1 else 0), 1 if axis == -1 else 0), x.double(), atol=1e-12)
    q, s = QZ.quantize_fp4_unpadded(x, axis=axis, scaling_recipe=ScalingRecipe(use_rht=True))
    out = turbo.ops.dequantize_fp4(q, torch.float32, axis=axis, scale_inv=s)
    back = R.inverse_rht(out.double(), 1 if axis == -1 else 0)
    snr = 10 * torch.log10(x.double().pow(2).sum() / (back - x.double()).pow(2).sum())
    assert snr > 15, f"RHT round trip SNR {snr:.1f} dB"
    # The transformed values themselves quantize like any input.
    y = R.rht(x, 1 if axis == -1 else 0).float()
    ys = y if axis == -1 else y.t()
    codes, _, _ = reference_fp4_codes(ys, 1, 32)
    assert (R.unpack_fp4(q) == codes).double().mean() > 0.995


def test_fp4_stochastic_rounding_is_unbiased_and_deterministic():
    torch.manual_seed(3)
    row = torch.randn(1, 64, device="cuda") * 3
    x = row.expand(8192, 64).contiguous()
    recipe = ScalingRecipe(use_sr=True)
    q1, s1 = QZ.quantize_fp4_unpadded(x, axis=-1, scaling_recipe=recipe, seed=123)
    q2, _ = QZ.quantize_fp4_unpadded(x, axis=-1, scaling_recipe=recipe, seed=123)
    q3, _ = QZ.quantize_fp4_unpadded(x, axis=-1, scaling_recipe=recipe, seed=124)
    assert torch.equal(q1.view(torch.uint8), q2.view(torch.uint8))
    assert not torch.equal(q1.view(torch.uint8), q3.view(torch.uint8))
    out = turbo.ops.dequantize_fp4(q1, torch.float32, axis=-1, scale_inv=s1)
    inv = torch.pow(2.0, s1.view(torch.uint8).float() - 127)
    step = inv.repeat_interleave(32, 1)[:1] * 2.0  # the coarsest E2M1 spacing at that scale
    assert ((out - x).abs() <= step + 1e-6).all()  # always one of the two neighbours
    # OCP MX scales can push a block's largest values past 6 (they saturate, as with nearest
    # rounding); every other element must be unbiased.
    unsat = row[0].abs() <= 6.0 * inv.repeat_interleave(32, 1)[0]
    bias = (out.double().mean(0) - row.double()[0]).abs()[unsat]
    assert unsat.sum() >= 48
    assert (bias <= 0.05 * step[0][unsat].double()).all(), f"mean bias {bias.max():.4g}"
    # Nearest rounding of the same data is biased somewhere; SR is not.
    qn, sn = QZ.quantize_fp4_unpadded(x, axis=-1)
    rn = turbo.ops.dequantize_fp4(qn, torch.float32, axis=-1, scale_inv=sn)
    assert (rn.double().mean(0) - row.double()[0]).abs()[unsat].max() > bias.max()


# ---- graphs and compile ------------------------------------------------------------------------------


def test_cuda_graph_capture_and_replay():
    x = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)

    def run(t):
        a = QZ.quantize_fp8_unpadded(t, torch.float8_e4m3fn, G.TENSORWISE)
        b = QZ.quantize_fp8_with_trans_unpadded(t, torch.float8_e4m3fn, G.BLOCKWISE, block_size=128)
        c = QZ.quantize_fp8_unpadded(t, torch.float8_e5m2, G.ROWWISE, axis=0)
        d = QZ.quantize_fp4_unpadded(t, axis=-1, scaling_recipe=ScalingRecipe(use_sr=True), seed=5)
        return [*a, *b, *c, *d]

    run(x)  # warm up (compiles, allocates)
    graph, outs = capture_graph(lambda: run(x))
    x.copy_(torch.randn_like(x) * 5)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, run(x)):
        assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))


def test_torch_compile_fullgraph():
    def fn(x):
        q, s = QZ.quantize_fp8_unpadded(x, torch.float8_e4m3fn, G.BLOCKWISE, block_size=128, axis=-1)
        return QZ.dequantize_fp8_unpadded(q, torch.float32, G.BLOCKWISE, block_size=128, axis=-1, scale_inv=s) * 2

    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(fn, fullgraph=True)
    assert torch.equal(compiled(x), fn(x))


# ---- the public MX layouts (the original library's: padded to 128, axis 0 / 1 transposed) ------------


@pytest.mark.parametrize("shape", [(127, 200), (256, 128), (3, 100, 96)], ids=lambda s: "x".join(map(str, s)))
def test_public_mx_layouts_are_the_unpadded_ones_padded(shape):
    torch.manual_seed(11)
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    e4, pad = torch.float8_e4m3fn, lambda n: -(-n // 128) * 128
    bits = lambda t: t.view(torch.uint8)  # noqa: E731
    last, other = x.dim() - 1, x.dim() - 2
    # Along the last dim: the unpadded quantization of x zero-padded to 128 columns.
    q, s = turbo.ops.quantize_fp8(x, e4, G.MX_BLOCKWISE, block_size=32, axis=last)
    xp = torch.nn.functional.pad(x, (0, pad(shape[-1]) - shape[-1]))
    rq, rs = QZ.quantize_fp8_unpadded(xp, e4, G.MX_BLOCKWISE, block_size=32, axis=-1)
    assert q.shape == xp.shape and torch.equal(bits(q), bits(rq)) and torch.equal(bits(s), bits(rs))
    back = turbo.ops.dequantize_fp8(q, torch.float32, G.MX_BLOCKWISE, block_size=32, axis=last, scale_inv=s)
    assert back.shape == xp.shape and (back[..., shape[-1]:] == 0).all()
    assert (back[..., : shape[-1]] - x.float()).abs().max() <= x.float().abs().max() * 0.07
    # Along the other dim: stored transposed ([.., N, M_pad]), dequantized back to [.., M_pad, N].
    q, s = turbo.ops.quantize_fp8(x, e4, G.MX_BLOCKWISE, block_size=32, axis=other)
    xt = torch.nn.functional.pad(x.transpose(-1, -2), (0, pad(shape[-2]) - shape[-2]))
    rq, rs = QZ.quantize_fp8_unpadded(xt.contiguous(), e4, G.MX_BLOCKWISE, block_size=32, axis=-1)
    assert q.shape == xt.shape and torch.equal(bits(q), bits(rq)) and torch.equal(bits(s), bits(rs))
    back = turbo.ops.dequantize_fp8(q, torch.float32, G.MX_BLOCKWISE, block_size=32, axis=other, scale_inv=s)
    assert back.shape == xt.transpose(-1, -2).shape
    assert (back[..., : shape[-2], :] - x.float()).abs().max() <= x.float().abs().max() * 0.07
    # with_trans: both copies as the two single calls.
    q_r, s_r, q_c, s_c = turbo.ops.quantize_fp8_with_trans(x, e4, G.MX_BLOCKWISE, block_size=32)
    for (a, b), axis in (((q_r, s_r), last), ((q_c, s_c), other)):
        ra, rb = turbo.ops.quantize_fp8(x, e4, G.MX_BLOCKWISE, block_size=32, axis=axis)
        assert torch.equal(bits(a), bits(ra)) and torch.equal(bits(b), bits(rb))
    # FP4: the quantized dim padded to 128, the rest as the unpadded layout.
    fq, fs = turbo.ops.quantize_fp4(x, axis=last)
    rq, rs = QZ.quantize_fp4_unpadded(xp, axis=last)
    assert torch.equal(bits(fq), bits(rq)) and torch.equal(bits(fs), bits(rs))
    back = turbo.ops.dequantize_fp4(fq, torch.float32, axis=last, scale_inv=fs)
    assert back.shape == xp.shape and (back[..., shape[-1]:] == 0).all()


@pytest.mark.parametrize("g", [G.ROWWISE, G.BLOCKWISE], ids=lambda v: v.name)
def test_3d_along_the_middle_dim_matches_the_moved_dim(g):
    # A [G, N, K] expert weight quantized along N (the dgrad's copy): tiled transposes around the row
    # quantization give the same bits as moving the dim last with torch.
    torch.manual_seed(5)
    x = torch.randn(3, 200, 136, device="cuda", dtype=torch.bfloat16)
    block = 128 if g == G.BLOCKWISE else None
    q, s = QZ.quantize_fp8_unpadded(x, torch.float8_e4m3fn, g, block_size=block, axis=1)
    rq, rs = QZ.quantize_fp8_unpadded(x.movedim(1, -1).contiguous(), torch.float8_e4m3fn, g, block_size=block, axis=-1)
    assert q.shape == x.shape and q.is_contiguous() and s.is_contiguous()
    assert torch.equal(q.view(torch.uint8), rq.movedim(-1, 1).contiguous().view(torch.uint8))
    assert torch.equal(s, rs.movedim(-1, 1).contiguous())
