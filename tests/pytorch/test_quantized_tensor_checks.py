"""QuantizedTensor mechanics and argument checks that need no GPU: construction, views, flattening
for torch.compile, refused ops, check_quantized_tensor, and the grouped quantize ops' errors."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingRecipe
from primus_turbo.pytorch.core.low_precision import ScalingGranularity as G
from primus_turbo.pytorch.core.quantized_tensor import (
    QuantizedTensor,
    QuantizedTensorPair,
    check_quantized_tensor,
    create_quantized_weight,
)


def rowwise(shape=(4, 8, 16)):
    data = torch.randn(*shape).to(torch.float8_e4m3fn)
    scale = torch.rand(*shape[:-1], 1) + 0.5
    return QuantizedTensor(data, scale, shape=shape, orig_dtype=torch.bfloat16, dest_dtype=torch.float8_e4m3fn,
                           granularity=G.ROWWISE, quantized_axis=len(shape) - 1)


def test_wrapper_reports_the_high_precision_tensor():
    qt = rowwise()
    assert qt.shape == (4, 8, 16) and qt.dtype == torch.bfloat16 and qt.real_dtype == torch.float8_e4m3fn
    assert qt.qdata.shape == (4, 8, 16) and qt.scale_inv.shape == (4, 8, 1)
    assert "ROWWISE" in repr(qt) and not qt.is_grouped_tensor
    with pytest.raises(AttributeError, match="not a grouped tensor"):
        qt.group_lens


def test_reshape_of_leading_dims_stays_quantized():
    qt = rowwise()
    flat = qt.reshape(-1, 16)
    assert isinstance(flat, QuantizedTensor) and flat.shape == (32, 16) and flat.scale_inv.shape == (32, 1)
    assert flat.quantized_axis == 1
    assert isinstance(qt.view(32, 16), QuantizedTensor)
    with pytest.raises(NotImplementedError, match="split scale groups"):
        qt.reshape(4, 128)


def test_detach_and_flatten_round_trip():
    qt = rowwise()
    d = qt.detach()
    assert isinstance(d, QuantizedTensor) and torch.equal(d.qdata.view(torch.uint8), qt.qdata.view(torch.uint8))
    names, meta = qt.__tensor_flatten__()
    assert names == ["_data", "_scale_inv"]
    back = QuantizedTensor.__tensor_unflatten__({n: getattr(qt, n) for n in names}, meta, qt.shape, None)
    assert back.granularity == G.ROWWISE and back.quantized_axis == 2 and back.shape == qt.shape


def test_other_ops_raise_and_name_dequantize():
    qt = rowwise()
    with pytest.raises(NotImplementedError, match="dequantize"):
        torch.add(qt, 1)
    with pytest.raises(NotImplementedError, match="dequantize"):
        qt.sum()


def test_constructor_checks():
    data = torch.zeros(4, 4, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="dest_dtype"):
        QuantizedTensor(data, torch.ones(()), shape=(4, 4), orig_dtype=torch.bfloat16, dest_dtype=torch.int8,
                        granularity=G.TENSORWISE)
    with pytest.raises(TypeError, match="orig_dtype"):
        QuantizedTensor(data, torch.ones(()), shape=(4, 4), orig_dtype=torch.int32, dest_dtype=torch.float8_e4m3fn,
                        granularity=G.TENSORWISE)


def test_check_quantized_tensor():
    qt = rowwise((8, 16))
    check_quantized_tensor(qt, Float8QuantConfig(granularity=G.ROWWISE), axis=-1)
    with pytest.raises(ValueError, match="granularity"):
        check_quantized_tensor(qt, Float8QuantConfig())
    with pytest.raises(ValueError, match="axis"):
        check_quantized_tensor(qt, Float8QuantConfig(granularity=G.ROWWISE), axis=0)
    with pytest.raises(ValueError, match="scaling_recipe"):
        check_quantized_tensor(qt, Float8QuantConfig(granularity=G.ROWWISE), scaling_recipe=ScalingRecipe(use_2d_block=True))


def test_quantize_and_create_quantized_weight_checks():
    with pytest.raises(ValueError, match="axis"):
        QuantizedTensor.quantize(torch.randn(4, 4), torch.float8_e4m3fn, G.ROWWISE)
    with pytest.raises(ValueError, match="2-D or 3-D"):
        QuantizedTensor.quantize(torch.randn(4), torch.float8_e4m3fn, G.TENSORWISE)
    with pytest.raises(TypeError, match="quant_config"):
        create_quantized_weight(torch.randn(4, 4), torch.float8_e4m3fn, "rowwise")


def test_gemm_fp8_quantized_operand_checks():
    qt = rowwise((32, 48))
    row = Float8QuantConfig(granularity=G.ROWWISE)
    with pytest.raises(ValueError, match="inner dimensions"):
        turbo.ops.gemm_fp8(torch.randn(16, 32, dtype=torch.bfloat16), qt, trans_b=True, config=row)
    with pytest.raises(ValueError, match="CUDA"):
        turbo.ops.gemm_fp8(torch.randn(16, 48, dtype=torch.bfloat16), qt, trans_b=True, config=row)
    with pytest.raises(TypeError, match="QuantizedTensorPair"):
        turbo.ops.gemm_fp8(torch.randn(16, 48), QuantizedTensorPair(torch.randn(32, 48)), trans_b=True)
    # The backward quantizes the gradient per config: an operand quantized otherwise is refused up front.
    with pytest.raises(ValueError, match="ROWWISE .* config is TENSORWISE"):
        turbo.ops.gemm_fp8(torch.randn(16, 48, dtype=torch.bfloat16), qt, trans_b=True)
    # data_t is the same tensor quantized along its other dim, not its transpose.
    with pytest.raises(ValueError, match="data_t has shape"):
        turbo.ops.gemm_fp8(torch.randn(16, 48, dtype=torch.bfloat16), QuantizedTensorPair(qt, rowwise((48, 32))),
                           trans_b=True, config=row)


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


def test_grouped_quantize_checks():
    lens = torch.tensor([2, 2], device="meta", dtype=torch.int64)
    with pytest.raises(NotImplementedError, match="quantize_fp8"):
        turbo.ops.grouped_quantize_fp8(meta(4, 64), torch.float8_e4m3fn, G.ROWWISE, lens, axis=-1)
    with pytest.raises(ValueError, match="2-D"):
        turbo.ops.grouped_quantize_fp8(meta(2, 4, 64), torch.float8_e4m3fn, G.MX_BLOCKWISE, lens, axis=-1, block_size=32)
    with pytest.raises(ValueError, match="axis"):
        turbo.ops.grouped_quantize_fp8(meta(4, 64), torch.float8_e4m3fn, G.MX_BLOCKWISE, lens, axis=None, block_size=32)
    with pytest.raises(ValueError, match="group_offs"):
        turbo.ops.grouped_quantize_fp8(meta(4, 64), torch.float8_e4m3fn, G.MX_BLOCKWISE, lens,
                                       torch.zeros(2, device="meta", dtype=torch.int64), axis=-1, block_size=32)
    with pytest.raises(TypeError, match="group_lens"):
        turbo.ops.grouped_quantize_fp8(meta(4, 64), torch.float8_e4m3fn, G.MX_BLOCKWISE, [2, 2], axis=-1, block_size=32)
    with pytest.raises(ValueError, match="axis"):
        turbo.ops.quantize_fp4_with_trans(meta(4, 64), axis=-1)


def test_shuffled_recipes_are_refused():
    with pytest.raises(ValueError, match="shuffle"):
        turbo.ops.quantize_fp8(meta(4, 64), torch.float8_e4m3fn, G.BLOCKWISE, block_size=128, axis=-1,
                               scaling_recipe=ScalingRecipe(shuffle_scale=True))


# ---- shapes through the fake (meta) implementations: the layouts without a GPU ---------------------


def test_quantize_records_the_block_size_the_quantizer_applies():
    qt = QuantizedTensor.quantize(meta(64, 96), torch.float8_e4m3fn, G.MX_BLOCKWISE, axis=-1)
    assert qt.block_size == 32 and qt.scale_inv.shape == (64, 3)
    row = QuantizedTensor.quantize(meta(64, 96), torch.float8_e4m3fn, G.ROWWISE, axis=-1, block_size=128)
    assert row.block_size is None


@pytest.mark.parametrize("g,block,groups", [(G.ROWWISE, None, 1), (G.BLOCKWISE, 128, 1), (G.MX_BLOCKWISE, 32, 2)])
def test_transposes_move_data_and_scales_together(g, block, groups):
    q = QuantizedTensor.quantize(meta(2, 64, 96), torch.float8_e4m3fn, g, axis=1, block_size=block)
    assert q.scale_inv.shape == (2, groups, 96)
    t = q.transpose(1, 2)
    assert t.shape == (2, 96, 64) and t.qdata.shape == (2, 96, 64) and t.scale_inv.shape == (2, 96, groups)
    assert t.quantized_axis == 2


def test_grouped_ops_trace_with_quantized_mx_operands():
    cfg = Float8QuantConfig(granularity=G.MX_BLOCKWISE, block_size=32,
                            scale_dtype=__import__("primus_turbo.pytorch.core.low_precision",
                                                   fromlist=["ScaleDtype"]).ScaleDtype.E8M0)
    w, lens = meta(3, 64, 96), torch.empty(3, device="meta", dtype=torch.int64)
    qw, qw_t = create_quantized_weight(w, torch.float8_e4m3fn, cfg, need_weight_transpose_cache=True)
    assert qw_t.quantized_axis == 1 and qw_t.shape == w.shape
    out = turbo.ops.grouped_gemm_fp8(meta(40, 96), QuantizedTensorPair(qw, qw_t), lens, config=cfg)
    assert out.shape == (40, 64)
    q, s, lens_p, offs_p = turbo.ops.grouped_quantize_fp8(meta(40, 96), torch.float8_e4m3fn, G.MX_BLOCKWISE, lens,
                                                           axis=0, block_size=32)
    assert q.shape == (96, 512) and s.shape == (96, 16) and lens_p.shape == (3,) and offs_p.shape == (4,)


def test_transpose_dims_and_weight_dtype_are_checked():
    from primus_turbo.pytorch.core.low_precision import Float4QuantConfig, Float8QuantConfig, Format

    w = torch.empty(64, 128, device="meta", dtype=torch.bfloat16)
    qt = QuantizedTensor.quantize(w, torch.float8_e4m3fn, G.ROWWISE, axis=-1)
    for dims in ((0, 5), (0, -3)):
        with pytest.raises(IndexError, match="out of range"):
            qt.transpose(*dims)
    with pytest.raises(ValueError, match="does not match the config's format"):
        create_quantized_weight(w, torch.float8_e4m3fn, Float8QuantConfig(format=Format.E5M2))
    with pytest.raises(ValueError, match="does not match the config's format"):
        create_quantized_weight(w, torch.float8_e4m3fn, Float4QuantConfig())


def test_reshape_to_a_wrong_size_is_named():
    w = torch.empty(64, 256, device="meta", dtype=torch.bfloat16)
    qt = QuantizedTensor.quantize(w, torch.float8_e4m3fn, G.ROWWISE, axis=-1)
    for shape in ((3, 256), (-1, 3, 256), (-1, -1, 256)):
        with pytest.raises(ValueError, match="shape"):
            qt.view(*shape)
    assert qt.view(4, 16, 256).shape == (4, 16, 256)
