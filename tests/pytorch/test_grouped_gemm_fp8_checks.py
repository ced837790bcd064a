"""Host-side behaviour of turbo.ops.grouped_gemm_fp8 that needs no GPU: argument errors raised
before any launch (in the binding and in the core), fake/meta shapes for every granularity and
format, and an aot_eager fullgraph trace."""

import ctypes
import sys

import pytest
import torch
from host_check_utils import check_grouped_gemm_step_on_meta, hp_grouped_gemm_bad_arguments, meta
from host_check_utils import meta_lens as lens

import primus_turbo.pytorch as turbo
from primus_turbo import precompile
from primus_turbo._core import check, lib
from primus_turbo._core.lib import PtGroupedGemmFp8Args, string_out
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
GRANS = [ScalingGranularity.TENSORWISE, ScalingGranularity.ROWWISE, ScalingGranularity.BLOCKWISE]


def cfg(g, fmt=Format.E4M3):
    return Float8QuantConfig(format=fmt, granularity=g, block_size=128 if g == ScalingGranularity.BLOCKWISE else None)


@pytest.mark.parametrize("g", GRANS)
@pytest.mark.parametrize("fmt", [Format.E4M3, Format.E5M2, Format.HYBRID])
@pytest.mark.parametrize("trans_b", [False, True])
def test_shapes_forward_and_backward_on_meta(g, fmt, trans_b):
    # K=272 and N=144: partial 128-blocks along K and N
    check_grouped_gemm_step_on_meta(turbo.ops.grouped_gemm_fp8, trans_b, k=272, n=144, config=cfg(g, fmt))


def test_out_dtype_and_default_config():
    out = turbo.ops.grouped_gemm_fp8(meta(32, 64), meta(2, 48, 64), lens(2), out_dtype=torch.float32)
    assert out.shape == (32, 48) and out.dtype == torch.float32
    out = turbo.ops.grouped_gemm_fp8(meta(32, 64, dtype=torch.float16), meta(2, 48, 64, dtype=torch.float16), lens(2))
    assert out.dtype == torch.float16


@pytest.mark.parametrize("g", GRANS)
def test_prequantized_forward_shapes(g):
    groups, m, k, n = 2, 32, 256, 48
    if g == ScalingGranularity.BLOCKWISE:
        sa, sb = meta(m, 2, dtype=torch.float32), meta(groups, 1, 2, dtype=torch.float32)
    elif g == ScalingGranularity.ROWWISE:
        sa, sb = meta(m, 1, dtype=torch.float32), meta(groups, n, 1, dtype=torch.float32)
    else:
        sa, sb = meta(dtype=torch.float32), meta(dtype=torch.float32)
    out = turbo.ops.grouped_gemm_fp8(
        (meta(m, k, dtype=E4M3), sa),
        (meta(groups, n, k, dtype=E4M3), sb),
        lens(groups),
        out_dtype=torch.bfloat16,
        config=cfg(g),
    )
    assert out.shape == (m, n) and out.dtype == torch.bfloat16


