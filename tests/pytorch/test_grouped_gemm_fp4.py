"""turbo.ops.grouped_gemm_fp4 (MXFP4, emulated on Hopper through the grouped FP8 kernel) on the GPU.

Two references per result, as for grouped_gemm_fp8 (ACCURACY.md): the per-group float64 product
of the dequantized, restated operands (kernel correctness: only FP32 accumulation and output
rounding differ; gate 40 dB), and the per-group float64 product of the original bf16 operands
(end-to-end quality, grouped FP4 gate >= 8 dB) for forward, dgrad and wgrad (wgrad is the bf16
grouped GEMM, also held to 40 dB). Group-size distributions (balanced, skewed, empty experts,
G = 1 .. 128), both weight layouts, partial 128-blocks, every recipe switch, CUDA graphs replayed
after group sizes changed in place, torch.compile(fullgraph=True).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from grouped_test_utils import capture_training_step
from grouped_test_utils import grouped_e2e_references as _e2e_references
from grouped_test_utils import group_lens as _lens
from grouped_test_utils import grouped64 as _grouped64
from grouped_test_utils import grouped_inputs as _inputs
from turbo_test_utils import poison_allocator, snr_db

import primus_turbo.pytorch as turbo
from primus_turbo._core.lib import check, lib
from primus_turbo.pytorch.core.low_precision import Float4QuantConfig, ScalingRecipe
from primus_turbo.pytorch.ops.gemm_fp4 import FP4_TRAINING_RECIPE
from primus_turbo.pytorch.ops.grouped_gemm_fp4 import activation_operand, weight_operand

pytestmark = pytest.mark.gpu

GATE = 8.0  # grouped FP4, ACCURACY.md
KERNEL_GATE = 40.0
BF16_WGRAD_GATE = 40.0
RECIPES = {
    "paper": None,  # the default: 32x32 weight blocks + SR of the output gradient (RHT: wgrad only, bf16 here)
    "plain": ScalingRecipe(),
    "2d": ScalingRecipe(use_2d_block=True),
    "sr": ScalingRecipe(use_sr=True),
}


def cfg(recipe="paper"):
    return Float4QuantConfig(scaling_recipe_for_trans=RECIPES[recipe])


@pytest.fixture(scope="module", autouse=True)
def warm_modules():
    """Builds the kernel modules the emulation uses in parallel (one nvcc each) before the first
    call: the grouped FP8 kernel (E4M3 x E4M3, 1x128 B scales) per output dtype and the FP4
    restatement."""
    e4, bf16, f16, f32, fp4 = 3, 2, 1, 0, 6
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(lib.pt_grouped_gemm_fp8_prepare, e4, e4, d, 1, 0) for d in (bf16, f16, f32)]
        futures.append(pool.submit(lib.pt_mx_to_blocks_prepare, fp4))
        for f in futures:
            check(f.result())






def _deq(q8, s8):
    """Restated E4M3 with 1x128 fp32 scales along the last dim -> float64."""
    return q8.double() * s8.double().repeat_interleave(128, dim=-1)[..., : q8.shape[-1]]


def _run_and_check(lens, k, n, g, trans_b, recipe="paper", dtype=torch.bfloat16, out_dtype=None):
    a, b = _inputs(lens, k, n, g, dtype, trans_b, seed=g + k + n)
    a.requires_grad_(True)
    b.requires_grad_(True)
    poison_allocator(a.shape[0] * n * (out_dtype or dtype).itemsize)
    out = turbo.ops.grouped_gemm_fp4(a, b, lens, trans_b=trans_b, out_dtype=out_dtype, config=cfg(recipe))
    assert out.dtype == (out_dtype or dtype) and out.shape == (a.shape[0], n)
    assert torch.isfinite(out).all(), "forward: non-finite values (unwritten rows?)"
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    assert a.grad.dtype == dtype and b.grad.dtype == dtype

    # Kernel correctness: the float64 product of the operands as quantized and restated.
    r = RECIPES[recipe] or FP4_TRAINING_RECIPE
    with torch.no_grad():
        ra = _deq(*activation_operand(a.detach()))
        rb = _deq(*weight_operand(b.detach(), along_last=trans_b, two_d=r.use_2d_block))
        snr = snr_db(out, _grouped64(ra, rb, lens))
        assert snr >= KERNEL_GATE, f"forward vs dequantized operands: SNR {snr:.1f} dB"
        if not r.use_sr:  # with SR the backward's draw cannot be repeated here
            rg = _deq(*activation_operand(grad_out))  # quantized in its own dtype, as the op does
            rbt = _deq(*weight_operand(b.detach(), along_last=not trans_b, two_d=r.use_2d_block))
            snr = snr_db(a.grad, _grouped64(rg, rbt, lens))
            assert snr >= KERNEL_GATE - 5, f"dgrad vs dequantized operands: SNR {snr:.1f} dB"

    # End-to-end quality against the bf16 operands.
    ref_out, ref_da, ref_db = _e2e_references(a.detach(), b.detach(), lens, grad_out.to(dtype), trans_b)
    for what, got, ref, gate in (
        ("forward", out, ref_out, GATE),
        ("dgrad", a.grad, ref_da, GATE),
        ("wgrad", b.grad, ref_db, BF16_WGRAD_GATE),
    ):
        assert torch.isfinite(got).all(), f"{what}: non-finite values"
        if ref.abs().sum() == 0:
            assert torch.count_nonzero(got) == 0
            continue
        snr = snr_db(got, ref)
        assert snr >= gate, f"{what} vs bf16 operands ({recipe}, trans_b={trans_b}): SNR {snr:.1f} dB < {gate}"
    # Experts with no tokens: exactly zero weight gradient.
    for e in torch.nonzero(lens.cpu() == 0).flatten().tolist():
        assert torch.count_nonzero(b.grad[e]) == 0, f"expert {e} has no tokens but a non-zero gradient"
    return out


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("trans_b", [True, False])
def test_forward_dgrad_wgrad(recipe, trans_b):
    _run_and_check(_lens("random", 4, 96, seed=1), 512, 256, 4, trans_b, recipe)


@pytest.mark.parametrize(
    "dist,g,m_per,k,n",
    [
        ("balanced", 1, 200, 256, 128),
        ("balanced", 8, 128, 384, 256),
        ("skewed", 16, 64, 256, 384),
        ("zeros", 6, 50, 288, 160),  # partial 128-blocks along K and N
        ("random", 32, 20, 128, 128),
        ("random", 64, 12, 256, 128),
        ("skewed", 128, 8, 128, 256),
    ],
)
@pytest.mark.parametrize("trans_b", [True, False])
def test_group_distributions(dist, g, m_per, k, n, trans_b):
    _run_and_check(_lens(dist, g, m_per, seed=g), k, n, g, trans_b)


@pytest.mark.parametrize("recipe", ["plain", "2d"])
def test_partial_blocks_transposed_weight(recipe):
    # trans_b=False with K = 96, N = 224: the weight's transpose is made per expert from [G*K, N].
    _run_and_check(_lens("zeros", 5, 40, seed=3), 96, 224, 5, False, recipe)


@pytest.mark.parametrize("out_dtype,dtype", [(torch.float16, torch.float16), (torch.float32, torch.bfloat16)])
def test_out_dtypes(out_dtype, dtype):
    _run_and_check(_lens("random", 4, 64, seed=5), 256, 128, 4, True, "2d", dtype=dtype, out_dtype=out_dtype)


def test_group_offs_and_non_contiguous_input():
    lens = _lens("random", 5, 64, seed=7)
    a, b = _inputs(lens, 256, 128, 5, torch.bfloat16, True)
    offs = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), torch.cumsum(lens, 0)])
    a_t = a.t().contiguous().t()  # same values, column-major view
    b_t = b.transpose(1, 2).contiguous().transpose(1, 2)
    c = cfg("2d")  # deterministic
    ref = turbo.ops.grouped_gemm_fp4(a, b, lens, config=c)
    torch.testing.assert_close(turbo.ops.grouped_gemm_fp4(a, b, lens, offs, config=c), ref, rtol=0, atol=0)
    torch.testing.assert_close(turbo.ops.grouped_gemm_fp4(a_t, b_t, lens, config=c), ref, rtol=0, atol=0)


def test_trans_b_layouts_agree():
    """2-D blocks are the same 32x32 tiles in either storage order: the same quantized weight."""
    lens = _lens("random", 3, 80, seed=8)
    a, b = _inputs(lens, 256, 192, 3, torch.bfloat16, True)
    c = cfg("2d")
    y1 = turbo.ops.grouped_gemm_fp4(a, b, lens, trans_b=True, config=c)
    y2 = turbo.ops.grouped_gemm_fp4(a, b.transpose(1, 2).contiguous(), lens, trans_b=False, config=c)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)


def test_sizes_that_overrun_are_clamped():
    """sum(group_lens) > M cannot be checked without a sync: groups are clipped to [0, M)."""
    lens = torch.tensor([40, 50, 60], device="cuda")
    true_lens = torch.tensor([40, 50, 10], device="cuda")
    a, b = _inputs(true_lens, 128, 128, 3, torch.bfloat16, True)
    out = turbo.ops.grouped_gemm_fp4(a, b, lens, config=cfg("2d"))
    torch.cuda.synchronize()
    assert snr_db(out, _grouped64(a, b, true_lens)) >= GATE


def test_zero_sized():
    lens = torch.zeros(3, dtype=torch.int64, device="cuda")
    a = torch.randn(0, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(3, 64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = turbo.ops.grouped_gemm_fp4(a, b, lens)
    assert out.shape == (0, 64)
    out.sum().backward()
    assert torch.count_nonzero(b.grad) == 0


def test_all_tokens_in_one_expert_of_many():
    lens = torch.zeros(64, dtype=torch.int64)
    lens[37] = 300
    _run_and_check(lens.cuda(), 256, 128, 64, True)


@pytest.mark.parametrize("recipe", ["2d", "paper"])
def test_cuda_graph_replay_with_new_group_sizes(recipe):
    g, k, n = 4, 256, 256
    lens = torch.tensor([64, 32, 96, 64], device="cuda")
    a, b = _inputs(lens, k, n, g, torch.bfloat16, True)
    a.requires_grad_(True)
    b.requires_grad_(True)
    c = cfg(recipe)
    grad_out = torch.randn(a.shape[0], n, device="cuda", dtype=torch.bfloat16)
    graph, out = capture_training_step(lambda: turbo.ops.grouped_gemm_fp4(a, b, lens, config=c), a, b, grad_out)
    for new in ([64, 32, 96, 64], [0, 128, 0, 128], [256, 0, 0, 0], [1, 2, 3, 250]):
        lens.copy_(torch.tensor(new, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_da, ref_db = _e2e_references(a.detach(), b.detach(), lens, grad_out, True)
        assert snr_db(out, ref_out) >= GATE, f"forward after replay with {new}"
        assert snr_db(a.grad, ref_da) >= GATE, f"dgrad after replay with {new}"
        assert snr_db(b.grad, ref_db) >= BF16_WGRAD_GATE, f"wgrad after replay with {new}"
        if recipe == "2d":  # deterministic: the replay equals an eager call with the new sizes
            eager = turbo.ops.grouped_gemm_fp4(a.detach(), b.detach(), lens, config=c)
            torch.testing.assert_close(out, eager, rtol=0, atol=0)
        for e, length in enumerate(new):
            if length == 0:
                assert torch.count_nonzero(b.grad[e]) == 0


def test_stochastic_rounding_changes_only_dgrad():
    lens = _lens("random", 4, 64, seed=12)
    a, b = _inputs(lens, 256, 128, 4, torch.bfloat16, True)
    grad = torch.randn(a.shape[0], 128, device="cuda", dtype=torch.bfloat16)

    def run():
        x, w = a.clone().requires_grad_(), b.clone().requires_grad_()
        y = turbo.ops.grouped_gemm_fp4(x, w, lens, config=cfg("sr"))
        y.backward(grad)
        return y, x.grad, w.grad

    (y1, da1, db1), (y2, da2, db2) = run(), run()
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    torch.testing.assert_close(db1, db2, rtol=0, atol=0)
    assert not torch.equal(da1, da2)  # a new seed per eager call


@pytest.mark.parametrize("trans_b", [True, False])
def test_torch_compile_fullgraph(trans_b):
    torch._dynamo.reset()
    lens = _lens("random", 4, 64, seed=11)
    a, b = _inputs(lens, 256, 128, 4, torch.bfloat16, trans_b)
    c = cfg("2d")  # no SR: compiled and eager quantize the same way

    def fn(x, w, gl):
        return torch.nn.functional.gelu(turbo.ops.grouped_gemm_fp4(x, w, gl, trans_b=trans_b, config=c))

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
    # The gelu backward may round a few output-gradient elements differently, and each can move
    # to a neighbouring FP4 value: compare the gradients by SNR, not elementwise.
    assert snr_db(a1.grad, a2.grad) >= 25.0, f"dgrad compiled vs eager: {snr_db(a1.grad, a2.grad):.1f} dB"
    assert snr_db(b1.grad, b2.grad) >= 40.0, f"wgrad compiled vs eager: {snr_db(b1.grad, b2.grad):.1f} dB"
    # The default recipe (stochastic rounding) compiles too.
    torch._dynamo.reset()
    a3 = a.clone().requires_grad_(True)
    y = torch.compile(lambda x, w, gl: turbo.ops.grouped_gemm_fp4(x, w, gl, trans_b=trans_b), fullgraph=True)(
        a3, b, lens
    )
    y.sum().backward()
    assert torch.isfinite(a3.grad).all()


def test_num_cu_limits_the_grid_not_the_result():
    lens = _lens("random", 6, 100, seed=13)
    a, b = _inputs(lens, 256, 256, 6, torch.bfloat16, True)
    a.requires_grad_(True)
    c = cfg("2d")
    grad = torch.randn(a.shape[0], 256, device="cuda", dtype=torch.bfloat16)
    ref = turbo.ops.grouped_gemm_fp4(a, b, lens, config=c)
    ref.backward(grad)
    ref_da, a.grad = a.grad, None
    # Every tile is computed the same way whichever SM runs it (forward and dgrad).
    out = turbo.ops.grouped_gemm_fp4(a, b, lens, config=c, num_cu=8)
    out.backward(grad)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(a.grad, ref_da, rtol=0, atol=0)


@pytest.mark.parametrize("trans_b", [True, False])
def test_forward_without_grad_equals_training_forward(trans_b):
    """No backward to follow: the native forward alone (no autograd node), the same product bit for bit."""
    lens = torch.tensor([128, 0, 64, 200], device="cuda")
    a, b = _inputs(lens, 256, 384, 4, torch.bfloat16, trans_b, seed=7)
    train = turbo.ops.grouped_gemm_fp4(a.requires_grad_(True), b.requires_grad_(True), lens, trans_b=trans_b,
                                       config=cfg())
    with torch.no_grad():
        infer = turbo.ops.grouped_gemm_fp4(a, b, lens, trans_b=trans_b, config=cfg())
    assert infer.grad_fn is None and torch.equal(infer, train.detach())
