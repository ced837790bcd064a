"""Host-side behaviour of the FP8-output fusions (turbo.ops.rmsnorm_fp8, rmsnorm_residual_fp8,
swiglu_fp8, geglu_fp8) that needs no GPU: argument errors before any launch (Python and core),
output shapes through meta/fake tensors, torch.compile tracing, and the compile check of the
kernel modules."""

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo._core import check, lib
from primus_turbo._core.lib import TurboNotSupportedError
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScaleDtype, ScalingGranularity

from host_check_utils import FAKE_PTR, desc, meta

ROW = Float8QuantConfig(granularity=ScalingGranularity.ROWWISE)
MX = Float8QuantConfig(granularity=ScalingGranularity.MX_BLOCKWISE, block_size=32, scale_dtype=ScaleDtype.E8M0)
BLOCK = Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=128)
BLOCK_E5M2 = Float8QuantConfig(format=Format.E5M2, granularity=ScalingGranularity.BLOCKWISE, block_size=128)


# ---- shapes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("config,scales", [(None, 1), (ROW, 1), (BLOCK, 3), (BLOCK_E5M2, 3)])
@pytest.mark.parametrize("shape", [(5, 264), (2, 3, 264), (264,), (0, 264)])
def test_rmsnorm_fp8_shapes(shape, config, scales):
    x, gamma = meta(*shape), meta(shape[-1])
    q, s = turbo.ops.rmsnorm_fp8(x, gamma, config=config)
    want = torch.float8_e5m2 if config is BLOCK_E5M2 else torch.float8_e4m3fn
    assert q.shape == x.shape and q.dtype == want
    assert s.shape == shape[:-1] + (scales,) and s.dtype == torch.float32  # x's leading dims, as quantize_fp8
    q, s, y = turbo.ops.rmsnorm_fp8(x, gamma, config=config, return_hp=True)
    assert y.shape == x.shape and y.dtype == x.dtype


def test_rmsnorm_fp8_backward_through_y_on_meta():
    x, gamma = meta(4, 256, grad=True), meta(256, dtype=torch.float32, grad=True)
    q, s, y = turbo.ops.rmsnorm_fp8(x, gamma, config=BLOCK, return_hp=True)
    assert not q.requires_grad and not s.requires_grad and y.requires_grad
    y.sum().backward()
    assert x.grad.shape == x.shape and gamma.grad.dtype == torch.float32


def test_rmsnorm_residual_fp8_shapes_and_backward():
    x, r, gamma = meta(3, 7, 128, grad=True), meta(3, 7, 128, grad=True), meta(128, grad=True)
    q, sc, s = turbo.ops.rmsnorm_residual_fp8(x, r, gamma, config=ROW)
    assert q.shape == x.shape and sc.shape == (3, 7, 1) and s.shape == x.shape
    q, sc, y, s = turbo.ops.rmsnorm_residual_fp8(x, r, gamma, config=BLOCK, return_hp=True)
    assert sc.shape == (3, 7, 1) and y.shape == x.shape
    (y.sum() + s.sum()).backward()
    assert x.grad.shape == x.shape and r.grad.shape == r.shape and gamma.grad.shape == gamma.shape