def test_prequantized_tuples_are_checked_like_the_rest():
    g = ScalingGranularity.ROWWISE
    qa, sa = meta(32, 256, dtype=E4M3), meta(32, 1, dtype=torch.float32)
    qb, sb = meta(2, 48, 256, dtype=E4M3), meta(2, 48, 1, dtype=torch.float32)

    def call(a=(qa, sa), b=(qb, sb), **kw):
        kw.setdefault("out_dtype", torch.bfloat16)
        return turbo.ops.grouped_gemm_fp8(a, b, lens(2), config=cfg(g), **kw)

    with pytest.raises(ValueError, match="argument 'a_scale_inv' is on cpu"):
        call(a=(qa, torch.empty(32, 1)))
    with pytest.raises(TypeError, match="out_dtype"):
        call(out_dtype=torch.int32)
    with pytest.raises(TypeError, match="pair \\(q, scale_inv\\)"):
        call(a=(qa,))
    with pytest.raises(ValueError, match="K=72 must be a multiple of 16"):
        call(a=(meta(32, 72, dtype=E4M3), sa), b=(meta(2, 48, 72, dtype=E4M3), sb))
    # N needs only 16-byte output rows: 24 bf16 columns are fine, 20 are not.
    assert call(b=(meta(2, 24, 256, dtype=E4M3), meta(2, 24, 1, dtype=torch.float32))).shape == (32, 24)
    with pytest.raises(ValueError, match="N=20 of 8"):
        call(b=(meta(2, 20, 256, dtype=E4M3), meta(2, 20, 1, dtype=torch.float32)))
    with pytest.raises(ValueError, match="fuse_bgrad_accum_pattern"):
        call(fuse_bgrad_accum_pattern="megatron")


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(32, 128, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(4, 64, 128, device="cuda", dtype=torch.bfloat16)
        gl = torch.empty(4, device="cuda", dtype=torch.int64)
        out = turbo.ops.grouped_gemm_fp8(a, b, gl, config=cfg(ScalingGranularity.BLOCKWISE))
    assert out.shape == (32, 64) and out.device.type == "cuda"


@pytest.mark.parametrize("g", GRANS)
def test_torch_compile_traces_without_graph_break(g):
    w = meta(4, 32, 64, grad=True)

    def fn(x, gl):
        return torch.relu(turbo.ops.grouped_gemm_fp8(x, w, gl, config=cfg(g, Format.HYBRID))) + 1

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = compiled(meta(48, 64, grad=True), lens(4))
    assert out.shape == (48, 32)
    out.sum().backward()


def test_registered_as_custom_op():
    schema = str(torch.ops.primus_turbo.grouped_gemm_fp8_mm.default._schema)
    assert "Tensor group_lens, Tensor? group_offs, int b_scale_rows, ScalarType out_dtype, int num_sms" in schema


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        *hp_grouped_gemm_bad_arguments(n=16, k=32),
        ((meta(4, 32), meta(2, 16, 32), lens(2)), {"trans_b": False, "config": None}, ValueError, "inner dimensions"),
        ((meta(4, 24), meta(2, 16, 24), lens(2)), {}, ValueError, "K=24 and N=16 must be multiples of 16"),
        ((meta(4, 32), meta(2, 24, 32), lens(2)), {}, ValueError, "N=24"),
        ((meta(4, 32), meta(2, 16, 32), lens(2)), {"config": "fp8"}, TypeError, "Float8QuantConfig"),
        (
            (meta(4, 32), meta(2, 16, 32), lens(2)),
            {"config": Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=64)},
            ValueError,
            "block_size=128",
        ),
        (
            ((meta(4, 32, dtype=E4M3), meta(dtype=torch.float32)), meta(2, 16, 32), lens(2)),
            {},
            TypeError,
            "both 'a' and 'b'",
        ),
        (
            (
                (meta(4, 32, dtype=E4M3), meta(dtype=torch.float32)),
                (meta(2, 16, 32, dtype=E4M3), meta(dtype=torch.float32)),
                lens(2),
            ),
            {},
            ValueError,
            "out_dtype is required",
        ),
        (
            (
                (meta(4, 32, dtype=E4M3), meta(dtype=torch.float32)),
                (meta(2, 16, 32, dtype=E4M3), meta(dtype=torch.float32)),
                lens(2),
            ),
            {"trans_b": False, "out_dtype": torch.bfloat16},
            ValueError,
            "trans_b=True",
        ),
        (
            (
                (meta(4, 32, dtype=E4M3), meta(4, 3, dtype=torch.float32)),
                (meta(2, 16, 32, dtype=E4M3), meta(2, 1, 1, dtype=torch.float32)),
                lens(2),
            ),
            {"out_dtype": torch.bfloat16, "config": cfg(ScalingGranularity.BLOCKWISE)},
            ValueError,
            "'a' scale_inv has shape",
        ),
    ],
)
def test_bad_arguments_raise_clear_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        turbo.ops.grouped_gemm_fp8(*args, **kwargs)


def test_mx_blockwise_traces_and_refuses_prequantized_tuples():
    c = Float8QuantConfig(
        granularity=ScalingGranularity.MX_BLOCKWISE,
        block_size=32,
        scale_dtype=__import__("primus_turbo.pytorch.core.low_precision", fromlist=["ScaleDtype"]).ScaleDtype.E8M0,
    )
    assert turbo.ops.grouped_gemm_fp8(meta(4, 32), meta(2, 16, 32), lens(2), config=c).shape == (4, 16)
    q = torch.empty(4, 32, device="meta", dtype=torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="QuantizedTensor"):
        turbo.ops.grouped_gemm_fp8((q, meta(4, 1)), (q.view(2, 2, 32), meta(2, 2, 1)), lens(2), config=c,
                                   out_dtype=torch.bfloat16)


