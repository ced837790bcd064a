"""turbo.ops.rope on the GPU: outputs and gradients of q and k against a float64 reference (and its
autograd) under the gates of ACCURACY.md, for every layout, pair layout, cos/sin source, partial
rotary dimension, position source and GQA; odd sizes, views, unaligned pointers, empty inputs,
CUDA graphs and torch.compile."""

import pytest
import torch
from turbo_test_utils import assert_gate, poison_allocator

import primus_turbo.pytorch as turbo

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
THETA = 10000.0


def reference(x, pos, rotary_dim, interleaved, theta=THETA, cos=None, sin=None):
    """float64 RoPE of x ([..., heads, head_dim]) at integer positions pos (x.shape[:-2])."""
    half = rotary_dim // 2
    pos = pos.long()
    if cos is None:
        inv_freq = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=x.device) / rotary_dim)
        ang = pos.double()[..., None] * inv_freq
        c, s = ang.cos(), ang.sin()
    else:
        c, s = cos.double()[pos], sin.double()[pos]
    c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        y = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
        y = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((y, rest), dim=-1)


def default_positions(shape, layout, cu_seqlens=None, device="cuda"):
    """Token positions (shape = the token dimensions) that rope uses without explicit positions."""
    if layout == "bshd":
        return torch.arange(shape[1], device=device).expand(shape[0], shape[1])
    if layout == "sbhd":
        return torch.arange(shape[0], device=device)[:, None].expand(shape[0], shape[1])
    t = torch.arange(shape[0], device=device)
    if cu_seqlens is None:
        return t
    starts = cu_seqlens.long()
    seq = torch.searchsorted(starts, t, right=True) - 1
    return t - starts[seq]


def check_rope(q, k, pos, rotary_dim, interleaved, cos=None, sin=None, seed=0, **kwargs):
    """Runs turbo.ops.rope forward and backward and gates both against the float64 reference."""
    dtype = q.dtype
    torch.manual_seed(seed + 1)
    dq_out, dk_out = torch.randn_like(q, dtype=dtype), torch.randn_like(k, dtype=dtype)
    # detach keeps the caller's strides and offset (views of qkv, unaligned pointers).
    qv, kv = q.detach().requires_grad_(), k.detach().requires_grad_()
    q_in, k_in = qv, kv
    poison_allocator(max(q.numel(), k.numel()) * dtype.itemsize)
    qo, ko = turbo.ops.rope(q_in, k_in, cos, sin, rotary_dim=rotary_dim, interleaved=interleaved, **kwargs)
    torch.autograd.backward((qo, ko), (dq_out, dk_out))
    q64, k64 = q_in.detach().double().requires_grad_(), k_in.detach().double().requires_grad_()
    rq = reference(q64, pos, rotary_dim, interleaved, cos=cos, sin=sin, theta=kwargs.get("theta", THETA))
    rk = reference(k64, pos, rotary_dim, interleaved, cos=cos, sin=sin, theta=kwargs.get("theta", THETA))
    torch.autograd.backward((rq, rk), (dq_out.double(), dk_out.double()))
    assert qo.dtype == dtype and qo.is_contiguous() and ko.is_contiguous()
    assert_gate(qo.detach(), rq.detach(), dtype, "q_out")
    assert_gate(ko.detach(), rk.detach(), dtype, "k_out")
    assert_gate(qv.grad, q64.grad, dtype, "dq")
    assert_gate(kv.grad, k64.grad, dtype, "dk")