@pytest.mark.parametrize("name", ["swiglu_fp8", "geglu_fp8"])
@pytest.mark.parametrize("config,scales", [(ROW, 1), (BLOCK, 2)])
@pytest.mark.parametrize("shape", [(6, 400), (2, 3, 400), (400,), (0, 400)])
def test_gated_fp8_shapes(name, shape, config, scales):
    fn = getattr(turbo.ops, name)
    x = meta(*shape, grad=True)
    q, s = fn(x, config=config)
    assert q.shape == shape[:-1] + (200,) and q.dtype == torch.float8_e4m3fn
    assert s.shape == shape[:-1] + (scales,)
    q, s, out = fn(x, config=config, return_hp=True)
    assert out.shape == q.shape and out.dtype == x.dtype
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_gated_fp8_with_probs_shapes_and_backward():
    x = meta(2, 5, 512, grad=True)
    probs = meta(2, 5, dtype=torch.float32, grad=True)
    mask = meta(10, dtype=torch.int64)
    q, s, out = turbo.ops.swiglu_fp8(x, config=BLOCK, return_hp=True, probs=probs, row_mask=mask)
    assert q.shape == (2, 5, 256) and s.shape == (2, 5, 2)
    out.sum().backward()
    assert x.grad.shape == x.shape and probs.grad.shape == probs.shape


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"probs": meta(4, dtype=torch.bfloat16)}, TypeError, "argument 'probs' has dtype"),
        ({"probs": meta(5, dtype=torch.float32)}, ValueError, "argument 'probs' has shape"),
        ({"row_mask": meta(4, dtype=torch.int64)}, ValueError, "'row_mask' needs 'probs'"),
        ({"probs": meta(4, dtype=torch.float32), "row_mask": meta(4, dtype=torch.float32)}, TypeError, "row_mask"),
        ({"probs": meta(4, dtype=torch.float32), "row_mask": meta(3, dtype=torch.int64)}, ValueError, "row_mask"),
    ],
)
def test_gated_fp8_bad_probs(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.swiglu_fp8(meta(4, 512), **kwargs)


def test_fake_ops_shapes():
    q, s, y, s_out, rstd = torch.ops.primus_turbo.rmsnorm_fp8_fwd(
        meta(6, 640), None, meta(640), 1e-6, False, 2, torch.float8_e5m2, False
    )
    assert q.shape == (6, 640) and q.dtype == torch.float8_e5m2 and s.shape == (6, 5)
    assert y.numel() == 0 and s_out.numel() == 0 and rstd.shape == (6,)
    q, s, out = torch.ops.primus_turbo.gated_act_fp8_fwd(meta(6, 512), None, None, 0, 1, torch.float8_e4m3fn, True)
    assert q.shape == (6, 256) and s.shape == (6, 1) and out.shape == (6, 256)


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 5, 1024, device="cuda", dtype=torch.bfloat16)
        q, s = turbo.ops.rmsnorm_fp8(x, torch.empty(1024, device="cuda", dtype=torch.bfloat16), config=BLOCK)
        q2, s2 = turbo.ops.swiglu_fp8(x, config=ROW)
    assert q.shape == (3, 5, 1024) and s.shape == (3, 5, 8) and q.device.type == "cuda"
    assert q2.shape == (3, 5, 512) and s2.shape == (3, 5, 1)


def test_torch_compile_traces_without_graph_break():
    def fn(x, g):
        q, s, y = turbo.ops.rmsnorm_fp8(x, g, config=BLOCK, return_hp=True)
        q2, s2, h = turbo.ops.swiglu_fp8(y, config=ROW, return_hp=True)
        return q.float().sum() + s.sum() + q2.float().sum() + s2.sum(), h * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    x, g = meta(8, 4, 256, grad=True), meta(256, grad=True)
    total, h = compiled(x, g)
    assert h.shape == (8, 4, 128)
    h.sum().backward()
    assert x.grad.shape == x.shape and g.grad.shape == g.shape


def test_registered_as_custom_ops():
    assert "primus_turbo::rmsnorm_fp8_fwd(Tensor x, Tensor? residual, Tensor gamma" in str(
        torch.ops.primus_turbo.rmsnorm_fp8_fwd.default._schema
    )
    schema = str(torch.ops.primus_turbo.gated_act_fp8_fwd.default._schema)
    assert "primus_turbo::gated_act_fp8_fwd(Tensor x, Tensor? probs, Tensor? row_mask, int act" in schema


# ---- argument errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x,kwargs,exc,match",
    [
        (meta(4, 256), {"config": Float8QuantConfig()}, ValueError, "granularity TENSORWISE is not supported"),
        (
            meta(4, 256),
            {"config": MX},
            ValueError,
            "granularity MX_BLOCKWISE is not supported",
        ),
        (
            meta(4, 256),
            {"config": Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=64)},
            ValueError,
            "BLOCKWISE supports block_size=128",
        ),
        (meta(4, 256), {"config": "rowwise"}, TypeError, "argument 'config' must be a Float8QuantConfig"),
        (meta(4, 4097), {}, ValueError, "hidden .* is 4097; it must be a multiple of 8"),
        (meta(4, 4098, dtype=torch.float32), {}, ValueError, "is 4098; it must be a multiple of 4"),
        (meta(4, 256), {"eps": -1.0}, ValueError, "argument 'eps'"),
        (meta(4, 256, dtype=torch.int32), {}, TypeError, "argument 'x' has dtype torch.int32"),
        (torch.randn(4, 256), {}, ValueError, "argument 'x' is on cpu"),
    ],
)
def test_rmsnorm_fp8_bad_arguments(x, kwargs, exc, match):
    gamma = torch.empty(x.shape[-1], dtype=x.dtype if x.dtype.is_floating_point else torch.bfloat16, device=x.device)
    with pytest.raises(exc, match=match):
        turbo.ops.rmsnorm_fp8(x, gamma, **kwargs)