# ---- the core's own checks (a C or JAX caller gets the same) ------------------------------------

_F32, _BF16, _E4M3, _E5M2, _I64, _I32 = 0, 2, 3, 4, 8, 7


def _core_args(
    m=64,
    n=48,
    k=256,
    g=2,
    a_dtype=_E4M3,
    d_dtype=_BF16,
    rows=1,
    sa=None,
    sb=None,
    lens_dtype=_I64,
    b=None,
    d=None,
    sms=0,
):
    kb = -(-k // 128)
    parts = [
        precompile._tensor((m, k), a_dtype),
        precompile._tensor(sa or (m, kb), _F32),
        precompile._tensor(b or (g, n, k), _E4M3),
        precompile._tensor(sb or (g, -(-n // rows), kb), _F32),
        precompile._tensor((g,), lens_dtype),
        None,
        precompile._tensor(d or (m, n), d_dtype),
    ]
    args = PtGroupedGemmFp8Args(*[ctypes.pointer(t) if t is not None else None for t in parts], rows, sms)
    args._keep = parts
    return args


def _key(args):
    return string_out(lib.pt_grouped_gemm_fp8_problem_key, ctypes.byref(args), size=256)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"a_dtype": _BF16}, "argument 'a' has dtype bfloat16; expected float8"),
        ({"d_dtype": _E4M3}, "argument 'out' has dtype"),
        ({"sa": (64, 3)}, r"argument 'a_scale' has shape \[64, 3\]; expected \[64, 2\]"),
        ({"rows": 128, "sb": (2, 48, 2)}, r"argument 'b_scale' has shape \[2, 48, 2\]; expected \[2, 1, 2\]"),
        ({"rows": 64}, "b_scale_rows must be 1 or 128"),
        ({"lens_dtype": _I32}, "'group_lens' has dtype int32; expected int64"),
        ({"b": (3, 48, 256)}, "'b' has 3 groups"),
        ({"b": (2, 48, 128)}, "inner dimensions do not match"),
        ({"d": (64, 40)}, r"argument 'out' has shape \[64, 40\]; expected \[64, 48\]"),
        ({"sms": -1}, "num_sms must be >= 0"),
    ],
)
def test_core_rejects_bad_descriptors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _key(_core_args(**kwargs))


def test_core_rejects_non_contiguous_and_unknown_backend():
    args = _core_args()
    args._keep[2].strides[1] = 512  # b[g] rows padded
    with pytest.raises(ValueError, match="argument 'b' must be contiguous"):
        _key(args)
    size = ctypes.c_size_t()
    with pytest.raises(ValueError, match="expected CUTLASS"):
        check(lib.pt_grouped_gemm_fp8_workspace_size(ctypes.byref(_core_args()), 1, 0, ctypes.byref(size)))


def test_problem_key_and_configs():
    assert _key(_core_args()) == "fp8|M64xN48xK256xG2|float8_e4m3fnxfloat8_e4m3fn->bfloat16|sfb1|align16"
    assert _key(_core_args(rows=128)).endswith("|sfb128|align16")
    assert _key(_core_args(sms=66)).endswith("|align16|sms66")
    n = lib.pt_grouped_gemm_fp8_num_configs(precompile.BACKEND_CUTLASS)
    assert 1 <= n <= 3  # each config is a multi-minute compile per dtype pair
    assert lib.pt_grouped_gemm_fp8_num_configs(1) == -1
    with pytest.raises(ValueError, match="out of range"):
        check(lib.pt_grouped_gemm_fp8_prepare(_E4M3, _E4M3, _BF16, 1, n))
    with pytest.raises(ValueError, match="b_scale_rows"):
        check(lib.pt_grouped_gemm_fp8_prepare(_E4M3, _E4M3, _BF16, 2, 0))
    with pytest.raises(ValueError, match="dtypes"):
        check(lib.pt_grouped_gemm_fp8_prepare(_BF16, _E4M3, _BF16, 1, 0))


@pytest.mark.parametrize("g", GRANS)
@pytest.mark.parametrize("trans_b", [False, True])
def test_fp8_wgrad_shapes_on_meta(monkeypatch, g, trans_b):
    mod = sys.modules["primus_turbo.pytorch.ops.grouped_gemm_fp8"]  # the package attribute is the function

    monkeypatch.setattr(mod, "FP8_WGRAD", True)
    groups, m, k, n = 3, 40, 272, 144
    a = meta(m, k, grad=True)
    b = meta(*((groups, n, k) if trans_b else (groups, k, n)), grad=True)
    out = turbo.ops.grouped_gemm_fp8(a, b, lens(groups), trans_b=trans_b, config=cfg(g, Format.HYBRID))
    out.sum().backward()
    assert b.grad.shape == b.shape and b.grad.dtype == b.dtype


