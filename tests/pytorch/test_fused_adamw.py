"""turbo.optim.FusedAdamW (the fused AdamW kernel, kernels/optim/adamw.cuh): each step against a
float64 evaluation of torch.optim.AdamW's update from the same stored values (within one rounding
of the stored dtype), several steps against torch.optim.AdamW itself, parameters of odd sizes,
more tensors than one launch takes, misaligned views (the scalar path), float32 moments beside
16-bit parameters, the max |param| it reports and the TENSORWISE FP8 weight copy made from it
(bitwise the quantizer's own), state dicts shared with torch.optim.AdamW, and argument errors."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity
from primus_turbo.pytorch.core.quantized_tensor import create_quantized_weight
from primus_turbo.pytorch.optim.fused_adamw import adamw_reference

HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
# One rounding of the stored dtype, relative (float32 math may land on the other side of a tie).
RTOL = {torch.float32: 2e-6, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
SIZES = [(1,), (7,), (2048,), (2049,), (37, 129), (3, 5, 1000), (0,), (4096, 33)]


def _expected64(p, g, m, v, step, lr, betas, eps, weight_decay):
    """AdamW's update in float64 from the stored values: (param, exp_avg, exp_avg_sq)."""
    p64, g64, m64, v64 = (t.double() for t in (p, g, m, v))
    adamw_reference(p64, g64, m64, v64, step, lr, betas[0], betas[1], eps, weight_decay)
    return p64, m64, v64


def _close(name, got, want, dtype):
    """got within one rounding of the stored dtype of the float64 value (relative to it, with a
    floor 2^-14 of the tensor's largest value: a moment that cancels to near zero carries float32's
    rounding of its terms, not of itself)."""
    err = (got.double() - want).abs()
    floor = 2.0**-14 * want.abs().max().item() if want.numel() else 0.0
    bound = RTOL[dtype] * want.abs() + floor + 1e-30
    assert bool((err <= bound).all()), f"{name}: max error {err.max().item() if err.numel() else 0}"


@pytest.mark.gpu
@pytest.mark.parametrize("state_fp32", [False, True], ids=["state_like_param", "state_fp32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_each_step_matches_float64_update(dtype, state_fp32):
    torch.manual_seed(0)
    params = [torch.randn(s, device="cuda", dtype=dtype, requires_grad=True) for s in SIZES]
    opt = turbo.optim.FusedAdamW(params, **HYPER)
    for step in range(1, 4):
        for p in params:
            p.grad = torch.randn_like(p) * (0.1 if step == 2 else 1.0)
        if step == 1 and state_fp32:  # moments kept in float32 beside 16-bit params
            for p in params:
                opt.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p, dtype=torch.float32),
                                    exp_avg_sq=torch.zeros_like(p, dtype=torch.float32))
        zeros = [torch.zeros_like(p) for p in params]  # the moments before the first step
        before = [(p.detach().clone(), p.grad.clone(), opt.state[p]["exp_avg"].clone() if opt.state[p] else z,
                   opt.state[p]["exp_avg_sq"].clone() if opt.state[p] else z) for p, z in zip(params, zeros)]
        opt.step()
        for p, prev in zip(params, before):
            want = _expected64(*prev, step, **HYPER)
            st = opt.state[p]
            mdt = torch.float32 if state_fp32 else dtype
            _close("param", p.detach(), want[0], dtype)
            _close("exp_avg", st["exp_avg"], want[1], mdt)
            _close("exp_avg_sq", st["exp_avg_sq"], want[2], mdt)
            assert int(st["step"].item()) == step


def _steps_beside_torch(ours, steps: int):
    """(FusedAdamW, torch.optim.AdamW, torch's params): both stepped ``steps`` times on copies of
    ``ours`` with the same random gradients."""
    ref = [p.detach().clone().requires_grad_() for p in ours]
    o1, o2 = turbo.optim.FusedAdamW(ours, **HYPER), torch.optim.AdamW(ref, **HYPER)
    for _ in range(steps):
        for a, b in zip(ours, ref):
            g = torch.randn_like(a)
            a.grad, b.grad = g.clone(), g.clone()
        o1.step()
        o2.step()
    return o1, o2, ref


@pytest.mark.gpu
def test_float32_matches_torch_adamw_over_steps():
    torch.manual_seed(1)
    ours = [torch.randn(s, device="cuda", requires_grad=True) for s in SIZES]
    o1, o2, ref = _steps_beside_torch(ours, 6)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(o1.state[a]["exp_avg_sq"], o2.state[b]["exp_avg_sq"], rtol=1e-5, atol=1e-9)


