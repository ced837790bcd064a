"""Host-side behaviour of the quantization ops that needs no GPU: argument errors (Python and the
core), output shapes through meta tensors, and torch.compile traces without graph breaks."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo._core import check, lib
from primus_turbo.pytorch.core.low_precision import ScalingGranularity as G
from primus_turbo.pytorch.core.low_precision import ScalingRecipe

from host_check_utils import FAKE_PTR, desc, meta

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP4 = turbo.float4_e2m1fn_x2 or torch.uint8
E8M0 = torch.float8_e8m0fnu


@pytest.mark.parametrize(
    "g,block,axis,two_d,scale_shape,scale_dtype",
    [
        (G.TENSORWISE, None, None, False, (), torch.float32),
        (G.ROWWISE, None, -1, False, (300, 1), torch.float32),
        (G.ROWWISE, None, 1, False, (300, 1), torch.float32),
        (G.ROWWISE, None, 0, False, (1, 200), torch.float32),
        (G.ROWWISE, None, -2, False, (1, 200), torch.float32),
        (G.BLOCKWISE, 128, -1, False, (300, 2), torch.float32),
        (G.BLOCKWISE, 128, 0, False, (3, 200), torch.float32),
        (G.BLOCKWISE, 128, None, True, (3, 2), torch.float32),
        (G.BLOCKWISE, 64, -1, False, (300, 4), torch.float32),
        (G.MX_BLOCKWISE, 32, -1, False, (300, 8), E8M0),
        (G.MX_BLOCKWISE, 32, 0, False, (200, 12), E8M0),
        (G.MX_BLOCKWISE, 32, None, True, (10, 7), E8M0),
    ],
)
def test_quantize_fp8_shapes(g, block, axis, two_d, scale_shape, scale_dtype):
    x = meta(300, 200)
    recipe = ScalingRecipe(use_2d_block=True) if two_d else None
    q, s = turbo.ops.quantize_fp8(x, E4M3, g, block_size=block, axis=axis, scaling_recipe=recipe)
    # MX (1-D blocks) in the original's padded layouts: the quantized dim padded to 128, and along
    # dim 0 stored transposed.
    padded = g == G.MX_BLOCKWISE and not two_d
    want_q = {-1: (300, 256), 0: (200, 384)}[axis] if padded else (300, 200)
    assert q.shape == want_q and q.dtype == E4M3
    assert s.shape == scale_shape and s.dtype == scale_dtype
    out = turbo.ops.dequantize_fp8(q, torch.float16, g, block_size=block, axis=axis, scale_inv=s, scaling_recipe=recipe)
    want_out = {-1: (300, 256), 0: (384, 200)}[axis] if padded else (300, 200)
    assert out.shape == want_out and out.dtype == torch.float16


@pytest.mark.parametrize("axis,scale_shape", [(-1, (300, 7)), (0, (10, 200))])
def test_unpadded_mx_layouts_for_the_gemms(axis, scale_shape):
    # The GEMMs' own layouts: nothing padded, every axis quantized in place.
    q, s = turbo.ops.quantization.quantize_fp8_unpadded(meta(300, 200), E4M3, G.MX_BLOCKWISE, block_size=32, axis=axis)
    assert q.shape == (300, 200) and s.shape == scale_shape
    out = turbo.ops.quantization.dequantize_fp8_unpadded(q, torch.float32, G.MX_BLOCKWISE, block_size=32, axis=axis,
                                                         scale_inv=s)
    assert out.shape == (300, 200)


def test_mx_padded_layouts_of_3d_inputs_and_with_trans():
    # As the original: [G, M, N] along N -> [G, M, N_pad]; along M -> [G, N, M_pad] per group.
    q, s = turbo.ops.quantize_fp8(meta(2, 150, 200), E4M3, G.MX_BLOCKWISE, block_size=32, axis=2)
    assert q.shape == (2, 150, 256) and s.shape == (2, 150, 8)
    q, s = turbo.ops.quantize_fp8(meta(2, 150, 200), E4M3, G.MX_BLOCKWISE, block_size=32, axis=1)
    assert q.shape == (2, 200, 256) and s.shape == (2, 200, 8)
    out = turbo.ops.dequantize_fp8(q, torch.bfloat16, G.MX_BLOCKWISE, block_size=32, axis=1, scale_inv=s)
    assert out.shape == (2, 256, 200)
    outs = turbo.ops.quantize_fp8_with_trans(meta(300, 200), E4M3, G.MX_BLOCKWISE, block_size=32)
    assert [tuple(t.shape) for t in outs] == [(300, 256), (300, 8), (200, 384), (200, 12)]
    outs = turbo.ops.quantize_fp8_with_trans(meta(2, 150, 200), E4M3, G.MX_BLOCKWISE, block_size=32)
    assert [tuple(t.shape) for t in outs] == [(2, 150, 256), (2, 150, 8), (2, 200, 256), (2, 200, 8)]


def test_higher_rank_input_keeps_its_dims_in_the_scales():
    # One scale per group along the axis; the other dims as x's (the original's ROWWISE layout).
    q, s = turbo.ops.quantize_fp8(meta(2, 150, 200), E5M2, G.BLOCKWISE, block_size=128, axis=-1)
    assert q.shape == (2, 150, 200) and s.shape == (2, 150, 2)
    q, s = turbo.ops.quantize_fp8(meta(2, 150, 200), E5M2, G.ROWWISE, axis=2)
    assert s.shape == (2, 150, 1)
    for axis, shape in ((0, (1, 150, 200)), (1, (2, 1, 200)), (-3, (1, 150, 200)), (-2, (2, 1, 200))):
        q, s = turbo.ops.quantize_fp8(meta(2, 150, 200), E4M3, G.ROWWISE, axis=axis)
        assert q.shape == (2, 150, 200) and q.is_contiguous() and s.shape == shape, axis
        out = turbo.ops.dequantize_fp8(q, torch.bfloat16, G.ROWWISE, axis=axis, scale_inv=s)
        assert out.shape == (2, 150, 200) and out.is_contiguous()
    # The GEMMs' unpadded MX layout quantizes a middle dim in place (the public one: see above).
    qz = turbo.ops.quantization
    q, s = qz.quantize_fp8_unpadded(meta(2, 150, 200), E4M3, G.MX_BLOCKWISE, block_size=32, axis=1)
    assert s.shape == (2, 5, 200) and s.dtype == E8M0
    out = qz.dequantize_fp8_unpadded(q, torch.float32, G.MX_BLOCKWISE, block_size=32, axis=1, scale_inv=s)
    assert out.shape == (2, 150, 200)
    # Along the last dim, flattened scales are accepted too.
    q, s = turbo.ops.quantize_fp8(meta(2, 150, 200), E4M3, G.ROWWISE, axis=-1)
    out = turbo.ops.dequantize_fp8(q, torch.float32, G.ROWWISE, axis=-1, scale_inv=s.reshape(300, 1))
    assert out.shape == (2, 150, 200)


@pytest.mark.parametrize(
    "g,block,two_d,shapes",
    [
        (G.TENSORWISE, None, False, [(), ()]),
        (G.ROWWISE, None, False, [(300, 1), (200, 1)]),
        (G.BLOCKWISE, 128, False, [(300, 2), (3, 200)]),
        (G.BLOCKWISE, 128, True, [(3, 2), (2, 3)]),
        (G.MX_BLOCKWISE, 32, False, [(300, 8), (200, 12)]),
    ],
)
def test_quantize_fp8_with_trans_shapes(g, block, two_d, shapes):
    recipe = ScalingRecipe(use_2d_block=True) if two_d else None
    q_row, s_row, q_col, s_col = turbo.ops.quantize_fp8_with_trans(meta(300, 200), E4M3, g, block_size=block,
                                                                   scaling_recipe=recipe)
    in_place = g == G.BLOCKWISE and not two_d  # as the original: the column copy quantized in place
    mx = g == G.MX_BLOCKWISE  # as the original: each quantized dim padded to 128
    assert q_row.shape == ((300, 256) if mx else (300, 200))
    assert q_col.shape == ((300, 200) if in_place else ((200, 384) if mx else (200, 300)))
    assert q_col.dtype == E4M3 and s_row.shape == shapes[0] and s_col.shape == shapes[1]
    if in_place:  # dequantized as quantize_fp8(axis=0)'s output
        out = turbo.ops.dequantize_fp8(q_col, torch.float32, g, block_size=block, axis=0, scale_inv=s_col)
        assert out.shape == (300, 200)


@pytest.mark.parametrize(
    "axis,two_d,q_shape,s_shape",
    [(-1, False, (300, 128), (300, 8)), (0, False, (200, 192), (200, 12)), (-1, True, (300, 128), (10, 8)),
     (0, True, (200, 192), (7, 12))],
)
def test_quantize_fp4_shapes(axis, two_d, q_shape, s_shape):
    # The original's padded layouts: the quantized dim padded to 128 (the dequantized result keeps it).
    q, s = turbo.ops.quantize_fp4(meta(300, 200), axis=axis, scaling_recipe=ScalingRecipe(use_2d_block=two_d))
    assert q.shape == q_shape and q.dtype == FP4 and s.shape == s_shape and s.dtype == E8M0
    out = turbo.ops.dequantize_fp4(q, torch.bfloat16, axis=axis, scale_inv=s, scaling_recipe=ScalingRecipe(use_2d_block=two_d))
    assert out.shape == ((300, 256) if axis == -1 else (384, 200))
    # The GEMMs' unpadded layout.
    q, s = turbo.ops.quantization.quantize_fp4_unpadded(meta(300, 200), axis=axis,
                                                       scaling_recipe=ScalingRecipe(use_2d_block=two_d))
    assert q.shape == ((300, 100) if axis == -1 else (200, 150))


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(130, 256, device="cuda", dtype=torch.float16)
        q, s = turbo.ops.quantize_fp8(x, E5M2, G.BLOCKWISE, block_size=128, axis=0)
        q4, s4 = turbo.ops.quantize_fp4(x, axis=-1, scaling_recipe=ScalingRecipe(use_rht=True, use_sr=True))
    assert q.shape == (130, 256) and s.shape == (2, 256) and q.device.type == "cuda"
    assert q4.shape == (130, 128) and s4.shape == (130, 8)


def test_torch_compile_traces_without_graph_break():
    def fn(x):
        q, s = turbo.ops.quantize_fp8(x, E4M3, G.MX_BLOCKWISE, block_size=32, axis=-1)
        a = turbo.ops.dequantize_fp8(q, torch.float32, G.MX_BLOCKWISE, block_size=32, axis=-1, scale_inv=s)
        _, _, q_col, s_col = turbo.ops.quantize_fp8_with_trans(x, E4M3, G.BLOCKWISE, block_size=128)
        f, fs = turbo.ops.quantize_fp4(x, axis=-1, scaling_recipe=ScalingRecipe(use_sr=True), seed=7)
        return a * 2, q_col, s_col, f, fs

    outs = torch.compile(fn, fullgraph=True, backend="aot_eager")(meta(256, 512))
    assert outs[0].shape == (256, 512) and outs[1].shape == (256, 512) and outs[2].shape == (2, 512)
    assert outs[3].shape == (256, 256)


def test_registered_as_custom_ops():
    assert "primus_turbo::quantize(Tensor x, ScalarType out_dtype" in str(torch.ops.primus_turbo.quantize.default._schema)
    assert "primus_turbo::dequantize(Tensor q, Tensor scale_inv" in str(torch.ops.primus_turbo.dequantize.default._schema)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: turbo.ops.quantize_fp8(torch.randn(4, 8), E4M3, G.TENSORWISE), ValueError, "is on cpu"),
        (lambda: turbo.ops.quantize_fp8([1.0], E4M3, G.TENSORWISE), TypeError, "argument 'x' must be a torch.Tensor"),
        (lambda: turbo.ops.quantize_fp8(meta(4, 8, dtype=torch.int32), E4M3, G.TENSORWISE), TypeError, "argument 'x' has dtype"),
        (lambda: turbo.ops.quantize_fp8(meta(4, 8), torch.bfloat16, G.TENSORWISE), TypeError, "argument 'out_dtype'"),
        (lambda: turbo.ops.quantize_fp8(meta(4, 8), E4M3, "tensorwise"), TypeError, "argument 'granularity'"),
        (lambda: turbo.ops.quantize_fp8(meta(4, 8), E4M3, G.ROWWISE), ValueError, "argument 'axis' is required"),
        (lambda: turbo.ops.quantize_fp8(meta(4, 8), E4M3, G.ROWWISE, axis=3), ValueError, "argument 'axis' is 3"),
        (lambda: turbo.ops.quantize_fp8(meta(4, 8), E4M3, G.BLOCKWISE, axis=-1), ValueError, "'block_size' is required"),
        (lambda: turbo.ops.quantize_fp8(meta(4, 8), E4M3, G.BLOCKWISE, block_size=100, axis=-1), ValueError, "32, 64 or 128"),
        (lambda: turbo.ops.quantize_fp8(meta(4, 8), E4M3, G.MX_BLOCKWISE, block_size=16, axis=-1), ValueError, "needs 32"),
        (lambda: turbo.ops.quantize_fp8(meta(), E4M3, G.TENSORWISE), ValueError, "at least 1 dimension"),
        (lambda: turbo.ops.quantize_fp8_with_trans(meta(4, 8), E4M3, G.BLOCKWISE, block_size=128,
                                                   scaling_recipe=ScalingRecipe(use_2d_block=True),
                                                   scaling_recipe_for_trans=ScalingRecipe()), ValueError, "must agree"),
        (lambda: turbo.ops.dequantize_fp8(meta(4, 8), torch.float32, G.TENSORWISE, scale_inv=meta(dtype=torch.float32)),
         TypeError, "argument 'x' has dtype"),
        (lambda: turbo.ops.dequantize_fp8(meta(4, 8, dtype=E4M3), torch.float32, G.TENSORWISE, scale_inv=None),
         TypeError, "'scale_inv' must be a torch.Tensor"),
        (lambda: turbo.ops.quantization.quantize_fp4_unpadded(meta(4, 7), axis=-1), ValueError, "must be even"),
        (lambda: turbo.ops.quantization.quantize_fp4_unpadded(meta(4, 8), axis=-1, scaling_recipe=ScalingRecipe(use_rht=True)),
         ValueError, "multiple of 16"),
        (lambda: turbo.ops.quantize_fp4(meta(4, 32), axis=-1, scaling_recipe=ScalingRecipe(use_rht=True, use_2d_block=True)),
         ValueError, "cannot be combined"),
        (lambda: turbo.ops.quantize_fp4(meta(4, 32), granularity=G.BLOCKWISE, axis=-1), ValueError, "MX_BLOCKWISE only"),
        (lambda: turbo.ops.quantize_fp4(meta(4, 32)), ValueError, "'axis' is required"),
    ],
)
def test_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ---- the core's own checks (a C++ or JAX caller sees these); no device work happens ----------------


def quantize(x, q_row, s_row, q_col=None, s_col=None, g=2, block=128, trans=1, flags=0, ws=0):
    return lib.pt_quantize(x, q_row, s_row, q_col, s_col, g, block, trans, flags, 0, FAKE_PTR if ws else None, ws, None)


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        ((desc([4, 8], strides=[16, 1]), desc([4, 8], 3), desc([4, 1], 0)), {}, "argument 'x' .* must be contiguous"),
        ((desc([4, 8], 7), desc([4, 8], 3), desc([4, 1], 0)), {}, "argument 'x' has dtype int32"),
        ((desc([2, 2, 4, 8]), desc([4, 8], 3), desc([4, 1], 0)), {}, "expected a 2-D tensor"),
        ((desc([2, 4, 8]), desc([2, 4, 8], 3), desc([2, 1, 1], 0)), {}, r"stack \[b, m, k\] needs .*m % 128 == 0"),
        ((desc([4, 8]), None, None), {}, "at least one output"),
        ((desc([4, 8]), desc([4, 8], 2), desc([4, 1], 0)), {}, "argument 'q_row' has dtype bfloat16"),
        ((desc([4, 8]), desc([8, 4], 3), desc([4, 1], 0)), {}, r"argument 'q_row' has shape \[8, 4\]"),
        ((desc([4, 8]), desc([4, 8], 3), desc([4, 2], 0)), {}, r"argument 's_row' has shape \[4, 2\]; expected \[4, 1\]"),
        ((desc([4, 8]), desc([4, 8], 3), desc([4, 1], 5)), {}, "BLOCKWISE scales are float32"),
        ((desc([4, 8]), desc([4, 8], 3), desc([4, 1], 0)), {"block": 100}, "BLOCKWISE supports 32, 64 or 128"),
        ((desc([4, 8]), desc([4, 8], 3), desc([4, 1], 0)), {"g": 7}, "argument 'granularity' is 7"),
        ((desc([4, 8]), desc([4, 8], 3), desc([4], 0)), {"g": 0, "ws": 8}, "argument 's_row' has shape"),
        ((desc([4, 8]), desc([4, 8], 3), desc([], 0)), {"g": 0, "ws": 8}, "argument 'workspace' has 8 bytes"),
        ((desc([4, 8]), desc([4, 8], 3), desc([4, 1], 0)), {"flags": 2}, "FP4 options"),
        ((desc([4, 7]), desc([4, 3], 6), desc([4, 1], 5)), {"g": 3, "block": 32}, "must be even"),
        ((desc([4, 8]), desc([4, 4], 6), desc([4, 1], 0)), {"g": 3, "block": 32}, "float8_e8m0fnu"),
        # MN-major scales (the FP8 GEMM's 1x128 layout): [ceil(k/B), round_up(m, 4)], 1-D BLOCKWISE only.
        ((desc([6, 8]), desc([6, 8], 3), desc([6, 1], 0)), {"flags": 8}, r"'s_row' has shape \[6, 1\]; expected \[1, 8\]"),
        ((desc([6, 8]), desc([6, 8], 3), desc([1, 8], 0)), {"flags": 9}, "MN-major scales"),
        ((desc([6, 8]), desc([6, 8], 3), desc([1, 8], 0)), {"flags": 8, "g": 1, "ws": 64}, "MN-major scales"),
    ],
)
def test_core_rejects_bad_descriptors(args, kwargs, match):
    with pytest.raises((ValueError, NotImplementedError), match=match):
        check(quantize(*args, **kwargs))


def test_core_column_and_dequantize_checks():
    x = desc([4, 8])
    with pytest.raises(ValueError, match=r"argument 'q_col' has shape \[4, 8\]; expected \[8, 4\]"):
        check(quantize(x, None, None, desc([4, 8], 3), desc([8, 1], 0)))
    with pytest.raises(ValueError, match=r"argument 's_col' has shape"):
        check(quantize(x, None, None, desc([8, 4], 3), desc([1, 1], 0)))
    with pytest.raises(ValueError, match="'s_row' is null"):
        check(quantize(x, desc([4, 8], 3), None))
    with pytest.raises(ValueError, match=r"argument 'out' has shape \[4, 4\]; expected \[4, 8\]"):
        check(lib.pt_dequantize(desc([4, 8], 3), desc([4, 1], 0), desc([4, 4]), 2, 128, -1, 0, None))
    with pytest.raises(ValueError, match=r"argument 'scale_inv' has shape \[4, 1\]; expected \[1, 8\]"):
        check(lib.pt_dequantize(desc([4, 8], 3), desc([4, 1], 0), desc([4, 8]), 2, 128, 0, 0, None))
    with pytest.raises(ValueError, match="along axis -1"):
        check(lib.pt_dequantize(desc([4, 4], 6), desc([4, 1], 5), desc([4, 8]), 3, 32, 0, 0, None))
    # Empty problems are accepted and do nothing.
    check(quantize(desc([0, 8], ptr=None), desc([0, 8], 3, ptr=None), desc([0, 1], 0, ptr=None)))


def test_workspace_sizes():
    assert lib.pt_quantize_workspace_bytes(100, 200, 0) == 16
    assert lib.pt_quantize_workspace_bytes(100, 200, 1) == 1200
    assert lib.pt_quantize_workspace_bytes(100, 200, 2) == 0


def test_prepare_rejects_bad_dtypes():
    with pytest.raises(ValueError, match="argument 'x_dtype'"):
        check(lib.pt_quantize_prepare(3, 3))
    with pytest.raises(ValueError, match="argument 'q_dtype'"):
        check(lib.pt_quantize_prepare(2, 2))


def test_quantize_fp4_of_a_3d_input_is_per_group():
    x = meta(3, 64, 96)
    q, s = turbo.ops.quantize_fp4(x, axis=2)  # N padded to 128, as the original
    assert q.shape == (3, 64, 64) and s.shape == (3, 64, 4)
    assert turbo.ops.dequantize_fp4(q, torch.bfloat16, axis=-1, scale_inv=s).shape == (3, 64, 128)
    q, s = turbo.ops.quantize_fp4(x, axis=1)  # along M (padded), each group stored transposed
    assert q.shape == (3, 96, 64) and s.shape == (3, 96, 4)
    assert turbo.ops.dequantize_fp4(q, torch.bfloat16, axis=-2, scale_inv=s).shape == (3, 128, 96)
    q, s = turbo.ops.quantization.quantize_fp4_unpadded(x, axis=1)
    assert q.shape == (3, 96, 32) and s.shape == (3, 96, 2)
    q, s = turbo.ops.quantize_fp4(x, axis=-1, scaling_recipe=ScalingRecipe(use_2d_block=True))
    assert q.shape == (3, 64, 64) and s.shape == (3, 2, 4)
    with pytest.raises(ValueError, match="a 3-D \\[G, M, N\\] input takes 2"):
        turbo.ops.quantize_fp4(x, axis=0)
    with pytest.raises(ValueError, match="multiple of 32"):
        turbo.ops.quantize_fp4(meta(3, 40, 96), axis=-1, scaling_recipe=ScalingRecipe(use_2d_block=True))


def test_mx_padded_paths_check_arguments_before_padding():
    # CPU input, a bad recipe, a scalar: named errors, not a padded copy first.
    with pytest.raises(ValueError, match="is on cpu"):
        turbo.ops.quantize_fp8(torch.randn(4, 40), E4M3, G.MX_BLOCKWISE, block_size=32, axis=0)
    with pytest.raises(ValueError, match="is on cpu"):
        turbo.ops.quantize_fp4(torch.randn(4, 40), axis=-1)
    with pytest.raises(TypeError, match="ScalingRecipe"):
        turbo.ops.quantize_fp8(meta(4, 40), E4M3, G.MX_BLOCKWISE, block_size=32, axis=0, scaling_recipe="x")
    with pytest.raises(ValueError, match="shuffle"):
        turbo.ops.quantize_fp8(meta(4, 40), E4M3, G.MX_BLOCKWISE, block_size=32, axis=0,
                               scaling_recipe=ScalingRecipe(shuffle_scale=True))
    with pytest.raises(ValueError, match="at least 1 dimension"):
        turbo.ops.quantize_fp8(meta(), E4M3, G.MX_BLOCKWISE, block_size=32, axis=-1)
    with pytest.raises(TypeError, match="argument 'x' has dtype"):
        turbo.ops.dequantize_fp8(meta(4, 40), torch.float32, G.MX_BLOCKWISE, block_size=32, axis=0,
                                 scale_inv=meta(40, 1))


def test_fp4_seed_must_be_an_int():
    for seed in (1.5, "x", True):
        with pytest.raises(TypeError, match="argument 'seed'"):
            turbo.ops.quantize_fp4(meta(4, 64), axis=-1, scaling_recipe=ScalingRecipe(use_sr=True), seed=seed)
    np = pytest.importorskip("numpy")

    turbo.ops.quantize_fp4(meta(4, 64), axis=-1, scaling_recipe=ScalingRecipe(use_sr=True), seed=np.int64(3))


def test_dequantize_fake_checks_the_scales_like_the_core():
    q, s = turbo.ops.quantize_fp8(meta(64, 256), E4M3, G.BLOCKWISE, block_size=128, axis=-1)
    with pytest.raises(ValueError, match="argument 'scale_inv'"):
        turbo.ops.quantization._dequantize_op(q, meta(100, 3, dtype=torch.float32), torch.float32, 2, 128, -1, 0)
    with pytest.raises(ValueError, match="argument 'scale_inv'"):
        turbo.ops.quantization._dequantize_op(q, s.to(torch.int32), torch.float32, 2, 128, -1, 0)
    assert turbo.ops.quantization._dequantize_op(q, s, torch.float32, 2, 128, -1, 0).shape == (64, 256)


def test_dequantize_passes_fp4_and_e8m0_to_the_native_op_as_uint8(monkeypatch):
    # torch's stable ABI, which the native op is built on, converts neither float4_e2m1fn_x2 nor
    # float8_e8m0fnu ("Not yet supported ScalarType"); the wrapper hands both over as uint8 views.
    qz = turbo.ops.quantization
    seen = {}

    def record(q, s, *args):
        seen["q"], seen["s"] = q.dtype, s.dtype
        return q.new_empty((q.shape[0], 2 * q.shape[1] if q.dtype == torch.uint8 else q.shape[1]), dtype=args[0])

    monkeypatch.setattr(qz, "_native_dequantize", record)
    q8, s8 = meta(64, 256, dtype=E4M3), meta(64, 8, dtype=E8M0)
    qz._dequantize_op(q8, s8, torch.bfloat16, 3, 32, -1, 0)
    assert seen == {"q": E4M3, "s": torch.uint8}
    q4, s4 = meta(64, 128, dtype=FP4), meta(64, 8, dtype=E8M0)
    assert qz._dequantize_op(q4, s4, torch.bfloat16, 3, 32, -1, 0).shape == (64, 256)
    assert seen == {"q": torch.uint8, "s": torch.uint8}
