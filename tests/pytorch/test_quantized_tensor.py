"""QuantizedTensor, QuantizedTensorPair, create_quantized_weight and the grouped quantize ops on the
GPU: round trips against the plain quantize ops (bitwise) and the high-precision input (FP8 gate),
gemm_fp8 with pre-quantized operands forward and backward against the float64 product and against
gemm_fp8 of the high-precision tensors, and the padded per-group layouts."""

import sys

import pytest
import torch
from turbo_test_utils import snr_db

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScaleDtype, ScalingRecipe
from primus_turbo.pytorch.core.low_precision import ScalingGranularity as G
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor, QuantizedTensorPair, create_quantized_weight
from primus_turbo.pytorch.ops import quantization as qz

pytestmark = pytest.mark.gpu

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP4 = turbo.float4_e2m1fn_x2 or torch.uint8
FP8_MIN_SNR, FP4_MIN_SNR = 25.0, 15.0
CONFIGS = {
    "tensor": Float8QuantConfig(),
    "row": Float8QuantConfig(granularity=G.ROWWISE),
    "block": Float8QuantConfig(granularity=G.BLOCKWISE, block_size=128),
    "mx": Float8QuantConfig(granularity=G.MX_BLOCKWISE, block_size=32, scale_dtype=ScaleDtype.E8M0),
}


def randn(*shape, dtype=torch.bfloat16, grad=False):
    return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(grad)


