"""Host-side behaviour of turbo.ops.gemm_fp8 and Float8Linear that needs no GPU: configuration and
argument errors raised before any launch, shapes through meta/fake tensors, and a fullgraph trace."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScaleDtype, ScalingGranularity
from primus_turbo.pytorch.ops.gemm_fp8 import ROW, TENSOR, BLOCK_1x128, BLOCK_128x128, kernel_scale

from host_check_utils import check_gemm_step_on_meta, hp_gemm_bad_arguments, meta

G = ScalingGranularity
CONFIGS = [
    Float8QuantConfig(format=f, granularity=g, block_size=128 if g == G.BLOCKWISE else None)
    for f in (Format.E4M3, Format.E5M2, Format.HYBRID)
    for g in (G.TENSORWISE, G.ROWWISE, G.BLOCKWISE)
] + [
    Float8QuantConfig(format=f, granularity=G.MX_BLOCKWISE, block_size=32, scale_dtype=ScaleDtype.E8M0)
    for f in (Format.E4M3, Format.E5M2, Format.HYBRID)
]
FAST_ACCUM = [Float8QuantConfig(format=Format.HYBRID, granularity=g, fast_accum=True) for g in (G.TENSORWISE, G.ROWWISE)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.format.name}-{c.granularity.name}")
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_shapes_forward_and_backward_on_meta(config, trans_a, trans_b):
    check_gemm_step_on_meta(turbo.ops.gemm_fp8, trans_a, trans_b, config=config)


@pytest.mark.parametrize("config", FAST_ACCUM, ids=lambda c: c.granularity.name)
def test_fast_accum_configs_take_the_same_shapes_on_meta(config):
    check_gemm_step_on_meta(turbo.ops.gemm_fp8, False, True, config=config)


def test_fast_accum_must_be_a_bool():
    assert Float8QuantConfig().fast_accum is False
    with pytest.raises(TypeError, match="fast_accum must be a bool"):
        Float8QuantConfig(fast_accum=1)


def test_out_dtype_and_default_config():
    out = turbo.ops.gemm_fp8(meta(16, 32), meta(32, 16), out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert turbo.ops.gemm_fp8(meta(16, 32, dtype=torch.float16), meta(32, 16, dtype=torch.float16)).dtype == torch.float16


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = Float8QuantConfig(granularity=G.BLOCKWISE, block_size=128)
    with FakeTensorMode():
        a = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(32, 256, device="cuda", dtype=torch.bfloat16)
        out = turbo.ops.gemm_fp8(a, b, trans_b=True, config=cfg)
    assert out.shape == (64, 32) and out.device.type == "cuda"


@pytest.mark.parametrize("config", CONFIGS[:3] + CONFIGS[-1:], ids=lambda c: f"{c.format.name}-{c.granularity.name}")
def test_float8_linear_compiles_fullgraph_forward_and_backward(config):
    layer = turbo.modules.Float8Linear(64, 32, config=config, device="meta", dtype=torch.bfloat16)

    def step(x):
        y = layer(x)
        y.sum().backward()
        return y

    x = meta(2, 8, 64, grad=True)
    out = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    assert out.shape == (2, 8, 32)
    out.sum().backward()
    assert x.grad.shape == x.shape and layer.weight.grad.shape == layer.weight.shape


def test_gemm_fp8_traces_without_graph_break():
    def fn(x, w):
        return torch.relu(turbo.ops.gemm_fp8(x, w, trans_b=True)) + 1

    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(meta(16, 32), meta(48, 32))
    assert out.shape == (16, 48)


def test_registered_as_custom_ops():
    assert "primus_turbo::gemm_fp8_mm(" in str(torch.ops.primus_turbo.gemm_fp8_mm.default._schema)
    assert "Tensor(a!) out" in str(torch.ops.primus_turbo.gemm_fp8_mm_accum_.default._schema)


@pytest.mark.parametrize(
    "a,b,kwargs,exc,match",
    [
        *hp_gemm_bad_arguments(odd_shapes_refused=False),
        (meta(16, 32), meta(32, 16), {"config": "e4m3"}, TypeError, "Float8QuantConfig"),
        (meta(16, 32), meta(32, 16), {"config": Float8QuantConfig(granularity=G.BLOCKWISE, block_size=64)},
         ValueError, "block_size=128"),
    ],
)
def test_bad_arguments_raise_clear_errors(a, b, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.gemm_fp8(a, b, **kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"granularity": G.BLOCKWISE}, "needs block_size"),
        ({"granularity": G.TENSORWISE, "block_size": 128}, "block_size is only meaningful"),
        ({"format": Format.E2M1_X2}, "format must be"),
        ({"granularity": G.MX_BLOCKWISE, "block_size": 16}, "block_size=32"),
    ],
)
def test_bad_configs_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Float8QuantConfig(**kwargs)


def test_prequantized_operands_are_checked():
    qa = torch.empty(16, 256, device="meta", dtype=torch.float8_e4m3fn)
    qb = torch.empty(32, 256, device="meta", dtype=torch.float8_e4m3fn)
    s = torch.empty((), device="meta", dtype=torch.float32)
    out = turbo.ops.gemm_fp8((qa, s), (qb, s), trans_b=True, out_dtype=torch.bfloat16)
    assert out.shape == (16, 32)
    with pytest.raises(ValueError, match="K-major"):
        turbo.ops.gemm_fp8((qa, s), (qb, s), trans_b=False, out_dtype=torch.bfloat16)
    cfg = Float8QuantConfig(granularity=G.BLOCKWISE, block_size=128)
    bad = torch.empty(16, 3, device="meta", dtype=torch.float32)
    with pytest.raises(ValueError, match=r"scale_inv has shape \(16, 3\); expected \[16, 2\]"):
        turbo.ops.gemm_fp8((qa, bad), (qb, s), trans_b=True, out_dtype=torch.bfloat16, config=cfg)
    with pytest.raises(TypeError, match="both"):
        turbo.ops.gemm_fp8((qa, s), meta(32, 256), trans_b=True)


def test_kernel_scale_layouts():
    s = torch.arange(6 * 3, dtype=torch.float32).reshape(6, 3)
    t = kernel_scale(s, BLOCK_1x128, 6, 300)
    assert t.shape == (3, 8) and t.is_contiguous() and torch.equal(t[:, :6], s.t())
    w = torch.arange(2 * 3, dtype=torch.float32).reshape(2, 3)
    t = kernel_scale(w, BLOCK_128x128, 200, 300)
    assert t.shape == (2, 4) and torch.equal(t[:, :3], w)
    assert kernel_scale(torch.ones(5, 1), ROW, 5, 16).shape == (5,)
    assert kernel_scale(torch.tensor(2.0), TENSOR, 5, 16).dim() == 0


def test_megatron_pattern_validates_main_grad():
    w = meta(16, 32, grad=True)
    with pytest.raises(ValueError, match="main_grad"):
        turbo.ops.gemm_fp8(meta(16, 32), w, trans_b=True, fuse_bgrad_accum_pattern="megatron")
    w.main_grad = meta(16, 32, dtype=torch.float32)
    turbo.ops.gemm_fp8(meta(16, 32), w, trans_b=True, fuse_bgrad_accum_pattern="megatron")
    assert w.grad_added_to_main_grad is True


def test_float8_linear_from_float_shares_parameters():
    lin = torch.nn.Linear(32, 16, device="meta", dtype=torch.bfloat16)
    cfg = Float8QuantConfig(format=Format.HYBRID, granularity=G.ROWWISE)
    f8 = turbo.modules.Float8Linear.from_float(lin, cfg, inplace=False)
    assert f8.weight is lin.weight and f8.bias is lin.bias and f8.config is cfg
    assert f8(meta(16, 32)).shape == (16, 16)
    with pytest.raises(ValueError, match="in_features=32"):
        f8(meta(16, 16))
    with pytest.raises(TypeError, match="nn.Linear"):
        turbo.modules.Float8Linear.from_float(torch.nn.ReLU(), cfg)
    with pytest.raises(TypeError, match="Float8QuantConfig"):
        turbo.modules.Float8Linear(32, 16, config="blockwise", device="meta")
    # inplace=True (the default, as the original): the module itself changes class.
    lin2 = torch.nn.Linear(32, 16, device="meta", dtype=torch.bfloat16)
    same = turbo.modules.Float8Linear.from_float(lin2, cfg, cache_quantized_weight=True)
    assert same is lin2 and type(same) is turbo.modules.Float8Linear and same.cache_quantized_weight
    assert "cache_quantized_weight=True" in repr(same)
    lin3 = torch.nn.Linear(32, 16, device="meta", dtype=torch.bfloat16)
    other = turbo.modules.Float8Linear.from_float(lin3, cfg, inplace=False)
    assert other is not lin3 and type(lin3) is torch.nn.Linear and other.weight is lin3.weight


def test_odd_shapes_are_padded_inside_the_op():
    # K, M, N that are not multiples of 16: zero-padded for the FP8 kernels, cut back after.
    for trans_a, trans_b in ((False, False), (True, True)):
        a = meta(40, 20, grad=True) if trans_a else meta(20, 40, grad=True)
        b = meta(24, 40, grad=True) if trans_b else meta(40, 24, grad=True)
        out = turbo.ops.gemm_fp8(a, b, trans_a=trans_a, trans_b=trans_b)
        assert out.shape == (20, 24)
        out.sum().backward()
        assert a.grad.shape == a.shape and b.grad.shape == b.shape
    w = meta(24, 40, grad=True)
    w.main_grad = torch.zeros(24, 40, device="meta", dtype=torch.float32)
    turbo.ops.gemm_fp8(meta(20, 40), w, trans_b=True, fuse_bgrad_accum_pattern="megatron").sum().backward()
    assert w.grad_added_to_main_grad


@pytest.mark.parametrize("g", [G.TENSORWISE, G.ROWWISE, G.BLOCKWISE, G.MX_BLOCKWISE], ids=lambda v: v.name)
def test_float8_linear_weight_cache_shapes_reuse_and_refresh(g):
    block = {G.BLOCKWISE: 128, G.MX_BLOCKWISE: 32}.get(g)
    extra = {"scale_dtype": ScaleDtype.E8M0} if g == G.MX_BLOCKWISE else {}
    cfg = Float8QuantConfig(format=Format.HYBRID, granularity=g, block_size=block, **extra)
    layer = turbo.modules.Float8Linear(64, 32, config=cfg, device="meta", dtype=torch.bfloat16,
                                       cache_quantized_weight=True)
    x = meta(16, 64, grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.shape == (16, 32) and x.grad.shape == (16, 64) and layer.weight.grad.shape == (32, 64)
    first = layer._weight_cache[1]
    layer(x)
    assert layer._weight_cache[1] is first  # the same weight: the cached copies serve again
    with torch.no_grad():
        layer.weight.mul_(0.5)  # an optimizer step changes the weight in place
    layer(x)
    assert layer._weight_cache[1] is not first


def _cached_layer():
    cfg = Float8QuantConfig(format=Format.HYBRID, granularity=G.ROWWISE)
    return turbo.modules.Float8Linear(64, 32, config=cfg, device="meta", dtype=torch.bfloat16,
                                      cache_quantized_weight=True)


def test_float8_linear_weight_cache_is_dropped_when_it_could_be_stale():
    import copy

    layer = _cached_layer()
    x = meta(16, 64, grad=True)
    layer(x)
    assert layer._weight_cache is not None
    # Any torch optimizer step drops it (an optimizer may write through .data, which keeps the
    # version counter), as do invalidate_weight_cache(), .to() and an in-place config edit.
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(x).sum().backward()
    opt.step()
    assert layer._weight_cache is None
    layer(x)
    layer.invalidate_weight_cache()
    assert layer._weight_cache is None
    layer(x)
    layer.to(torch.float32)
    assert layer._weight_cache is None
    layer(meta(16, 64, dtype=torch.float32))
    first = layer._weight_cache[1]
    layer.config.format = Format.E4M3
    layer(meta(16, 64, dtype=torch.float32))
    assert layer._weight_cache[1] is not first
    # Copies and pickles leave the cache behind.
    assert copy.deepcopy(layer)._weight_cache is None


def test_float8_linear_weight_cache_skips_inference_mode():
    layer = _cached_layer()
    with torch.inference_mode():
        layer(meta(16, 64))
    assert layer._weight_cache is None  # inference tensors could not serve a later backward
    x = meta(16, 64, grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad.shape == (32, 64)


def test_float8_linear_from_float_in_place_refuses_subclasses():
    class Custom(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    cfg = Float8QuantConfig(format=Format.HYBRID, granularity=G.ROWWISE)
    with pytest.raises(TypeError, match="pass inplace=False"):
        turbo.modules.Float8Linear.from_float(Custom(32, 16, device="meta"), cfg)
    new = turbo.modules.Float8Linear.from_float(Custom(32, 16, device="meta"), cfg, inplace=False)
    assert type(new) is turbo.modules.Float8Linear


def test_audit_fixes_for_prequantized_operands_and_modules():
    e4 = torch.float8_e4m3fn
    qa, qb = meta(32, 64, dtype=e4), meta(48, 64, dtype=e4)
    sa, sb = meta(32, 1, dtype=torch.float32), meta(48, 1, dtype=torch.float32)
    row = Float8QuantConfig(granularity=G.ROWWISE)
    with pytest.raises(ValueError, match="argument 'a_scale_inv' is on cpu"):
        turbo.ops.gemm_fp8((qa, torch.empty(32, 1)), (qb, sb), trans_b=True, out_dtype=torch.bfloat16, config=row)
    with pytest.raises(TypeError, match="pair \\(q, scale_inv\\)"):
        turbo.ops.gemm_fp8((qa, sa, sa, sa), (qb, sb), trans_b=True, out_dtype=torch.bfloat16, config=row)
    with pytest.raises(TypeError, match="out_dtype"):
        turbo.ops.gemm_fp8((qa, sa), (qb, sb), trans_b=True, out_dtype=torch.int32, config=row)
    mx = Float8QuantConfig(granularity=G.MX_BLOCKWISE, block_size=32, scale_dtype=ScaleDtype.E8M0)
    with pytest.raises(NotImplementedError, match="not MX_BLOCKWISE"):
        turbo.ops.gemm_fp8((qa, sa, meta(32, 64)), meta(48, 64), trans_b=True, config=mx)
    with pytest.raises(TypeError, match="argument 'trans_a' must be a bool"):
        turbo.ops.gemm(meta(32, 64), meta(64, 48), trans_a="yes")
    with pytest.raises(TypeError, match="out_dtype must be a torch.dtype"):
        turbo.ops.gemm(meta(32, 64), meta(64, 48), out_dtype="bf16")
    with pytest.raises(TypeError, match="argument 'b'"):
        turbo.ops.gemm(meta(32, 64), None)
    for layer in (turbo.modules.Linear(64, 32, device="meta"), turbo.modules.Float8Linear(64, 32, device="meta")):
        with pytest.raises(TypeError, match="input must be a torch.Tensor"):
            layer([1.0] * 64)
        with pytest.raises(ValueError, match="at least 1 dimension"):
            layer(torch.tensor(1.0, device="meta"))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        turbo.convert_model(None)


def test_gemm_float32_output_of_bf16_operands_trains():
    a, b = meta(32, 64, grad=True), meta(64, 48, grad=True)
    out = turbo.ops.gemm(a, b, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    out.sum().backward()  # the float32 gradient meets bf16 operands
    assert a.grad.dtype == torch.bfloat16 and b.grad.shape == (64, 48)


def test_core_fast_accum_flag_is_part_of_the_problem_key():
    import ctypes

    from primus_turbo import precompile
    from primus_turbo._core import lib
    from primus_turbo._core.lib import string_out

    e4m3, f32, bf16 = 3, 0, 2
    parts = [precompile._tensor((64, 128), e4m3), precompile._tensor((), f32), precompile._tensor((32, 128), e4m3),
             precompile._tensor((), f32), precompile._tensor((64, 32), bf16)]
    a, sa, b, sb, d = (ctypes.pointer(t) for t in parts)

    def key(flags):
        return string_out(lib.pt_gemm_fp8_problem_key, a, sa, TENSOR, b, sb, TENSOR, d, 0.0, flags, size=256)

    assert "fast_accum" not in key(0) and key(1).endswith("|fast_accum")
    with pytest.raises(ValueError, match="argument 'flags' has unknown bits"):
        key(2)