@pytest.mark.gpu
def test_many_tensors_and_misaligned_views_and_params_without_grad():
    """70 tensors (three launches of 32), views starting one element into a buffer (no 16-byte
    accesses), a parameter with no gradient (left alone, no state)."""
    torch.manual_seed(2)
    buf = torch.randn(70 * 131 + 1, device="cuda", dtype=torch.bfloat16)
    params = [torch.nn.Parameter(buf[1 + 131 * i: 1 + 131 * (i + 1)]) for i in range(70)]
    idle = torch.nn.Parameter(torch.randn(16, device="cuda", dtype=torch.bfloat16))
    ref = [p.detach().double().clone() for p in params]
    opt = turbo.optim.FusedAdamW(params + [idle], **HYPER)
    idle_before = idle.detach().clone()
    grads = [torch.randn_like(p) for p in params]
    for p, g in zip(params, grads):
        p.grad = g
    opt.step()
    for p, r, g in zip(params, ref, grads):
        want = _expected64(r, g, torch.zeros_like(r), torch.zeros_like(r), 1, **HYPER)[0]
        _close("param", p.detach(), want, torch.bfloat16)
    assert torch.equal(idle, idle_before) and len(opt.state[idle]) == 0


@pytest.mark.gpu
def test_strided_params_take_torch_ops():
    """A parameter that is a strided view (not contiguous) is updated by the same arithmetic in
    torch ops, in place."""
    torch.manual_seed(7)
    base = torch.randn(64, 48, device="cuda")
    p = torch.nn.Parameter(base.t())  # [48, 64], strided
    ref = p.detach().clone().double()
    opt = turbo.optim.FusedAdamW([p], **HYPER)
    p.grad = torch.randn(48, 64, device="cuda")
    opt.step()
    want = _expected64(ref, p.grad.double(), torch.zeros_like(ref), torch.zeros_like(ref), 1, **HYPER)[0]
    _close("param", p.detach(), want, torch.float32)
    assert not p.is_contiguous()


