"""Host-side behaviour of turbo.ops.gemm_fp4 and of the MX -> 1x128 restatement that the MX
gemm_fp8 and gemm_fp4 share: configuration and argument errors raised before any launch, shapes
through meta/fake tensors, a fullgraph trace, and the restatement's exactness (plain torch, CPU)."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import (
    Float4QuantConfig,
    Float8QuantConfig,
    Format,
    ScaleDtype,
    ScalingGranularity,
    ScalingRecipe,
)
from primus_turbo.pytorch.ops import _mx_blocks
from primus_turbo.pytorch.ops.gemm_fp4 import FP4_TRAINING_RECIPE, recipe_of

from host_check_utils import check_gemm_step_on_meta, hp_gemm_bad_arguments, meta

G = ScalingGranularity
E8M0 = getattr(torch, "float8_e8m0fnu", torch.uint8)
FP4 = turbo.float4_e2m1fn_x2 if getattr(turbo, "float4_e2m1fn_x2", None) is not None else torch.uint8


# ---- the restatement (CPU, exact arithmetic checks) -----------------------------------------


def expand(s, k, block):
    return s.double().repeat_interleave(block, 1)[:, :k]


def test_mx_fp8_restatement_is_exact_for_close_exponents():
    torch.manual_seed(0)
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        r, k = 8, 272  # a partial 128-block and a partial 32-block (272 = 2*128 + 16)
        x = (torch.randn(r, k) * 100).clamp(-440, 440)
        x[x.abs() < 2] = 2.0  # values well above the subnormal range after a shift of up to 8
        q = x.to(dtype)
        e = torch.randint(120, 129, (r, 9), dtype=torch.int32)
        q2, s2 = _mx_blocks.to_1x128(q, e)
        assert q2.dtype == dtype and q2.shape == q.shape and s2.shape == (r, 3)
        ref = q.double() * expand(torch.exp2(e.double() - 127), k, 32)
        got = q2.double() * expand(s2, k, 128)
        assert torch.equal(ref, got)


def test_mx_fp8_restatement_error_is_below_the_block_maximum():
    torch.manual_seed(1)
    r, k = 16, 512
    x = (torch.randn(r, k) * 60).clamp(-440, 440)
    x[:, ::32] = 300.0  # as the MX rule leaves it: each sub-block's amax in [256, 448]
    q = x.to(torch.float8_e4m3fn)
    e = torch.randint(90, 160, (r, 16), dtype=torch.int32)  # wildly different sub-block scales
    q2, s2 = _mx_blocks.to_1x128(q, e)
    ref = q.double() * expand(torch.exp2(e.double() - 127), k, 32)
    got = q2.double() * expand(s2, k, 128)
    block_max = ref.abs().view(r, 4, 128).amax(2).repeat_interleave(128, 1)
    assert ((ref - got).abs() <= block_max * 2.0**-17).all()


def test_fp4_expansion_is_exact():
    torch.manual_seed(2)
    r, k = 8, 304
    p = torch.randint(0, 256, (r, k // 2), dtype=torch.uint8)
    e = torch.randint(110, 125, (r, 10), dtype=torch.uint8)  # spread 14: still exact
    q8, s8 = _mx_blocks.mx_fp4_to_1x128(p, e)
    lut = torch.tensor(_mx_blocks.FP4_VALUES, dtype=torch.float64)
    vals = torch.stack((lut[(p & 15).long()], lut[(p >> 4).long()]), -1).reshape(r, k)
    ref = vals * expand(torch.exp2(e.double() - 127), k, 32)
    assert torch.equal(q8.double() * expand(s8, k, 128), ref)


def test_two_d_scales_expand_per_row():
    s = torch.arange(6, dtype=torch.uint8).reshape(2, 3)
    rows = _mx_blocks.row_scales(s, 40)
    assert rows.shape == (40, 3) and torch.equal(rows[31], s[0]) and torch.equal(rows[32], s[1])
    assert _mx_blocks.row_scales(torch.zeros(40, 3, dtype=torch.uint8), 40).shape == (40, 3)


# ---- gemm_fp4 on meta tensors ---------------------------------------------------------------


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_shapes_forward_and_backward_on_meta(trans_a, trans_b):
    check_gemm_step_on_meta(turbo.ops.gemm_fp4, trans_a, trans_b)


def test_out_dtype_and_default_config():
    out = turbo.ops.gemm_fp4(meta(16, 32), meta(32, 16), out_dtype=torch.float32)
    assert out.dtype == torch.float32
    half = turbo.ops.gemm_fp4(meta(16, 32, dtype=torch.float16), meta(32, 16, dtype=torch.float16))
    assert half.dtype == torch.float16


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(32, 256, device="cuda", dtype=torch.bfloat16)
        out = turbo.ops.gemm_fp4(a, b, trans_b=True, config=Float4QuantConfig())
    assert out.shape == (64, 32) and out.device.type == "cuda"


def test_gemm_fp4_compiles_fullgraph_forward_and_backward():
    def fn(x, w):
        return torch.relu(turbo.ops.gemm_fp4(x, w, trans_b=True)) + 1

    x, w = meta(64, 128, grad=True), meta(48, 128, grad=True)
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(x, w)
    assert out.shape == (64, 48)
    out.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.parametrize("make_config", [lambda: Float4QuantConfig(), lambda: Float8QuantConfig(), lambda: None])
def test_configs_are_constructible_inside_compiled_code(make_config):
    """Building a quant config inside the compiled function does not break the graph."""

    def fn(x, w):
        config = make_config()
        if isinstance(config, Float4QuantConfig):
            return turbo.ops.gemm_fp4(x, w, trans_b=True, config=config)
        return turbo.ops.gemm_fp8(x, w, trans_b=True, config=config)

    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(meta(64, 128), meta(48, 128))
    assert out.shape == (64, 48)


def test_mx_gemm_fp8_compiles_fullgraph():
    cfg = Float8QuantConfig(
        format=Format.HYBRID, granularity=G.MX_BLOCKWISE, block_size=32, scale_dtype=ScaleDtype.E8M0
    )

    def fn(x, w):
        return turbo.ops.gemm_fp8(x, w, trans_b=True, config=cfg)

    x, w = meta(64, 96, grad=True), meta(48, 96, grad=True)
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(x, w)
    out.sum().backward()
    assert out.shape == (64, 48) and w.grad.shape == w.shape


def test_recipe_selection():
    assert recipe_of(Float4QuantConfig()) == FP4_TRAINING_RECIPE
    plain = ScalingRecipe()
    assert recipe_of(Float4QuantConfig(scaling_recipe_for_trans=plain)) is plain
    only_rht = ScalingRecipe(use_rht=True)
    assert recipe_of(Float4QuantConfig(scaling_recipe=only_rht)) is only_rht



def test_gradient_sr_and_preshuffle_arguments():
    """use_gradient_sr overrides the recipe's stochastic rounding of the gradient; use_preshuffle is
    accepted (no layout to prepare on Hopper) and validated."""
    assert recipe_of(Float4QuantConfig(use_gradient_sr=False)) == ScalingRecipe(use_2d_block=True, use_rht=True)
    assert recipe_of(Float4QuantConfig(use_gradient_sr=True)) is FP4_TRAINING_RECIPE
    plain = ScalingRecipe()
    assert recipe_of(Float4QuantConfig(scaling_recipe_for_trans=plain, use_gradient_sr=True)).use_sr is True
    assert Float4QuantConfig(use_preshuffle=True).use_preshuffle is True
    with pytest.raises(ValueError, match="use_gradient_sr"):
        Float4QuantConfig(use_gradient_sr="yes")
    with pytest.raises(ValueError, match="use_preshuffle"):
        Float4QuantConfig(use_preshuffle=1)


@pytest.mark.parametrize(
    "a,b,kwargs,exc,match",
    [
        *hp_gemm_bad_arguments(),
        (meta(16, 32), meta(32, 16), {"config": Float8QuantConfig()}, TypeError, "Float4QuantConfig"),
    ],
)
def test_bad_arguments_raise_clear_errors(a, b, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.gemm_fp4(a, b, **kwargs)


def test_forward_only_allows_any_m_n():
    out = turbo.ops.gemm_fp4(meta(24, 32), meta(32, 20))
    assert out.shape == (24, 20)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"format": Format.E4M3}, "format must be E2M1_X2"),
        ({"granularity": G.BLOCKWISE}, "granularity must be MX_BLOCKWISE"),
        ({"block_size": 16}, "block_size must be 32"),
        ({"scale_dtype": ScaleDtype.FP32}, "scale_dtype must be E8M0"),
    ],
)
def test_bad_configs_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Float4QuantConfig(**kwargs)


def test_prequantized_operands_are_checked():
    qa = torch.empty(16, 128, device="meta", dtype=FP4)
    qb = torch.empty(64, 128, device="meta", dtype=FP4)
    sa = torch.empty(16, 8, device="meta", dtype=E8M0)
    sb = torch.empty(64, 8, device="meta", dtype=E8M0)
    sb2d = torch.empty(2, 8, device="meta", dtype=E8M0)
    assert turbo.ops.gemm_fp4((qa, sa), (qb, sb), trans_b=True, out_dtype=torch.bfloat16).shape == (16, 64)
    assert turbo.ops.gemm_fp4((qa, sa), (qb, sb2d), trans_b=True, out_dtype=torch.float32).dtype == torch.float32
    with pytest.raises(ValueError, match="K-major"):
        turbo.ops.gemm_fp4((qa, sa), (qb, sb), trans_b=False, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out_dtype is required"):
        turbo.ops.gemm_fp4((qa, sa), (qb, sb), trans_b=True)
    with pytest.raises(ValueError, match=r"scale_inv has shape \(16, 7\); expected \[16, 8\]"):
        turbo.ops.gemm_fp4((qa, sa[:, :7]), (qb, sb), trans_b=True, out_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="E8M0"):
        turbo.ops.gemm_fp4((qa, sa.float()), (qb, sb), trans_b=True, out_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="packed FP4"):
        turbo.ops.gemm_fp4((qa.view(torch.int8), sa), (qb, sb), trans_b=True, out_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="both"):
        turbo.ops.gemm_fp4((qa, sa), meta(64, 256), trans_b=True)


def test_mx_gemm_fp8_prequantized_operands_are_checked():
    cfg = Float8QuantConfig(granularity=G.MX_BLOCKWISE, block_size=32, scale_dtype=ScaleDtype.E8M0)
    qa = torch.empty(16, 272, device="meta", dtype=torch.float8_e4m3fn)
    qb = torch.empty(32, 272, device="meta", dtype=torch.float8_e4m3fn)
    sa = torch.empty(16, 9, device="meta", dtype=E8M0)
    sb = torch.empty(32, 9, device="meta", dtype=E8M0)
    out = turbo.ops.gemm_fp8((qa, sa), (qb, sb), trans_b=True, out_dtype=torch.bfloat16, config=cfg)
    assert out.shape == (16, 32)
    with pytest.raises(ValueError, match=r"expected \[16, 9\]"):
        turbo.ops.gemm_fp8((qa, sa[:, :8]), (qb, sb), trans_b=True, out_dtype=torch.bfloat16, config=cfg)
    with pytest.raises(TypeError, match="E8M0"):
        turbo.ops.gemm_fp8((qa, sa.float()), (qb, sb), trans_b=True, out_dtype=torch.bfloat16, config=cfg)


def test_mx_megatron_pattern_is_accepted():
    cfg = Float8QuantConfig(granularity=G.MX_BLOCKWISE, block_size=32, scale_dtype=ScaleDtype.E8M0)
    w = meta(16, 32, grad=True)
    w.main_grad = meta(16, 32, dtype=torch.float32)
    out = turbo.ops.gemm_fp8(meta(16, 32), w, trans_b=True, config=cfg, fuse_bgrad_accum_pattern="megatron")
    out.sum().backward()
    assert w.grad_added_to_main_grad is True


def _restate_c_api(q, s, q_out=None, s_out=None):
    from primus_turbo._core import check, lib
    from primus_turbo.pytorch.core.tensor_bridge import to_pt

    rows, k = q.shape[0], (2 * q.shape[1] if q.dtype == torch.uint8 else q.shape[1])
    q_out = q_out if q_out is not None else torch.empty(rows, k, dtype=torch.float8_e4m3fn)
    s_out = s_out if s_out is not None else torch.empty(rows, -(-k // 128))
    check(lib.pt_mx_to_blocks(to_pt(q), to_pt(s), to_pt(q_out), to_pt(s_out), None))


@pytest.mark.parametrize(
    "q,s,kwargs,match",
    [
        (torch.zeros(4, 64, dtype=torch.float8_e4m3fn), torch.zeros(4, 3, dtype=torch.uint8), {},
         r"argument 'scale' has shape \[4, 3\]; expected \[4, 2\] or \[1, 2\]"),
        (torch.zeros(4, 64, dtype=torch.float8_e4m3fn), torch.zeros(4, 2), {}, "argument 'scale' has dtype"),
        (torch.zeros(4, 40, dtype=torch.float8_e4m3fn), torch.zeros(4, 2, dtype=torch.uint8), {},
         "k must be a multiple of 16"),
        (torch.zeros(4, 64, dtype=torch.float32), torch.zeros(4, 2, dtype=torch.uint8), {}, "argument 'q' has dtype"),
        (torch.zeros(4, 64, dtype=torch.uint8), torch.zeros(4, 4, dtype=torch.uint8),
         {"q_out": torch.empty(4, 128, dtype=torch.float8_e5m2)}, "argument 'q_out' must be float8_e4m3"),
        (torch.zeros(4, 64, dtype=torch.float8_e4m3fn), torch.zeros(4, 2, dtype=torch.uint8),
         {"s_out": torch.empty(4, 2)}, "argument 'scale_out' must be float32 \\[4, 1\\]"),
    ],
)
def test_restatement_c_api_checks_arguments(q, s, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _restate_c_api(q, s, **kwargs)


def test_configs_check_their_fields_when_built():
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity, ScalingRecipe

    with pytest.raises(TypeError, match="scaling_recipe must be a ScalingRecipe"):
        Float4QuantConfig(scaling_recipe="2d")
    with pytest.raises(TypeError, match="use_2d_block must be a bool"):
        ScalingRecipe(use_2d_block="yes")
    with pytest.raises(TypeError, match="block_size must be an int"):
        Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size="128")
    with pytest.raises(TypeError, match="block_size must be an int"):
        Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=128.0)