@pytest.mark.parametrize("g,block,axis,two_d", [
    (G.TENSORWISE, None, None, False), (G.ROWWISE, None, -1, False), (G.ROWWISE, None, 0, False),
    (G.BLOCKWISE, 128, -1, False), (G.BLOCKWISE, 128, 0, False), (G.BLOCKWISE, 128, None, True),
    (G.MX_BLOCKWISE, 32, -1, False), (G.MX_BLOCKWISE, 32, 0, False),
])
@pytest.mark.parametrize("shape", [(96, 160), (3, 64, 96)])
def test_quantize_matches_quantize_fp8_and_round_trips(g, block, axis, two_d, shape):
    x = randn(*shape)
    recipe = ScalingRecipe(use_2d_block=two_d)
    qt = QuantizedTensor.quantize(x, E4M3, g, axis=axis, block_size=block, scaling_recipe=recipe)
    # A QuantizedTensor holds the GEMMs' unpadded layout.
    q, s = qz.quantize_fp8_unpadded(x, E4M3, g, block_size=block, axis=axis, scaling_recipe=recipe)
    assert qt.shape == x.shape and qt.dtype == x.dtype and qt.real_dtype == E4M3
    assert torch.equal(qt.qdata.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(qt.scale_inv.reshape(-1).view(torch.uint8), s.reshape(-1).view(torch.uint8))
    back = qt.dequantize()
    assert back.shape == x.shape and back.dtype == x.dtype
    assert snr_db(back, x) >= FP8_MIN_SNR


@pytest.mark.parametrize("axis", [-1, 0])
def test_fp4_quantize_round_trips(axis):
    x = randn(128, 96)
    qt = QuantizedTensor.quantize(x, FP4, G.MX_BLOCKWISE, axis=axis, block_size=32)
    q, s = qz.quantize_fp4_unpadded(x, FP4, G.MX_BLOCKWISE, axis=axis, block_size=32)
    assert torch.equal(qt.qdata.view(torch.uint8), q.view(torch.uint8))
    assert snr_db(qt.dequantize(), x) >= FP4_MIN_SNR


def test_views_keep_the_quantized_layout():
    x = randn(4, 32, 64)
    qt = QuantizedTensor.quantize(x, E4M3, G.ROWWISE, axis=-1)
    flat = qt.reshape(-1, 64)
    assert isinstance(flat, QuantizedTensor) and flat.shape == (128, 64)
    torch.testing.assert_close(flat.dequantize(), qt.dequantize().reshape(128, 64), rtol=0, atol=0)
    tw = QuantizedTensor.quantize(x[0], E4M3, G.TENSORWISE)
    torch.testing.assert_close(tw.t().dequantize(), tw.dequantize().t(), rtol=0, atol=0)
    for g, block in ((G.ROWWISE, None), (G.BLOCKWISE, 128), (G.MX_BLOCKWISE, 32)):
        one_d = QuantizedTensor.quantize(x[0], E4M3, g, axis=-1, block_size=block)
        rt = one_d.t()  # data and scales move together: exact, quantized along the new dim 0
        assert rt.quantized_axis == 0
        torch.testing.assert_close(rt.dequantize(), one_d.dequantize().t(), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="<= 2 dimensions"):
        tw3 = QuantizedTensor.quantize(x, E4M3, G.TENSORWISE)
        tw3.t()
    with pytest.raises(NotImplementedError, match="dequantize"):
        qt + 1


def _reference(a, b, trans_a, trans_b):
    a64, b64 = a.double(), b.double()
    return (a64.t() if trans_a else a64) @ (b64.t() if trans_b else b64)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("with_t", [True, False])
def test_gemm_fp8_with_a_quantized_weight_trains(name, with_t):
    """x @ w.T with w from create_quantized_weight: forward, dgrad and wgrad (to the
    QuantizedTensor, straight-through) at the FP8 gate, and within FP8 noise of gemm_fp8 on the
    high-precision weight."""
    config = CONFIGS[name]
    m, k, n = 256, 384, 512
    x, w, grad = randn(m, k, grad=True), randn(n, k), randn(m, n)
    qw, qw_t = create_quantized_weight(w, E4M3, config, need_weight_transpose_cache=with_t)
    qw.requires_grad_(True)
    operand = QuantizedTensorPair(qw, qw_t) if with_t else qw
    out = turbo.ops.gemm_fp8(x, operand, trans_b=True, config=config)
    out.backward(grad)
    ref = _reference(x.detach(), w, False, True)
    assert out.dtype == torch.bfloat16 and snr_db(out, ref) >= FP8_MIN_SNR
    assert snr_db(x.grad, grad.double() @ w.double()) >= FP8_MIN_SNR - 5
    assert qw.grad is not None and qw.grad.shape == w.shape
    assert snr_db(qw.grad, grad.double().t() @ x.detach().double()) >= FP8_MIN_SNR - 5
    x2, w2 = x.detach().clone().requires_grad_(True), w.clone().requires_grad_(True)
    out2 = turbo.ops.gemm_fp8(x2, w2, trans_b=True, config=config)
    assert snr_db(out, out2.detach()) >= FP8_MIN_SNR


@pytest.mark.parametrize("name", ["tensor", "row", "block"])
@pytest.mark.parametrize("trans_b", [True, False])
def test_gemm_fp8_with_a_quantized_weight_native_path_equals_the_composite(name, trans_b, monkeypatch):
    """A high-precision a with a QuantizedTensorPair weight takes the native forward (a quantized
    alone) and gemm_fp8_bwd; forward, dgrad and wgrad equal the composite path's bit for bit."""
    mod = sys.modules["primus_turbo.pytorch.ops.gemm_fp8"]  # the package attribute of that name is the function

    config = CONFIGS[name]
    m, k, n = 256, 384, 512
    x, w, grad = randn(m, k), randn(n, k), randn(m, n)
    results = []
    for native_path in (True, False):
        if not native_path:
            monkeypatch.setattr(mod, "native_weight_copies", lambda *a, **kw: None)
        if trans_b:  # b [N, K], the layers' layout
            qw, qw_t = create_quantized_weight(w, E4M3, config, need_weight_transpose_cache=True)
        else:  # b [K, N]: its copy along K is along dim 0
            block, recipe = (128 if name == "block" else None), ScalingRecipe(use_2d_block=name == "block")
            qw, qw_t = (QuantizedTensor.quantize(w.t().contiguous(), E4M3, config.granularity, axis=axis,
                                                 block_size=block, scaling_recipe=recipe) for axis in (0, 1))
        qw.requires_grad_(True)
        xi = x.clone().requires_grad_(True)
        out = turbo.ops.gemm_fp8(xi, QuantizedTensorPair(qw, qw_t), trans_b=trans_b, config=config)
        out.backward(grad)
        results.append((out.detach(), xi.grad, qw.grad))
    for what, a, b in zip(("out", "dx", "dw"), *results):
        assert torch.equal(a, b), f"{what} differs from the composite path"
    assert snr_db(results[0][0], _reference(x, w, False, True)) >= FP8_MIN_SNR


@pytest.mark.parametrize("name", ["tensor", "row", "block"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False)])
def test_gemm_fp8_with_a_quantized_activation(name, trans_a, trans_b):
    config = CONFIGS[name]
    m, k, n = 128, 256, 192
    a = randn(k, m) if trans_a else randn(m, k)
    b = randn(n, k, grad=True) if trans_b else randn(k, n, grad=True)
    block = 128 if name == "block" else None
    qa = QuantizedTensor.quantize(a, E4M3, config.granularity, axis=0 if trans_a else 1, block_size=block)
    qa.requires_grad_(True)
    out = turbo.ops.gemm_fp8(qa, b, trans_a=trans_a, trans_b=trans_b, config=config)
    grad = randn(m, n)
    out.backward(grad)
    assert snr_db(out, _reference(a, b.detach(), trans_a, trans_b)) >= FP8_MIN_SNR
    op_b = b.detach().double().t() if trans_b else b.detach().double()
    grad_op_a = grad.double() @ op_b.t()
    assert snr_db(qa.grad, grad_op_a.t() if trans_a else grad_op_a) >= FP8_MIN_SNR - 5
    assert b.grad is not None and b.grad.shape == b.shape


