"""Malformed arguments found by an input sweep of every public op (meta and fake CUDA tensors, no
GPU): each raises TypeError or ValueError naming the argument, where it raised torch's RuntimeError,
IndexError or ZeroDivisionError, or passed silently."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig
from primus_turbo.pytorch.core.low_precision import ScalingGranularity as G

E4M3 = torch.float8_e4m3fn


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, device="meta", dtype=dtype)


@pytest.mark.parametrize("scale_shape", [(256,), (1,), (2, 256, 1), ()])
def test_dequantize_scale_inv_of_the_wrong_rank(scale_shape):
    x = meta(256, 1024, dtype=E4M3)
    with pytest.raises(ValueError, match="argument 'scale_inv'"):
        turbo.ops.dequantize_fp8(x, torch.bfloat16, G.ROWWISE, axis=-1, scale_inv=meta(*scale_shape, dtype=torch.float32))


def test_attention_head_dim_zero_is_an_unsupported_head_dim():
    q = meta(1, 128, 4, 0)  # was a ZeroDivisionError from the default softmax scale
    with pytest.raises(NotImplementedError, match="head dims"):
        turbo.ops.flash_attn_func(q, q, q)


@pytest.mark.parametrize("recipe", ["x", 1])
@pytest.mark.parametrize("g", [G.ROWWISE, G.TENSORWISE])
def test_scaling_recipe_type_is_checked_for_every_granularity(recipe, g):
    x = meta(64, 256)
    with pytest.raises(TypeError, match="argument 'scaling_recipe' must be a ScalingRecipe"):
        turbo.ops.quantize_fp8(x, E4M3, g, axis=-1, scaling_recipe=recipe)


def test_scaling_recipe_for_trans_is_named():
    with pytest.raises(TypeError, match="argument 'scaling_recipe_for_trans'"):
        turbo.ops.quantize_fp8_with_trans(meta(64, 256), E4M3, G.ROWWISE, scaling_recipe_for_trans="x")


def test_moe_permute_scaling_factor_type():
    tokens, idx = meta(64, 256), torch.zeros(64, 2, dtype=torch.int32, device="meta")
    with pytest.raises(TypeError, match="argument 'scaling_factor'"):
        turbo.ops.moe_permute(tokens, idx, num_local_experts=8, num_topk=2, num_permuted_tokens=128, scaling_factor="x")


def test_rope_theta_and_cos_sin_device():
    q = meta(2, 16, 4, 64)
    table = meta(16, 32, dtype=torch.float32)
    with pytest.raises(ValueError, match="argument 'theta'"):
        turbo.ops.rope(q, q, table, table, theta="x")
    with pytest.raises(ValueError, match="argument 'device'"):
        turbo.ops.rope_cos_sin(128, 64, device="bogus")


def test_grouped_fp8_fake_path_checks_devices():
    # The native op's fake implementation (a traced call) gives the device error an eager call gives.
    with FakeTensorMode():
        a = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(4, 256, 256, dtype=torch.bfloat16)  # on the CPU
        glens = torch.full((4,), 64, dtype=torch.int64, device="cuda")
        with pytest.raises(ValueError, match="argument 'b' is on cpu"):
            turbo.ops.grouped_gemm_fp8(a, b, glens, trans_b=True, config=Float8QuantConfig(granularity=G.BLOCKWISE,
                                                                                            block_size=128))


def test_swiglu_mlp_fp8_names_its_weights_on_the_wrong_device():
    with FakeTensorMode():
        x = torch.empty(64, 128, device="cuda", dtype=torch.bfloat16)
        wgu = torch.empty(192, 128, dtype=torch.bfloat16)
        wd = torch.empty(128, 96, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="swiglu_mlp_fp8: argument 'w_gate_up' is on cpu"):
            turbo.ops.swiglu_mlp_fp8(x, wgu, wd)


def test_grouped_dequantize_total_m_beyond_the_rows():
    x = meta(640, 1024, dtype=E4M3)
    offs = torch.arange(0, 513, 128, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="argument 'total_M'"):
        turbo.ops.grouped_dequantize_fp8(x, torch.bfloat16, G.BLOCKWISE, offs, offs, block_size=128, axis=-1,
                                         scale_inv=meta(640, 8, dtype=torch.float32), total_M=1024)


def test_fp4_seed_beyond_int64_is_taken_modulo_two_to_the_64():
    x = meta(64, 256)
    q, s = turbo.ops.quantize_fp4(x, axis=-1, seed=2**70)  # was a RuntimeError from the op's schema
    assert q.shape == (64, 128)


@pytest.mark.parametrize("value", [torch.empty(3, 5), "x", 2, [1]])
def test_bool_flags_take_bools_only(value):
    # A tensor raised "Boolean value of Tensor ... is ambiguous"; a string or a list was read as True.
    a, w = meta(64, 128), meta(128, 128)
    lens = torch.full((2,), 32, dtype=torch.int64, device="meta")
    calls = [
        (lambda: turbo.ops.gemm_fp8(a, w, trans_b=value), "trans_b"),
        (lambda: turbo.ops.grouped_gemm(a, meta(2, 128, 128), lens, trans_b=value), "trans_b"),
        (lambda: turbo.ops.flash_attn_func(meta(1, 16, 4, 64), meta(1, 16, 4, 64), meta(1, 16, 4, 64), causal=value),
         "causal"),
        (lambda: turbo.ops.swiglu_fp8(meta(64, 256), return_hp=value), "return_hp"),
    ]
    for call, name in calls:
        with pytest.raises(TypeError, match=f"argument '{name}' must be a bool"):
            call()