@pytest.mark.gpu
def test_tensorwise_fp8_weight_copy_comes_from_the_step():
    """A TENSORWISE Float8Linear with the weight cache: the step's max |weight| quantizes the new
    weight (no amax pass), bitwise the quantizer's own copy, kept through the step's hook and used
    by the next forward."""
    torch.manual_seed(3)
    cfg = Float8QuantConfig(format=Format.HYBRID, granularity=ScalingGranularity.TENSORWISE)
    layer = turbo.modules.Float8Linear(256, 128, bias=False, config=cfg, device="cuda", dtype=torch.bfloat16,
                                       cache_quantized_weight=True)
    plain = torch.nn.Linear(64, 64, device="cuda", dtype=torch.bfloat16)
    opt = turbo.optim.FusedAdamW(list(layer.parameters()) + list(plain.parameters()), **HYPER)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().square().mean().backward()
    plain(torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)).sum().backward()
    opt.step()
    assert layer._weight_cache is not None, "the step's copy was dropped"
    data, _ = layer._weight_cache[1], layer._weight_cache[2]
    want, _ = create_quantized_weight(layer.weight.detach(), torch.float8_e4m3fn, cfg, True)
    assert torch.equal(data.qdata.view(torch.uint8), want.qdata.view(torch.uint8))
    assert torch.equal(data.scale_inv, want.scale_inv)
    cached = layer._weight_cache
    y = layer(x)
    assert layer._weight_cache is cached  # the forward read the step's copy
    fresh = turbo.modules.Float8Linear(256, 128, bias=False, config=cfg, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        fresh.weight.copy_(layer.weight)
    assert torch.equal(y, fresh(x))
    torch.optim.SGD(plain.parameters(), lr=0.1).step()  # another optimizer's step drops it
    assert layer._weight_cache is None


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("dtype,state_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                                               (torch.float32, torch.float32)], ids=str)
def test_fp8_blocks_step_writes_the_quantizers_copy(dtype, state_dtype, fmt):
    """fused_adamw_fp8_blocks_: the same update as fused_adamw_ (bit for bit), and each param's FP8
    copy in 128 x 128 blocks bit for bit the quantizer's of the updated param: full tiles, partial
    tiles at both edges, columns not a multiple of 8 (the scalar path), a 3-D stack, a misaligned
    view; each matrix's transposed copy where asked for."""
    from primus_turbo.pytorch.core.low_precision import ScalingRecipe
    from primus_turbo.pytorch.ops.quantization import quantize_fp8_unpadded

    torch.manual_seed(5)
    buf = torch.randn(200 * 136 + 1, device="cuda", dtype=dtype)
    params = [torch.randn(s, device="cuda", dtype=dtype) for s in [(384, 256), (200, 136), (130, 100), (3, 128, 64)]]
    params.append(buf[1:].view(200, 136))
    grads = [torch.randn_like(p) for p in params]
    ms = [torch.randn_like(p, dtype=state_dtype) * 0.1 for p in params]
    vs = [torch.rand_like(p, dtype=state_dtype) * 0.01 for p in params]
    ref = [t.clone() for t in params], [t.clone() for t in ms], [t.clone() for t in vs]
    qs = [torch.empty_like(p, dtype=fmt) for p in params]
    scales = [torch.empty(-(-(p.numel() // p.shape[-1]) // 128), -(-p.shape[-1] // 128), device="cuda")
              for p in params]
    # Transposed copies for the 2-D params and the 3-D stack of 128-row matrices; none for the view.
    qts = [torch.empty(*p.shape[:-2], p.shape[-1], p.shape[-2], device="cuda", dtype=fmt) for p in params[:4]]
    qts.append(torch.empty(0, device="cuda", dtype=fmt))
    args = (1e-3, 0.9, 0.95, 1e-8, 0.1, 3)
    torch.ops.primus_turbo.fused_adamw_fp8_blocks_(params, grads, ms, vs, qs, scales, qts, *args)
    torch.ops.primus_turbo.fused_adamw_(ref[0], grads, ref[1], ref[2], None, *args)
    recipe = ScalingRecipe(use_2d_block=True)
    for i, p in enumerate(params):
        for got, want in zip((p, ms[i], vs[i]), (ref[0][i], ref[1][i], ref[2][i])):
            assert torch.equal(got, want), f"param {i}: the update differs from fused_adamw_"
        q, sc = quantize_fp8_unpadded(p, fmt, ScalingGranularity.BLOCKWISE, block_size=128, axis=-1,
                                      scaling_recipe=recipe)
        assert torch.equal(qs[i].view(torch.uint8), q.view(torch.uint8)), f"param {i}: FP8 codes differ"
        assert torch.equal(scales[i], sc.view(scales[i].shape)), f"param {i}: scales differ"
        if qts[i].numel():
            want_t = q.view(torch.uint8).transpose(-1, -2)
            assert torch.equal(qts[i].view(torch.uint8), want_t), f"param {i}: transposed FP8 codes differ"


@pytest.mark.gpu
def test_blockwise_fp8_layers_take_their_copy_from_the_step():
    """A BLOCKWISE Float8Linear and GroupedLinear with the weight cache: after a FusedAdamW step
    the cache holds the step's copy (bitwise create_quantized_weight's of the new weight), the
    step's hook keeps it, and the forward equals an uncached layer's with the same weight."""
    torch.manual_seed(6)
    cfg = Float8QuantConfig(format=Format.HYBRID, granularity=ScalingGranularity.BLOCKWISE, block_size=128)
    lin = turbo.modules.Float8Linear(256, 384, bias=False, config=cfg, device="cuda", dtype=torch.bfloat16,
                                     cache_quantized_weight=True)
    grp = turbo.modules.GroupedLinear(4, 256, 128, device="cuda", dtype=torch.bfloat16, config=cfg,
                                      cache_quantized_weight=True)
    opt = turbo.optim.FusedAdamW(list(lin.parameters()) + list(grp.parameters()), **HYPER)
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    lens = torch.tensor([128, 0, 256, 128], device="cuda")
    (lin(x).float().square().mean() + grp(x, lens).float().square().mean()).backward()
    opt.step()
    for layer in (lin, grp):
        assert layer._weight_cache is not None, "the step's copy was dropped"
        want, _ = create_quantized_weight(layer.weight.detach(), torch.float8_e4m3fn, cfg, True)
        got = layer._weight_cache[1]
        assert torch.equal(got.qdata.view(torch.uint8), want.qdata.view(torch.uint8))
        assert torch.equal(got.scale_inv, want.scale_inv) and got.shape == want.shape
    # The pairs keep the step's transposed copies (before any forward: the dgrad's restatement
    # would transpose the data itself otherwise), which the dgrads below read.
    memo_t = grp._weight_cache[2].memoized(("transposed_qdata",), lambda: None)
    want_t = create_quantized_weight(grp.weight.detach(), torch.float8_e4m3fn, cfg, True)[1]
    assert memo_t is not None and torch.equal(memo_t.view(torch.uint8), want_t.qdata.view(torch.uint8).transpose(1, 2))
    memo_lin = lin._weight_cache[2].memoized(("transposed_qdata",), lambda: None)
    assert memo_lin is not None and torch.equal(memo_lin.view(torch.uint8),
                                                lin._weight_cache[1].qdata.view(torch.uint8).t())
    cached = lin._weight_cache, grp._weight_cache
    y_lin, y_grp = lin(x), grp(x, lens)
    assert (lin._weight_cache, grp._weight_cache) == cached  # the forwards read the step's copies
    plain_lin = turbo.modules.Float8Linear(256, 384, bias=False, config=cfg, device="cuda", dtype=torch.bfloat16)
    plain_grp = turbo.modules.GroupedLinear(4, 256, 128, device="cuda", dtype=torch.bfloat16, config=cfg)
    with torch.no_grad():
        plain_lin.weight.copy_(lin.weight)
        plain_grp.weight.copy_(grp.weight)
    assert torch.equal(y_lin, plain_lin(x)) and torch.equal(y_grp, plain_grp(x, lens))
    for layer, plain, extra in ((grp, plain_grp, (lens,)), (lin, plain_lin, ())):
        dx = torch.autograd.grad(layer(x, *extra).float().sum(), x)[0]
        x2 = x.detach().clone().requires_grad_()
        assert torch.equal(dx, torch.autograd.grad(plain(x2, *extra).float().sum(), x2)[0])


@pytest.mark.gpu
def test_amax_output_and_fake_call():
    p = torch.randn(3000, device="cuda", dtype=torch.bfloat16)
    g, m, v = torch.randn_like(p), torch.zeros_like(p), torch.zeros_like(p)
    amax = torch.full((1,), 123.0, device="cuda")
    torch.ops.primus_turbo.fused_adamw_([p], [g], [m], [v], amax, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1)
    assert amax.item() == p.abs().max().float().item()


# ---- without a GPU -------------------------------------------------------------------------------


def test_cpu_params_match_torch_adamw_and_share_state_dicts():
    torch.manual_seed(4)
    ours = [torch.randn(s, requires_grad=True) for s in [(5, 3), (17,)]]
    o1, o2, ref = _steps_beside_torch(ours, 3)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    o3 = turbo.optim.FusedAdamW(ref, **HYPER)
    o3.load_state_dict(o2.state_dict())  # torch's state dict loads, and ours into torch
    torch.optim.AdamW(ours, **HYPER).load_state_dict(o1.state_dict())
    assert set(o3.state[ref[0]]) == {"step", "exp_avg", "exp_avg_sq"}


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(amsgrad=True), NotImplementedError, "amsgrad"),
    (dict(maximize=True), NotImplementedError, "maximize"),
    (dict(lr=-1.0), ValueError, "learning rate"),
    (dict(betas=(0.9, 1.0)), ValueError, "beta"),
    (dict(weight_decay=-0.1), ValueError, "weight_decay"),
    (dict(lr=torch.tensor(0.1)), TypeError, "lr"),
])
def test_bad_hyperparameters_raise(kwargs, err, match):
    with pytest.raises(err, match=match):
        turbo.optim.FusedAdamW([torch.nn.Parameter(torch.zeros(2))], **kwargs)


def test_bad_gradients_raise():
    p = torch.nn.Parameter(torch.zeros(4))
    opt = turbo.optim.FusedAdamW([p])
    if hasattr(p, "grad_dtype"):  # torch refuses a gradient of another dtype unless told otherwise
        p.grad_dtype = None
        p.grad = torch.zeros(4, dtype=torch.float64)
        with pytest.raises(TypeError, match="gradient has dtype"):
            opt.step()
    p.grad = torch.zeros(4).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


def test_native_op_argument_errors():
    op = torch.ops.primus_turbo.fused_adamw_
    from primus_turbo.pytorch.core.native import translate

    t = torch.zeros(8)
    with pytest.raises(RuntimeError) as e:
        op([t], [t], [t], [t], None, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1)
    assert "'params[0]' is on cpu; expected a CUDA device" in str(translate(e.value))
    with pytest.raises(RuntimeError) as e:
        op([t, t], [t], [t], [t], None, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1)
    assert "argument 'grads' has 1 tensors; expected 2" in str(translate(e.value))
    meta = torch.zeros(8, device="meta")
    assert op([meta], [meta], [meta], [meta], None, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1) is None  # fake: traceable


@pytest.mark.gpu
def test_native_errors_name_the_tensor():
    from primus_turbo.pytorch.core.native import translate

    op = torch.ops.primus_turbo.fused_adamw_
    p = torch.zeros(8, 4, device="cuda")
    bad = [
        (([p.t()], [p.t()], [p.t()], [p.t()]), "'params[0]' must be contiguous"),
        (([p], [p.half()], [p], [p]), "dtype"),
        (([p], [p], [p[:4]], [p]), "shape"),
        (([p.half()], [p.half()], [p.bfloat16()], [p.bfloat16()]), "exp_avgs"),
    ]
    for args, match in bad:
        with pytest.raises(RuntimeError) as e:
            op(*args, None, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1)
        assert match in str(translate(e.value)), str(e.value)
    with pytest.raises(RuntimeError) as e:
        op([p], [p], [p], [p], None, 1e-3, 0.9, 0.999, 1e-8, 0.0, 0)
    assert "'step' must be >= 1" in str(translate(e.value))
