"""Host-side behaviour of turbo.ops.grouped_gemm that needs no GPU: argument errors raised before
any launch (in the binding and in the core), fake-tensor shapes, and an aot_eager fullgraph trace."""

import ctypes

import pytest
import torch

import primus_turbo.pytorch as turbo
from primus_turbo import precompile
from primus_turbo._core import check, lib
from primus_turbo._core.lib import PtGroupedGemmArgs


def meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(shape, device="meta", dtype=dtype, requires_grad=grad)


def lens(g, dtype=torch.int64):
    return torch.empty(g, device="meta", dtype=dtype)


@pytest.mark.parametrize("trans_b", [False, True])
def test_shapes_forward_and_backward_on_meta(trans_b):
    g, m, k, n = 3, 10, 16, 24
    a = meta(m, k, grad=True)
    b = meta(*((g, n, k) if trans_b else (g, k, n)), grad=True)
    out = turbo.ops.grouped_gemm(a, b, lens(g), trans_b=trans_b)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(32, 64, device="cuda", dtype=torch.float16)
        b = torch.empty(4, 128, 64, device="cuda", dtype=torch.float16)
        gl = torch.empty(4, device="cuda", dtype=torch.int64)
        out = turbo.ops.grouped_gemm(a, b, gl, trans_b=True)
        dw = torch.ops.primus_turbo.grouped_gemm_wgrad(
            a, torch.empty(32, 128, device="cuda", dtype=torch.float16), gl, None, True, 0
        )
    assert out.shape == (32, 128) and out.device.type == "cuda"
    assert dw.shape == (4, 128, 64)


def test_torch_compile_traces_without_graph_break():
    layer = turbo.modules.GroupedLinear(4, 16, 8, device="meta", dtype=torch.bfloat16)

    def fn(x, gl):
        return torch.relu(layer(x, gl)) + 1

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = compiled(meta(12, 16, grad=True), lens(4))
    assert out.shape == (12, 8)
    out.sum().backward()


def test_registered_as_custom_ops():
    schema = str(torch.ops.primus_turbo.grouped_gemm.default._schema)
    assert "grouped_gemm(Tensor a, Tensor b, Tensor group_lens, Tensor? group_offs, bool trans_b, int num_sms)" in schema
    assert hasattr(torch.ops.primus_turbo, "grouped_gemm_wgrad")


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        ((torch.randn(4, 8).bfloat16(), torch.randn(2, 8, 3).bfloat16(), torch.tensor([2, 2])), {}, ValueError,
         "argument 'a' is on cpu; expected a CUDA device"),
        ((meta(4, 8), meta(2, 7, 3), lens(2)), {}, ValueError, "inner dimensions do not match"),
        ((meta(4, 8), meta(2, 8, 3), lens(2)), {"trans_b": True}, ValueError, "inner dimensions do not match"),
        ((meta(4, 8), meta(2, 8, 3, dtype=torch.float16), lens(2)), {}, TypeError, "argument 'b' has dtype torch.float16"),
        ((meta(4, 8, dtype=torch.float32), meta(2, 8, 3, dtype=torch.float32), lens(2)), {}, TypeError,
         "argument 'a' has dtype torch.float32; expected bfloat16 or float16"),
        ((meta(4, 8), meta(8, 3), lens(2)), {}, ValueError, "argument 'b' must be 3-D"),
        ((meta(4, 8, 1), meta(2, 8, 3), lens(2)), {}, ValueError, "argument 'a' must be 2-D"),
        ((meta(4, 8), meta(2, 8, 3), lens(3)), {}, ValueError, "'group_lens' has 3 groups but 'b' has 2"),
        ((meta(4, 8), meta(2, 8, 3), lens(2, torch.int32)), {}, TypeError, "'group_lens' has dtype torch.int32"),
        ((meta(4, 8), meta(0, 8, 3), lens(0)), {}, ValueError, "at least one group"),
        ((meta(4, 8), meta(2, 8, 3), [2, 2]), {}, TypeError, "'group_lens' must be a torch.Tensor"),
        ((meta(4, 8), meta(2, 8, 3), lens(2), lens(2)), {}, ValueError, r"'group_offs' has shape \(2,\); expected \[3\]"),
        ((meta(4, 8), meta(2, 8, 3), lens(2), lens(3, torch.int32)), {}, TypeError, "'group_offs' has dtype"),
        (("x", meta(2, 8, 3), lens(2)), {}, TypeError, "argument 'a' must be a torch.Tensor"),
    ],
)
def test_bad_arguments_raise_clear_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.grouped_gemm(*args, **kwargs)


