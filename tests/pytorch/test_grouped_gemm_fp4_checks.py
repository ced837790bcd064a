"""Host-side behaviour of turbo.ops.grouped_gemm_fp4 that needs no GPU: argument errors raised
before any launch, shapes through meta / fake tensors (forward and backward), a fullgraph trace,
and the per-expert weight layouts (both orientations) on CPU with a torch MXFP4 quantizer standing
in for the CUDA one."""

import sys

import pytest
import torch
from host_check_utils import check_grouped_gemm_step_on_meta, hp_grouped_gemm_bad_arguments, meta
from host_check_utils import meta_lens as lens
from quant_reference import e2m1_codes, e2m1_values, expand, group_amax, mx_scales, unpack_fp4

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float4QuantConfig, Float8QuantConfig, ScalingRecipe

MOD = sys.modules["primus_turbo.pytorch.ops.grouped_gemm_fp4"]  # the package attribute is the function


RECIPES = [None, ScalingRecipe(), ScalingRecipe(use_2d_block=True), ScalingRecipe(use_sr=True)]


@pytest.mark.parametrize("recipe", RECIPES, ids=["paper", "plain", "2d", "sr"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_shapes_forward_and_backward_on_meta(recipe, trans_b):
    c = Float4QuantConfig(scaling_recipe_for_trans=recipe)
    # K=288 and N=160: partial 128-blocks along K and N
    check_grouped_gemm_step_on_meta(turbo.ops.grouped_gemm_fp4, trans_b, k=288, n=160, config=c)


def test_out_dtype_default_config_and_group_offs():
    out = turbo.ops.grouped_gemm_fp4(meta(32, 64), meta(2, 64, 64), lens(2), out_dtype=torch.float32)
    assert out.shape == (32, 64) and out.dtype == torch.float32
    f16 = turbo.ops.grouped_gemm_fp4(meta(32, 64, dtype=torch.float16), meta(2, 32, 64, dtype=torch.float16), lens(2))
    assert f16.shape == (32, 32) and f16.dtype == torch.float16
    out = turbo.ops.grouped_gemm_fp4(meta(32, 64), meta(2, 32, 64), lens(2), lens(3))
    assert out.shape == (32, 32)
    out = turbo.ops.grouped_gemm_fp4(meta(32, 64), meta(2, 32, 64), lens(2), num_cu=8)
    assert out.shape == (32, 32)


def test_empty_inputs():
    out = turbo.ops.grouped_gemm_fp4(meta(0, 64), meta(4, 32, 64), lens(4))
    assert out.shape == (0, 32)


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        # (The backward is traced on meta tensors above: the autograd engine needs a real device.)
        a = torch.empty(48, 256, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(4, 96, 256, device="cuda", dtype=torch.bfloat16)
        gl = torch.empty(4, device="cuda", dtype=torch.int64)
        out = turbo.ops.grouped_gemm_fp4(a, b, gl)
        assert out.shape == (48, 96) and out.device.type == "cuda" and out.dtype == torch.bfloat16
        bt = torch.empty(4, 256, 96, device="cuda", dtype=torch.bfloat16)
        out = turbo.ops.grouped_gemm_fp4(a, bt, gl, trans_b=False, out_dtype=torch.float32)
        assert out.shape == (48, 96) and out.dtype == torch.float32


@pytest.mark.parametrize("trans_b", [False, True])
def test_torch_compile_traces_without_graph_break(trans_b):
    torch._dynamo.reset()
    w = meta(*((4, 32, 64) if trans_b else (4, 64, 32)), grad=True)

    def fn(x, gl):
        return torch.relu(turbo.ops.grouped_gemm_fp4(x, w, gl, trans_b=trans_b)) + 1

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    x = meta(48, 64, grad=True)
    out = compiled(x, lens(4))
    assert out.shape == (48, 32)
    out.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_uses_the_grouped_fp8_kernel_op():
    # The emulation runs on grouped_gemm_fp8's registered kernel op, not a copy of it.
    from primus_turbo.pytorch.ops import grouped_gemm_fp8

    assert MOD.grouped_fp8_mm is sys.modules[grouped_gemm_fp8.__module__].grouped_fp8_mm


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        *hp_grouped_gemm_bad_arguments(n=32, k=32),
        ((meta(4, 32), meta(2, 64, 32), lens(2)), {"trans_b": False}, ValueError, r"has K = 64 \(trans_b=False\)"),
        ((meta(4, 48), meta(2, 32, 48), lens(2)), {}, ValueError, "K=48 and N=32 must be multiples of 32"),
        ((meta(4, 32), meta(2, 48, 32), lens(2)), {}, ValueError, "N=48"),
        ((meta(4, 32), meta(2, 32, 48), lens(2)), {"trans_b": False}, ValueError, "N=48"),
        ((meta(4, 32, 1), meta(2, 32, 32), lens(2)), {}, ValueError, "argument 'a' must be 2-D"),
        ((meta(4, 32), meta(2, 32, 32), [2, 2]), {}, TypeError, "'group_lens' must be a torch.Tensor"),
        (
            (meta(4, 32), meta(2, 32, 32), lens(2), lens(3, torch.int32)),
            {},
            TypeError,
            "'group_offs' has dtype torch.int32",
        ),
        ((meta(4, 32), meta(2, 32, 32), lens(2)), {"num_cu": True}, ValueError, "num_cu"),
        ((meta(4, 32), meta(2, 32, 32), lens(2)), {"config": Float8QuantConfig()}, TypeError, "Float4QuantConfig"),
        ((meta(4, 32), meta(2, 32, 32), lens(2)), {"config": "fp4"}, TypeError, "grouped_gemm_fp4: config must be"),
        ((meta(4, 32), None, lens(2)), {}, TypeError, "argument 'b' must be a torch.Tensor"),
    ],
)
def test_bad_arguments_raise_clear_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.grouped_gemm_fp4(*args, **kwargs)


def test_group_lens_on_another_device_is_rejected():
    a = meta(4, 32)
    with pytest.raises(ValueError, match="group_lens"):
        turbo.ops.grouped_gemm_fp4(a, meta(2, 32, 32), torch.tensor([2, 2]))


# ---- the per-expert weight operand, on CPU ------------------------------------------------------


def _ref_quantize_fp4(x, axis, two_d=False, rht=False, sr=False):
    """Round-to-nearest MXFP4 in torch with quantize_fp4's layouts (axis 0: stored transposed;
    32x32 scales [ceil(rows/32), ceil(K/32)] of the stored operand)."""
    assert not rht and not sr
    xt = (x if axis == -1 else x.t()).double()
    r, k = xt.shape
    gm = 32 if two_d else 1
    mult, _, e = mx_scales(group_amax(xt, gm, 32), 6.0)
    codes = e2m1_codes(xt * expand(mult, gm, 32, r, k))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    return packed, e


def _dequant(q8, s8):
    return q8.double() * s8.double().repeat_interleave(128, -1)[..., : q8.shape[-1]]


def _ref_weight(w, two_d):
    """Per expert: w[g] [X, Y] quantized along Y (blocks of 32, or 32x32), dequantized."""
    out = []
    for wg in w:
        q, e = _ref_quantize_fp4(wg, -1, two_d)
        r, k = wg.shape
        gm = 32 if two_d else 1
        scale = torch.pow(2.0, e.double() - 127)
        out.append(e2m1_values(unpack_fp4(q)).double() * expand(scale, gm, 32, r, k))
    return torch.stack(out)


@pytest.mark.parametrize("two_d", [False, True], ids=["1d", "2d"])
@pytest.mark.parametrize("shape", [(3, 64, 160), (2, 96, 32), (1, 32, 288)], ids=lambda s: "x".join(map(str, s)))
def test_weight_operand_layouts_per_expert(monkeypatch, shape, two_d):
    monkeypatch.setattr(MOD, "_q", _ref_quantize_fp4)
    torch.manual_seed(0)
    g, x, y = shape
    w = torch.randn(g, x, y, dtype=torch.float32)
    w[0, :, : y // 2] *= 300.0  # different scales per block, and per expert
    if g > 1:
        w[1] *= 1e-3
    q8, s8 = MOD.weight_operand(w, along_last=True, two_d=two_d)
    assert q8.shape == (g, x, y) and q8.dtype == torch.float8_e4m3fn and s8.shape == (g, x, -(-y // 128))
    qt, st = MOD.weight_operand(w, along_last=False, two_d=two_d)
    assert qt.shape == (g, y, x) and st.shape == (g, y, -(-x // 128))
    # Each orientation is that expert's own MXFP4 quantization along the requested dim.
    assert torch.equal(_dequant(q8, s8), _ref_weight(w, two_d))
    assert torch.equal(_dequant(qt, st), _ref_weight(w.transpose(1, 2), two_d))
    if two_d:  # 32x32 blocks: the dgrad copy holds the forward copy's values, transposed
        assert torch.equal(_dequant(qt, st), _dequant(q8, s8).transpose(1, 2))


def test_activation_operand_is_rowwise(monkeypatch):
    monkeypatch.setattr(MOD, "_q", _ref_quantize_fp4)
    torch.manual_seed(1)
    x = torch.randn(37, 160)
    x[:5] *= 1e4
    q8, s8 = MOD.activation_operand(x)
    assert q8.shape == (37, 160) and s8.shape == (37, 2)
    assert torch.equal(_dequant(q8, s8), _ref_weight(x[None], False)[0])


# ---- the autograd plumbing end to end, on CPU with torch stand-ins for the CUDA pieces ----------


def _starts(group_lens, group_offs):
    if group_offs is not None:
        return group_offs.tolist()
    return [0] + torch.cumsum(group_lens, 0).tolist()


def _fp8_mm_stand_in(qa, sa, qb, sb, group_lens, group_offs, b_scale_rows, out_dtype, num_sms=0):
    assert b_scale_rows == 1 and qa.dtype == qb.dtype == torch.float8_e4m3fn and num_sms == 0
    a, b, offs = _dequant(qa, sa), _dequant(qb, sb), _starts(group_lens, group_offs)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for g in range(b.shape[0]):
        out[offs[g] : offs[g + 1]] = a[offs[g] : offs[g + 1]] @ b[g].t()
    return out.to(out_dtype)


def _wgrad_stand_in(a, grad, group_lens, group_offs, trans_b, num_sms):
    offs = _starts(group_lens, group_offs)
    dw = torch.stack([a[offs[g] : offs[g + 1]].double().t() @ grad[offs[g] : offs[g + 1]].double()
                      for g in range(group_lens.shape[0])])  # [G, K, N]
    return (dw.transpose(1, 2) if trans_b else dw).to(a.dtype)


def _snr(got, ref):
    ref = ref.double()
    return 10 * torch.log10(ref.square().sum() / (got.double() - ref).square().sum()).item()


@pytest.mark.parametrize("trans_b", [True, False])
@pytest.mark.parametrize("two_d", [True, False], ids=["2d", "1d"])
def test_forward_and_backward_on_cpu_with_stand_ins(monkeypatch, trans_b, two_d):
    monkeypatch.setattr(MOD, "_q", _ref_quantize_fp4)
    monkeypatch.setattr(MOD, "grouped_fp8_mm", _fp8_mm_stand_in)
    monkeypatch.setattr(MOD, "_grouped_gemm_wgrad_op", _wgrad_stand_in)
    # The device check lives in the shared operand checks (grouped_gemm_fp8.check_hp_operands).
    monkeypatch.setattr(sys.modules["primus_turbo.pytorch.ops.grouped_gemm_fp8"], "check_cuda_tensors",
                        lambda *args, **kwargs: None)
    torch.manual_seed(2)
    group_lens = torch.tensor([37, 0, 64, 5])
    g, m, k, n = 4, int(group_lens.sum()), 160, 96
    a = torch.randn(m, k, dtype=torch.bfloat16, requires_grad=True)
    w_nk = torch.randn(g, n, k, dtype=torch.bfloat16) / k**0.5
    b = (w_nk if trans_b else w_nk.transpose(1, 2).contiguous()).requires_grad_(True)
    c = Float4QuantConfig(scaling_recipe_for_trans=ScalingRecipe(use_2d_block=two_d))
    out = turbo.ops.grouped_gemm_fp4(a, b, group_lens, trans_b=trans_b, config=c)
    grad = torch.randn(m, n, dtype=torch.bfloat16)
    out.backward(grad)
    offs = _starts(group_lens, None)
    ref_out = torch.zeros(m, n, dtype=torch.float64)
    ref_da = torch.zeros(m, k, dtype=torch.float64)
    ref_db = torch.zeros(g, k, n, dtype=torch.float64)
    for e in range(g):
        s, t = offs[e], offs[e + 1]
        ref_out[s:t] = a[s:t].double() @ w_nk[e].double().t()
        ref_da[s:t] = grad[s:t].double() @ w_nk[e].double()
        ref_db[e] = a[s:t].double().t() @ grad[s:t].double()
    if trans_b:
        ref_db = ref_db.transpose(1, 2)
    assert out.shape == (m, n) and a.grad.shape == a.shape and b.grad.shape == b.shape
    assert _snr(out, ref_out) >= 8.0 and _snr(a.grad, ref_da) >= 8.0 and _snr(b.grad, ref_db) >= 40.0
    assert torch.count_nonzero(b.grad[1]) == 0  # the expert without tokens