def test_rmsnorm_residual_fp8_bad_residual():
    with pytest.raises(ValueError, match="argument 'residual' has shape"):
        turbo.ops.rmsnorm_residual_fp8(meta(4, 256), meta(4, 128), meta(256))


@pytest.mark.parametrize(
    "x,kwargs,exc,match",
    [
        (meta(4, 256), {"config": Float8QuantConfig()}, ValueError, "granularity TENSORWISE is not supported"),
        (meta(4, 250), {}, ValueError, "H .* is 125; it must be a multiple of 8"),
        (meta(4, 7), {}, ValueError, "expected \\[..., 2H\\]"),
        (meta(4, 12, dtype=torch.float32), {}, ValueError, "is 6; it must be a multiple of 4"),
        (torch.randn(4, 256), {}, ValueError, "argument 'x' is on cpu"),
    ],
)
def test_swiglu_fp8_bad_arguments(x, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.swiglu_fp8(x, **kwargs)


# ---- the core's own checks ------------------------------------------------------------------------


E4M3, E5M2, F32, BF16 = 3, 4, 0, 2


def norm_fwd(x, q, s, granularity=1, y=None, hidden=None):
    hidden = hidden or x.shape[x.ndim - 1]
    rstd = desc([x.shape[0]], F32)
    return lib.pt_rmsnorm_fp8_fwd(x, None, desc([hidden]), y, None, q, s, rstd, granularity, 1e-6, 0, None)


def _norm_args(q_dtype=E4M3, q_shape=(4, 256), s_shape=(4, 1), s_dtype=F32, q_ptr=FAKE_PTR):
    return desc([4, 256]), desc(list(q_shape), q_dtype, ptr=q_ptr), desc(list(s_shape), s_dtype)


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        (_norm_args(), {"granularity": 0}, "argument 'granularity' is 0"),
        (_norm_args(), {"granularity": 3}, "argument 'granularity' is 3"),
        (_norm_args(q_dtype=BF16), {}, "argument 'q' has dtype bfloat16"),
        (_norm_args(q_shape=(4, 128)), {}, "argument 'q' has shape"),
        (_norm_args(s_shape=(4, 2)), {}, "argument 'scale_inv' .*one per row"),
        (_norm_args(), {"granularity": 2}, "one per 128 elements"),
        (_norm_args(s_dtype=BF16), {}, "argument 'scale_inv' has dtype"),
        (_norm_args(q_ptr=FAKE_PTR + 8), {}, "'q' must be 16-byte aligned"),
    ],
)
def test_core_rmsnorm_fp8_rejects_bad_descriptors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        check(norm_fwd(*args, **kwargs))


def test_core_rmsnorm_fp8_needs_16_byte_accesses():
    with pytest.raises(TurboNotSupportedError, match="needs 16-byte accesses"):
        check(norm_fwd(desc([4, 260]), desc([4, 260], E4M3), desc([4, 1], F32)))
    with pytest.raises(TurboNotSupportedError, match="needs 16-byte accesses"):
        check(norm_fwd(desc([4, 256], ptr=FAKE_PTR + 2), desc([4, 256], E4M3), desc([4, 1], F32)))


def test_core_rmsnorm_fp8_with_no_rows_is_a_no_op():
    check(norm_fwd(desc([0, 256], ptr=None), desc([0, 256], E4M3, ptr=None), desc([0, 2], F32, ptr=None), 2))