def test_grouped_linear_checks_input():
    layer = turbo.modules.GroupedLinear(2, 16, 8, device="meta")
    with pytest.raises(ValueError, match="in_features=16"):
        layer(meta(4, 12, dtype=torch.float32), lens(2))
    with pytest.raises(ValueError, match="group_num"):
        turbo.modules.GroupedLinear(0, 16, 8)
    for bad in ((2.5, 16, 8), (2, 16, 1.5), ("4", 16, 8)):
        with pytest.raises(TypeError, match="must be an int"):
            turbo.modules.GroupedLinear(*bad)
    with pytest.raises(ValueError, match="in_features and out_features"):
        turbo.modules.GroupedLinear(2, -1, 8)
    np = pytest.importorskip("numpy")

    assert turbo.modules.GroupedLinear(np.int64(2), torch.tensor(16), 8, device="meta").weight.shape == (2, 8, 16)
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        layer([1.0], lens(2))
    with pytest.raises(TypeError, match="argument 'group_offs'"):
        turbo.ops.grouped_gemm(meta(8, 16), meta(2, 8, 16), lens(2), group_offs=[0, 4, 8], trans_b=True)
    assert layer.weight.shape == (2, 8, 16)


def _core_args(a_shape=(64, 32), b_shape=(2, 32, 16), g=2, d_shape=(64, 16), dtype=2, wgrad=0, lens_dtype=8):
    parts = [
        precompile._tensor(a_shape, dtype),
        precompile._tensor(b_shape, dtype),
        precompile._tensor((g,), lens_dtype),
        None,
        precompile._tensor(d_shape, dtype),
    ]
    args = PtGroupedGemmArgs(*[ctypes.pointer(t) if t is not None else None for t in parts], wgrad, 0)
    args._keep = parts
    return args


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"a_shape": (-1, 32)}, "argument 'a' has a negative dimension"),
        ({"d_shape": (64, 8)}, r"argument 'out' has shape \[64, 8\]; expected \[64, 16\]"),
        ({"lens_dtype": 7}, "argument 'group_lens' has dtype int32; expected int64"),
        ({"wgrad": 1, "b_shape": (63, 16), "d_shape": (2, 32, 16)}, "'grad_out' has shape"),
        ({"wgrad": 1, "b_shape": (64, 16), "d_shape": (2, 16, 32)}, "argument 'out' has shape"),
    ],
)
def test_core_rejects_bad_descriptors(kwargs, match):
    """A C or JAX caller gets the same checks: the core validates before any device work."""
    args = _core_args(**kwargs)
    with pytest.raises(ValueError, match=match):
        check(lib.pt_grouped_gemm_prepare(ctypes.byref(args), precompile.BACKEND_CUTLASS, 0))


def test_core_rejects_non_contiguous_and_unknown_backend():
    args = _core_args()
    args._keep[1].strides[1] = 64  # b[g] rows padded
    with pytest.raises(ValueError, match="argument 'b' must be contiguous"):
        check(lib.pt_grouped_gemm_prepare(ctypes.byref(args), precompile.BACKEND_CUTLASS, 0))
    with pytest.raises(ValueError, match="expected CUTLASS"):
        check(lib.pt_grouped_gemm_prepare(ctypes.byref(_core_args()), 1, 0))


def test_problem_key_and_config_names():
    from primus_turbo._core.lib import string_out

    key = string_out(lib.pt_grouped_gemm_problem_key, ctypes.byref(_core_args()), size=256)
    assert key == "M64xN16xK32xG2|bfloat16|fwd|AkBn|align16"
    assert precompile.num_grouped_configs() >= 3
    names = {precompile.grouped_config_name("bf16", "AkBn", c) for c in range(precompile.num_grouped_configs())}
    assert len(names) == precompile.num_grouped_configs()
    assert any("pingpong" in n for n in names) and any("coop" in n for n in names)