def make_qk(shape_q, heads_k, dtype, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(shape_q, device="cuda", dtype=dtype)
    k = torch.randn(*shape_q[:-2], heads_k, shape_q[-1], device="cuda", dtype=dtype)
    return q, k


# (token dims, heads_q, heads_k, head_dim, rotary_dim): model-like, GQA, partial, odd sizes.
SHAPES = [
    ((2, 37), 5, 3, 64, 64),
    ((3, 17), 8, 2, 128, 64),  # partial rotary (half of the head)
    ((1, 33), 4, 4, 30, 18),  # odd sizes: scalar path, odd pass-through
    ((2, 9), 3, 1, 96, 32),
]


@pytest.mark.parametrize("source", ["theta", "table"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}h{s[1]}/{s[2]}d{s[3]}r{s[4]}")
def test_rope_matches_float64(shape, layout, dtype, interleaved, source):
    (d0, d1), hq, hk, hd, rd = shape
    q, k = make_qk((d0, d1, hq, hd), hk, dtype, seed=hd + d1)
    pos = default_positions(q.shape[:2], layout)
    cos = sin = None
    if source == "table":
        cos, sin = turbo.ops.rope_cos_sin(max(d0, d1) + 5, rd, theta=500000.0, device="cuda")
    check_rope(q, k, pos, rd, interleaved, cos, sin, layout=layout)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_model_size_long_positions(dtype):
    # Llama-3.1-8B heads at positions up to 32K: the computed angles stay accurate.
    q, k = make_qk((1, 4096, 32, 128), 8, dtype, seed=3)
    pos = torch.randint(0, 32768, (1, 4096), device="cuda")
    check_rope(q, k, pos, 128, False, positions=pos, theta=500000.0)


@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("shared", [False, True], ids=["per_token", "shared"])
@pytest.mark.parametrize("source", ["theta", "table"])
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_explicit_positions(layout, source, shared, pos_dtype):
    shape = (3, 21, 4, 64) if layout == "bshd" else (21, 3, 4, 64)
    q, k = make_qk(shape, 2, torch.bfloat16, seed=7)
    seq = 21
    if shared:
        positions = torch.randint(0, 100, (seq,), device="cuda", dtype=pos_dtype)
        pos = positions[None, :].expand(3, seq) if layout == "bshd" else positions[:, None].expand(seq, 3)
    else:
        positions = torch.randint(0, 100, q.shape[:2], device="cuda", dtype=pos_dtype)
        pos = positions
    cos = sin = None
    if source == "table":
        cos, sin = turbo.ops.rope_cos_sin(100, 64, device="cuda")
    check_rope(q, k, pos, 64, False, cos, sin, positions=positions, layout=layout)


@pytest.mark.parametrize("source", ["theta", "table"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_packed_sequences(dtype, interleaved, source):
    # Lengths include 1 and an empty sequence; positions restart at every start.
    cu = torch.tensor([0, 5, 6, 6, 40, 77], device="cuda", dtype=torch.int32)
    q, k = make_qk((77, 6, 64), 2, dtype, seed=11)
    pos = default_positions(q.shape, "thd", cu)
    cos = sin = None
    if source == "table":
        cos, sin = turbo.ops.rope_cos_sin(64, 48, device="cuda")
    check_rope(q, k, pos, 48, interleaved, cos, sin, layout="thd", cu_seqlens=cu)


def test_packed_with_int64_cu_seqlens_and_explicit_positions():
    q, k = make_qk((50, 4, 128), 1, torch.bfloat16, seed=12)
    cu = torch.tensor([0, 20, 50], device="cuda")
    check_rope(q, k, default_positions(q.shape, "thd", cu), 128, False, layout="thd", cu_seqlens=cu)
    positions = torch.randint(0, 1000, (50,), device="cuda")
    check_rope(q, k, positions, 128, True, layout="thd", positions=positions)


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_views_of_fused_qkv(layout):
    # q and k sliced out of one [.., hq + 2 hk, d] tensor: read in place through their strides.
    hq, hk = 8, 2
    qkv_shape = (2, 13, hq + 2 * hk, 128)
    torch.manual_seed(5)
    qkv = torch.randn(qkv_shape, device="cuda", dtype=torch.bfloat16)
    q, k = qkv[:, :, :hq], qkv[:, :, hq : hq + hk]
    check_rope(q, k, default_positions(q.shape[:2], layout), 128, False, layout=layout)
    # A transposed view ([b, s] seen as [s, b]) and a strided last dimension (copied).
    qt, kt = q.transpose(0, 1), k.transpose(0, 1)
    other = "sbhd" if layout == "bshd" else "bshd"
    check_rope(qt, kt, default_positions(qt.shape[:2], other), 64, True, layout=other)
    wide = torch.randn(2, 13, 4, 256, device="cuda", dtype=torch.bfloat16)
    check_rope(wide[..., ::2], wide[..., 1::2], default_positions((2, 13), "bshd"), 128, False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_unaligned_pointers_take_the_scalar_path(dtype):
    buf = torch.randn(1 + 2 * 7 * 4 * 64, device="cuda", dtype=dtype)
    q = buf[1:].view(2, 7, 4, 64)
    k = torch.randn(2, 7, 2, 64, device="cuda", dtype=dtype)
    check_rope(q, k, default_positions((2, 7), "bshd"), 64, False)


def test_rotary_dim_defaults_to_the_table_width():
    q, k = make_qk((2, 8, 4, 128), 4, torch.bfloat16)
    cos, sin = turbo.ops.rope_cos_sin(8, 32, device="cuda")
    qo, _ = turbo.ops.rope(q, k, cos, sin)
    assert torch.equal(qo[..., 32:], q[..., 32:])  # pass-through is a copy
    assert_gate(
        qo, reference(q.double(), default_positions((2, 8), "bshd"), 32, False, cos=cos, sin=sin), torch.bfloat16
    )


def test_out_of_range_table_position_is_nan():
    q, k = make_qk((1, 4, 2, 64), 1, torch.float32)
    cos, sin = turbo.ops.rope_cos_sin(10, 64, device="cuda")
    positions = torch.tensor([0, 3, 10, -1], device="cuda")
    qo, ko = turbo.ops.rope(q, k, cos, sin, positions=positions)
    assert torch.isfinite(qo[:, :2]).all() and torch.isnan(qo[:, 2:]).all() and torch.isnan(ko[:, 2:]).all()


@pytest.mark.parametrize(
    "shape_q,shape_k,layout",
    [
        ((0, 5, 4, 64), (0, 5, 2, 64), "bshd"),
        ((3, 0, 4, 64), (3, 0, 2, 64), "sbhd"),
        ((0, 4, 64), (0, 2, 64), "thd"),
        ((2, 3, 4, 64), (2, 3, 0, 64), "bshd"),
    ],
)
def test_empty_inputs(shape_q, shape_k, layout):
    q = torch.randn(shape_q, device="cuda", requires_grad=True)
    k = torch.randn(shape_k, device="cuda", requires_grad=True)
    qo, ko = turbo.ops.rope(q, k, layout=layout)
    assert qo.shape == q.shape and ko.shape == k.shape
    (qo.sum() + ko.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_cuda_graph_capture_and_replay():
    q, k = make_qk((2, 64, 8, 128), 2, torch.bfloat16)
    cu = torch.tensor([0, 30, 128], device="cuda", dtype=torch.int32)
    qp, kp = q.view(128, 8, 128), k.view(128, 2, 128)
    turbo.ops.rope(qp, kp, layout="thd", cu_seqlens=cu)  # compile the module outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qo, ko = turbo.ops.rope(qp, kp, layout="thd", cu_seqlens=cu)
    qp.copy_(torch.randn_like(qp))
    graph.replay()
    torch.cuda.synchronize()
    pos = default_positions(qp.shape, "thd", cu)
    assert_gate(qo, reference(qp.double(), pos, 128, False), torch.bfloat16)
    assert_gate(ko, reference(kp.double(), pos, 128, False), torch.bfloat16)


def test_torch_compile_fullgraph():
    def fn(q, k, positions):
        qo, ko = turbo.ops.rope(q, k, positions=positions, rotary_dim=64, interleaved=True)
        return qo * 2, ko - 1

    compiled = torch.compile(fn, fullgraph=True)
    q, k = make_qk((2, 16, 4, 128), 2, torch.bfloat16)
    positions = torch.randint(0, 500, (2, 16), device="cuda")
    q.requires_grad_(), k.requires_grad_()
    qo, ko = compiled(q, k, positions)
    (qo.float().sum() + ko.float().sum()).backward()
    eq, ek = fn(q.detach(), k.detach(), positions)
    assert torch.equal(qo, eq) and torch.equal(ko, ek)
    q64 = q.detach().double().requires_grad_()
    (2 * reference(q64, positions, 64, True)).sum().backward()
    assert_gate(q.grad, q64.grad, torch.bfloat16, "dq")