def test_core_gated_fp8_rejects_bad_descriptors():
    def fwd(x, q, s, granularity=1):
        return lib.pt_gated_act_fp8_fwd(0, x, None, None, None, q, s, granularity, None)

    with pytest.raises(ValueError, match="argument 'granularity' is 0"):
        check(fwd(desc([4, 512]), desc([4, 256], E4M3), desc([4, 1], F32), 0))
    with pytest.raises(ValueError, match="argument 'q' has shape"):
        check(fwd(desc([4, 512]), desc([4, 512], E4M3), desc([4, 1], F32)))
    with pytest.raises(ValueError, match="one per 128 elements"):
        check(fwd(desc([4, 512]), desc([4, 256], E4M3), desc([4, 1], F32), 2))
    with pytest.raises(TurboNotSupportedError, match="needs 16-byte accesses"):
        check(fwd(desc([4, 500]), desc([4, 250], E4M3), desc([4, 1], F32)))
    check(fwd(desc([0, 512], ptr=None), desc([0, 256], E4M3, ptr=None), desc([0, 2], F32, ptr=None), 2))


def test_prepare_rejects_bad_arguments():
    with pytest.raises(ValueError, match="argument 'granularity'"):
        check(lib.pt_rmsnorm_fp8_prepare(0, BF16, BF16, 4096, 0, E4M3))
    with pytest.raises(ValueError, match="argument 'fp8_dtype'"):
        check(lib.pt_rmsnorm_fp8_prepare(0, BF16, BF16, 4096, 1, BF16))
    with pytest.raises(TurboNotSupportedError, match="multiple of 8"):
        check(lib.pt_rmsnorm_fp8_prepare(0, BF16, BF16, 4097, 1, E4M3))
    with pytest.raises(TurboNotSupportedError, match="multiple of 4"):
        check(lib.pt_gated_act_fp8_prepare(0, F32, 6, 2, E4M3))


# ---- gemm_fp8 with a pre-quantized activation and its high-precision tensor -----------------------


@pytest.mark.parametrize("config", [ROW, BLOCK], ids=["rowwise", "blockwise"])
def test_gemm_fp8_takes_the_fused_output_with_autograd_on_meta(config):
    x, gamma = meta(64, 256, grad=True), meta(256, grad=True)
    w = meta(32, 256, grad=True)
    out = turbo.ops.gemm_fp8(turbo.ops.rmsnorm_fp8(x, gamma, config=config, return_hp=True), w, trans_b=True,
                             config=config)
    assert out.shape == (64, 32) and out.dtype == torch.bfloat16
    out.sum().backward()
    assert x.grad.shape == x.shape and gamma.grad.shape == gamma.shape and w.grad.shape == w.shape


def test_gemm_fp8_fused_output_compiles_fullgraph():
    def fn(x, w):
        return turbo.ops.gemm_fp8(turbo.ops.swiglu_fp8(x, config=BLOCK, return_hp=True), w, trans_b=True, config=BLOCK)

    x, w = meta(64, 512, grad=True), meta(32, 256, grad=True)
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(x, w)
    assert out.shape == (64, 32)
    out.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.parametrize(
    "a,b,kwargs,exc,match",
    [
        ((meta(64, 256, dtype=torch.float8_e4m3fn), meta(64, 1, dtype=torch.float32), meta(64, 128)), meta(32, 256),
         {"config": ROW}, TypeError, "a_hp a float16/bfloat16/float32 tensor of q's shape"),
        ((meta(64, 256, dtype=torch.float8_e4m3fn), meta(64, 1, dtype=torch.float32), meta(64, 256)), meta(32, 256),
         {"config": Float8QuantConfig(format=Format.E5M2, granularity=ScalingGranularity.ROWWISE)}, TypeError,
         "config.format E5M2 needs"),
        ((meta(64, 256, dtype=torch.float8_e4m3fn), meta(64, 2, dtype=torch.float32), meta(64, 256)), meta(32, 256),
         {"config": ROW}, ValueError, "scale_inv has shape"),
        ((meta(64, 256, dtype=torch.float8_e4m3fn), meta(64, 1, dtype=torch.float32), meta(64, 256)), meta(32, 128),
         {"config": ROW}, ValueError, "inner dimensions do not match"),
        ((meta(64, 256, dtype=torch.float8_e4m3fn), meta(64, 1, dtype=torch.float32), meta(64, 256)),
         meta(32, 256, dtype=torch.float16), {"config": ROW}, TypeError, "'b' must be a 2-D tensor of a_hp's dtype"),
    ],
)
def test_gemm_fp8_prequantized_a_hp_errors(a, b, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.gemm_fp8(a, b, trans_b=True, **kwargs)