def test_original_arguments_num_cu_schedule_and_main_grad_on_meta():
    a, b = meta(12, 16, grad=True), meta(4, 16, 8, grad=True)
    out = turbo.ops.grouped_gemm(a, b, lens(4), num_cu=16, schedule="static")
    assert out.shape == (12, 8)
    with pytest.raises(NotImplementedError, match="work_steal"):
        turbo.ops.grouped_gemm(a, b, lens(4), schedule="work_steal")
    with pytest.raises(ValueError, match="schedule must be 'static'"):
        turbo.ops.grouped_gemm(a, b, lens(4), schedule="dynamic")
    with pytest.raises(ValueError, match="num_cu must be a positive int"):
        turbo.ops.grouped_gemm(a, b, lens(4), num_cu=0)
    with pytest.raises(ValueError, match="main_grad"):
        turbo.ops.grouped_gemm(a, b, lens(4), fuse_bgrad_accum_pattern="megatron")
    b.main_grad = torch.zeros(4, 16, 8, device="meta", dtype=torch.float32)
    turbo.ops.grouped_gemm(a, b, lens(4), fuse_bgrad_accum_pattern="megatron").sum().backward()
    assert b.grad_added_to_main_grad and b.grad.shape == b.shape
    for fn in (turbo.ops.grouped_gemm_fp8, turbo.ops.grouped_gemm_fp4):
        w = meta(4, 32, 64, grad=True)
        w.main_grad = torch.zeros(4, 32, 64, device="meta", dtype=torch.float32)
        x = meta(12, 64, grad=True)
        fn(x, w, lens(4), fuse_bgrad_accum_pattern="megatron", num_cu=8).sum().backward()
        assert w.grad_added_to_main_grad and x.grad.shape == x.shape



def test_grouped_linear_fp8_weight_cache_shapes_reuse_and_refresh():
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity

    cfg = Float8QuantConfig(format=Format.HYBRID, granularity=ScalingGranularity.BLOCKWISE, block_size=128)
    layer = turbo.modules.GroupedLinear(2, 256, 128, device="meta", dtype=torch.bfloat16, config=cfg,
                                        cache_quantized_weight=True)
    assert "cache_quantized_weight=True" in repr(layer)
    x = torch.empty(64, 256, device="meta", dtype=torch.bfloat16, requires_grad=True)
    lens = torch.empty(2, device="meta", dtype=torch.int64)
    y = layer(x, lens)
    y.sum().backward()
    assert y.shape == (64, 128) and x.grad.shape == x.shape and layer.weight.grad.shape == (2, 128, 256)
    first = layer._weight_cache[1]
    layer(x, lens)
    assert layer._weight_cache[1] is first  # the same weight: the cached copies serve again
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    opt.step()  # any torch optimizer step drops the cache
    assert layer._weight_cache is None


def test_grouped_linear_fp8_arguments():
    with pytest.raises(TypeError, match="config must be a Float8QuantConfig"):
        turbo.modules.GroupedLinear(2, 16, 8, device="meta", config="fp8")
    with pytest.raises(ValueError, match="cache_quantized_weight needs an FP8 config"):
        turbo.modules.GroupedLinear(2, 16, 8, device="meta", cache_quantized_weight=True)


def test_quantized_weight_restatement_is_kept_with_the_tensor_and_its_aliases():
    # A weight quantized once a step is transposed and restated for the grouped kernel once, not
    # per micro-batch; detach (what the weight cache hands out per forward) shares it.
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity
    from primus_turbo.pytorch.core.quantized_tensor import create_quantized_weight
    from primus_turbo.pytorch.ops import _quantized_operands as qo

    cfg = Float8QuantConfig(format=Format.E4M3, granularity=ScalingGranularity.BLOCKWISE, block_size=128)
    w = torch.randn(2, 128, 256, device="meta", dtype=torch.bfloat16)
    data, _ = create_quantized_weight(w, torch.float8_e4m3fn, cfg)
    alias = data.detach()  # made before anything is memoized: still shares the memo
    first = qo.grouped_weight("grouped_gemm_fp8", "b", data, 1)
    assert qo.grouped_weight("grouped_gemm_fp8", "b", data, 1)[0] is first[0]
    assert qo.grouped_weight("grouped_gemm_fp8", "b", data.detach(), 1)[0] is first[0]
    assert qo.grouped_weight("grouped_gemm_fp8", "b", alias, 1)[0] is first[0]
    assert first[0].shape == (2, 256, 128)  # the dgrad's orientation: [G, K, N]