def test_gemm_fp8_refuses_an_operand_quantized_along_n():
    w = randn(256, 128)
    qw = QuantizedTensor.quantize(w, E4M3, G.ROWWISE, axis=0)  # along N: the dgrad's copy, not the forward's
    with pytest.raises(ValueError, match="along dim 0"):
        turbo.ops.gemm_fp8(randn(64, 128), qw, trans_b=True, config=CONFIGS["row"])


def test_hybrid_format_and_inference():
    config = Float8QuantConfig(format=Format.HYBRID, granularity=G.ROWWISE)
    x, w = randn(64, 128), randn(96, 128)
    qw, _ = create_quantized_weight(w, E4M3, config)
    with torch.no_grad():
        out = turbo.ops.gemm_fp8(x, qw, trans_b=True, config=config)
    assert snr_db(out, _reference(x, w, False, True)) >= FP8_MIN_SNR


# ---- grouped quantization -----------------------------------------------------------------------


def _groups(lens):
    lens_t = torch.tensor(lens, device="cuda", dtype=torch.int64)
    offs = torch.zeros(len(lens) + 1, device="cuda", dtype=torch.int64)
    offs[1:] = torch.cumsum(lens_t, 0)
    return lens_t, offs


@pytest.mark.parametrize("g,block", [(G.MX_BLOCKWISE, 32), (G.BLOCKWISE, 128)])
@pytest.mark.parametrize("lens", [[5, 0, 40, 1], [128, 64], [0, 0, 3]])
def test_grouped_quantize_fp8_layouts_and_round_trip(g, block, lens):
    n = 96
    group_lens, group_offs = _groups(lens)
    t = sum(lens)
    x = randn(t, n)
    q_r, s_r, q_c, s_c, lens_r, offs_r, lens_c, offs_c = turbo.ops.grouped_quantize_fp8_with_trans(
        x, E4M3, g, group_lens, group_offs, block_size=block
    )
    pad = lambda v, a: -(-v // a) * a
    assert lens_r.tolist() == [pad(v, 32) for v in lens] and lens_c.tolist() == [pad(v, 128) for v in lens]
    assert offs_c[1:].tolist() == torch.cumsum(lens_c, 0).tolist()
    assert q_c.shape[0] == n and q_c.shape[1] % 128 == 0 and q_c.shape[1] >= offs_c[-1].item()
    for q, s, offs, axis in ((q_r, s_r, offs_r, -1), (q_c, s_c, offs_c, 0)):
        back = turbo.ops.grouped_dequantize_fp8(
            q, torch.float32, g, group_offs, offs, block_size=block, axis=axis, scale_inv=s, total_M=t
        )[:, :n]
        assert back.shape == (t, n)
        if t:
            assert snr_db(back, x) >= FP8_MIN_SNR
    # Each group's rows in the padded row copy are the plain quantization of that group's rows.
    q_plain, _ = turbo.ops.quantize_fp8(x, E4M3, g, block_size=block, axis=-1)
    for gi, length in enumerate(lens):
        start, pstart = int(group_offs[gi]), int(offs_r[gi])
        got = q_r[pstart:pstart + length, :n].view(torch.uint8)
        assert torch.equal(got, q_plain[start:start + length, :n].view(torch.uint8))
        assert not q_r[pstart + length:pstart + lens_r[gi].item()].view(torch.uint8).any()


def test_grouped_quantized_tensor_dequantizes():
    group_lens, _ = _groups([17, 0, 50])
    x = randn(67, 64)
    for axis in (-1, 0):
        qt = QuantizedTensor.quantize(x, E4M3, G.MX_BLOCKWISE, axis=axis, block_size=32, group_lens=group_lens)
        assert qt.is_grouped_tensor and qt.shape == x.shape
        assert snr_db(qt.dequantize(), x) >= FP8_MIN_SNR


def test_grouped_quantize_fp4_and_with_trans():
    group_lens, group_offs = _groups([33, 0, 31])
    x = randn(64, 64)
    q, s, lens_p, offs_p = turbo.ops.grouped_quantize_fp4(x, FP4, G.MX_BLOCKWISE, group_lens, group_offs, axis=-1)
    assert torch.equal(lens_p, group_lens)
    back = turbo.ops.grouped_dequantize_fp4(q, torch.float32, G.MX_BLOCKWISE, scale_inv=s)
    assert snr_db(back, x) >= FP4_MIN_SNR
    out = turbo.ops.grouped_quantize_fp4_with_trans(x, FP4, G.MX_BLOCKWISE, group_lens, group_offs)
    assert out[2].shape == (64, 256) and out[6].tolist() == [128, 0, 128]  # [N, padded rows / 2]


def test_quantize_fp4_with_trans_matches_two_quantize_fp4_calls():
    x = randn(64, 96)
    q_r, s_r, q_c, s_c = turbo.ops.quantize_fp4_with_trans(x, FP4, G.MX_BLOCKWISE)
    for (q, s), axis in (((q_r, s_r), -1), ((q_c, s_c), 0)):
        q_ref, s_ref = turbo.ops.quantize_fp4(x, FP4, G.MX_BLOCKWISE, axis=axis)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
        assert torch.equal(s.view(torch.uint8), s_ref.view(torch.uint8))


# ---- grouped GEMM with quantized weights ------------------------------------------------------------


@pytest.mark.parametrize("name", ["tensor", "row", "block", "mx"])
@pytest.mark.parametrize("with_t", [True, False])
def test_grouped_gemm_fp8_with_a_quantized_weight_trains(name, with_t):
    config = CONFIGS[name]
    lens = [64, 0, 200, 56]
    group_lens, _ = _groups(lens)
    m, k, n, groups = sum(lens), 256, 384, len(lens)
    x, w, grad = randn(m, k, grad=True), randn(groups, n, k), randn(m, n)
    qw, qw_t = create_quantized_weight(w, E4M3, config, need_weight_transpose_cache=with_t)
    qw.requires_grad_(True)
    out = turbo.ops.grouped_gemm_fp8(x, QuantizedTensorPair(qw, qw_t) if with_t else qw, group_lens, config=config)
    out.backward(grad)
    ref = torch.cat([x.detach()[s:e].double() @ w[i].double().t() for i, (s, e) in enumerate(
        zip([0, *torch.cumsum(torch.tensor(lens), 0).tolist()[:-1]], torch.cumsum(torch.tensor(lens), 0).tolist()))])
    assert snr_db(out, ref) >= FP8_MIN_SNR
    starts = [0, *torch.cumsum(torch.tensor(lens), 0).tolist()]
    dref = torch.cat([grad[starts[i]:starts[i + 1]].double() @ w[i].double() for i in range(groups)])
    assert snr_db(x.grad, dref) >= FP8_MIN_SNR - 5
    assert qw.grad is not None and qw.grad.shape == w.shape
    wref = torch.stack([grad[starts[i]:starts[i + 1]].double().t() @ x.detach()[starts[i]:starts[i + 1]].double()
                        for i in range(groups)])
    assert snr_db(qw.grad, wref) >= 40.0  # bf16 wgrad


@pytest.mark.parametrize("with_t", [True, False])
def test_gemm_fp4_with_a_quantized_weight_matches_the_high_precision_path(with_t):
    """Plain MXFP4 (no 2-D blocks, Hadamard transform or stochastic rounding): a weight quantized
    once by create_quantized_weight gives the same forward and gradients as gemm_fp4 quantizing it."""
    from primus_turbo.pytorch.core.low_precision import Float4QuantConfig

    config = Float4QuantConfig(scaling_recipe_for_trans=ScalingRecipe())
    m, k, n = 128, 256, 192
    x, w, grad = randn(m, k, grad=True), randn(n, k), randn(m, n)
    qw, qw_t = create_quantized_weight(w, FP4, config, need_weight_transpose_cache=with_t)
    qw.requires_grad_(True)
    out = turbo.ops.gemm_fp4(x, QuantizedTensorPair(qw, qw_t) if with_t else qw, trans_b=True, config=config)
    out.backward(grad)
    x2, w2 = x.detach().clone().requires_grad_(True), w.clone().requires_grad_(True)
    out2 = turbo.ops.gemm_fp4(x2, w2, trans_b=True, config=config)
    out2.backward(grad)
    assert torch.equal(out, out2)
    if with_t:  # the dgrad copy came quantized the same way
        assert torch.equal(x.grad, x2.grad)
    else:  # re-quantized from the dequantized weight: a second rounding
        assert snr_db(x.grad, x2.grad) >= FP4_MIN_SNR
    assert torch.equal(qw.grad, w2.grad)


def test_grouped_gemm_fp8_with_a_quantized_mx_activation():
    config = CONFIGS["mx"]
    lens = [40, 0, 88]
    group_lens, _ = _groups(lens)
    m, k, n = sum(lens), 256, 128
    x, w = randn(m, k), randn(len(lens), n, k)
    qx = QuantizedTensor.quantize(x, E4M3, G.MX_BLOCKWISE, axis=-1, block_size=32)
    out = turbo.ops.grouped_gemm_fp8(qx, w, group_lens, config=config)
    ref = turbo.ops.grouped_gemm_fp8(x, w, group_lens, config=config)
    assert torch.equal(out, ref)  # the same quantization of x, read instead of made


def test_fp4_with_the_hadamard_transform_dequantizes_to_its_own_domain():
    x = randn(64, 128)
    recipe = ScalingRecipe(use_rht=True)
    for axis in (-1, 0):
        qt = QuantizedTensor.quantize(x, FP4, G.MX_BLOCKWISE, axis=axis, block_size=32, scaling_recipe=recipe)
        assert snr_db(qt.dequantize(), x) >= FP4_MIN_SNR


@pytest.mark.parametrize("with_t", [True, False])
def test_grouped_gemm_fp4_with_a_quantized_weight_matches_the_high_precision_path(with_t):
    """Plain MXFP4: the weight quantized once gives grouped_gemm_fp4's forward and wgrad bit for bit
    (and its dgrad too when the pair carries the copy along N)."""
    from primus_turbo.pytorch.core.low_precision import Float4QuantConfig

    config = Float4QuantConfig(scaling_recipe_for_trans=ScalingRecipe())
    lens = [64, 0, 96]
    group_lens, _ = _groups(lens)
    m, k, n = sum(lens), 128, 64
    x, w, grad = randn(m, k, grad=True), randn(len(lens), n, k), randn(m, n)
    qw, qw_t = create_quantized_weight(w, FP4, config, need_weight_transpose_cache=with_t)
    qw.requires_grad_(True)
    out = turbo.ops.grouped_gemm_fp4(x, QuantizedTensorPair(qw, qw_t) if with_t else qw, group_lens, config=config)
    out.backward(grad)
    x2, w2 = x.detach().clone().requires_grad_(True), w.clone().requires_grad_(True)
    out2 = turbo.ops.grouped_gemm_fp4(x2, w2, group_lens, config=config)
    out2.backward(grad)
    assert torch.equal(out, out2) and torch.equal(qw.grad, w2.grad)
    if with_t:
        assert torch.equal(x.grad, x2.grad)
    else:
        assert snr_db(x.grad, x2.grad) >= FP4_MIN_SNR