def test_pad_tokens_packs_groups_at_multiples_of_128():
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import pad_tokens, padded_width

    group_lens = torch.tensor([3, 0, 130, 1, 0])
    x = torch.arange(1, 135, dtype=torch.float32).reshape(134, 1)
    width = padded_width(134, 5)
    assert width % 128 == 0 and width >= 128 + 256 + 128
    xp = pad_tokens(x, group_lens, None, width)
    assert xp.shape == (width, 1)
    expected = torch.zeros(width)
    expected[0:3] = x[0:3, 0]  # group 0 at column 0
    expected[128:258] = x[3:133, 0]  # group 2 at 128 (group 1 empty takes no room)
    expected[384] = x[133, 0]  # group 3 at 128 + 256
    assert torch.equal(xp[:, 0], expected)
    # Explicit offsets with a gap: rows no group covers are dropped.
    offs = torch.tensor([0, 4, 4, 134, 134, 134])
    xp = pad_tokens(x, group_lens, offs, width)
    assert torch.equal(xp[0:3, 0], x[0:3, 0]) and xp[3].item() == 0
    assert torch.equal(xp[128:258, 0], x[4:134, 0])
    # Lengths overrunning the tokens are clamped like the kernels clamp them.
    xp = pad_tokens(x, torch.tensor([100, 100]), None, padded_width(134, 2))
    assert torch.equal(xp[0:100, 0], x[0:100, 0]) and torch.equal(xp[128:162, 0], x[100:134, 0])
    assert torch.count_nonzero(xp[162:]) == 0


def test_core_wgrad_descriptors():
    def args(ld=512, sa=(4, 64), b=(48, 512), d=(2, 64, 48), rows=1, tokens=300):
        parts = [
            precompile._tensor((64, ld), _E4M3),
            precompile._tensor(sa, _F32),
            precompile._tensor(b, _E5M2),
            precompile._tensor((ld // 128, 48), _F32),
            precompile._tensor((2,), _I64),
            None,
            precompile._tensor(d, _BF16),
        ]
        a = PtGroupedGemmFp8Args(*[ctypes.pointer(t) if t is not None else None for t in parts], rows, 0, 1, tokens)
        a._keep = parts
        return a

    assert _key(args()) == "fp8-wgrad|M64xN48xT300xLD512xG2|float8_e4m3fnxfloat8_e5m2->bfloat16|sfb1|align16"
    with pytest.raises(ValueError, match="multiple of 128"):
        _key(args(ld=500, sa=(3, 64), b=(48, 500)))
    with pytest.raises(ValueError, match=r"argument 'out' has shape \[2, 48, 64\]; expected \[2, 64, 48\]"):
        _key(args(d=(2, 48, 64)))
    with pytest.raises(ValueError, match="b_scale_rows must be 1"):
        _key(args(rows=128))
    with pytest.raises(ValueError, match=r"argument 'a_scale' has shape"):
        _key(args(sa=(64, 4)))


def test_row_scales_and_flags_in_the_core():
    # b_scale_rows 0: one scale per row of a ([M]) and of each expert's b ([G, N]); flags ask for the
    # fast accumulation, part of the problem key; unknown bits and block-shaped row scales are errors.
    rows_args = _core_args(rows=0, sa=(64,), sb=(2, 48))
    assert _key(rows_args).endswith("|sfb0|align16")
    rows_args.flags = 1  # PT_GEMM_FP8_FAST_ACCUM
    assert _key(rows_args).endswith("|sfb0|fast_accum|align16")
    rows_args.flags = 4
    with pytest.raises(ValueError, match="argument 'flags' has unknown bits"):
        _key(rows_args)
    with pytest.raises(ValueError, match="argument 'a_scale' must be 1-D"):
        _key(_core_args(rows=0, sb=(2, 48)))
    with pytest.raises(ValueError, match=r"argument 'b_scale' has shape \[2, 40\]; expected \[2, 48\]"):
        _key(_core_args(rows=0, sa=(64,), sb=(2, 40)))
