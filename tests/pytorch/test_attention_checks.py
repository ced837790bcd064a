"""Host-side behaviour of turbo.ops.flash_attn_func / flash_attn_varlen_func that needs no GPU:
argument errors naming the argument, shapes through meta and fake tensors (forward and backward)
and torch.compile, the module, and the transformers registration."""

import sys
from types import SimpleNamespace

import pytest
import torch
from host_check_utils import meta

import primus_turbo.pytorch as turbo

fa = turbo.ops.flash_attn_func
fa_varlen = turbo.ops.flash_attn_varlen_func


def qkv(b=2, sq=16, sk=16, hq=8, hkv=2, d=128, dv=None, grad=False, dtype=torch.bfloat16):
    dv = dv or d
    return (
        meta(b, sq, hq, d, dtype=dtype, grad=grad),
        meta(b, sk, hkv, d, dtype=dtype, grad=grad),
        meta(b, sk, hkv, dv, dtype=dtype, grad=grad),
    )


def packed(tq=30, tk=40, hq=8, hkv=2, d=128, dv=None, grad=False):
    dv = dv or d
    return meta(tq, hq, d, grad=grad), meta(tk, hkv, d, grad=grad), meta(tk, hkv, dv, grad=grad)


def cu(n, dtype=torch.int32):
    return torch.empty(n, device="meta", dtype=dtype)


def test_registered_as_custom_ops():
    fwd = str(torch.ops.primus_turbo.attention_fwd.default._schema)
    bwd = str(torch.ops.primus_turbo.attention_bwd.default._schema)
    assert fwd.startswith(
        "primus_turbo::attention_fwd(Tensor q, Tensor k, Tensor v, Tensor? sink, Tensor? cu_seqlens_q, "
        "Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, int window_left, "
        "int window_right, int backend)"
    )
    assert bwd.startswith(
        "primus_turbo::attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "Tensor? sink, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
        "float softmax_scale, int window_left, int window_right, int backend, bool deterministic)"
    )


@pytest.mark.parametrize("d,dv", [(64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256)])
@pytest.mark.parametrize("sq,sk", [(16, 16), (5, 33), (33, 5), (1, 1)])
def test_shapes_forward_and_backward_on_meta(sq, sk, d, dv):
    q, k, v = qkv(sq=sq, sk=sk, d=d, dv=dv, grad=True)
    sink = meta(8, dtype=torch.float32, grad=True)
    out, lse = fa(q, k, v, causal=True, return_lse=True, sink=sink)
    assert out.shape == (2, sq, 8, dv) and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (2, 8, sq) and lse.dtype == torch.float32 and not lse.requires_grad
    out.sum().backward()
    for t in (q, k, v, sink):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype


def test_strided_layouts_give_a_contiguous_bshd_output():
    s, b, h, d = 12, 3, 4, 64
    q = meta(s, b, h, d).transpose(0, 1)  # [S, B, H, D] storage
    k = meta(b, h, s, d).transpose(1, 2)  # [B, H, S, D] storage
    out = fa(q, k, k, causal=True)
    assert out.shape == (b, s, h, d) and out.is_contiguous()


def test_varlen_shapes_forward_and_backward_on_meta():
    q, k, v = packed(dv=None, d=192, grad=True)
    v = meta(40, 2, 128, grad=True)  # MLA: v has the smaller head dim
    out, lse = fa_varlen(q, k, v, cu(4), cu(4), 12, 20, causal=True, return_lse=True)
    assert out.shape == (30, 8, 128) and lse.shape == (8, 30) and lse.dtype == torch.float32
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_varlen_accepts_int64_offsets_and_host_int_like_lengths():
    np = pytest.importorskip("numpy")

    q, k, v = packed()
    out = fa_varlen(q, k, v, cu(3, torch.int64), cu(3, torch.int64), np.int64(10), 20)
    assert out.shape == (30, 8, 128)


def test_bf16_sink_is_taken_as_float32_and_gets_its_gradient():
    q, k, v = qkv(grad=True)
    sink = meta(8, dtype=torch.bfloat16, grad=True)
    fa(q, k, v, sink=sink).sum().backward()
    assert sink.grad.shape == (8,) and sink.grad.dtype == torch.bfloat16


def test_no_grad_and_inputs_without_grad_skip_autograd():
    q, k, v = qkv()
    assert fa(q, k, v).grad_fn is None
    q, k, v = qkv(grad=True)
    with torch.no_grad():
        assert fa(q, k, v).grad_fn is None


def test_fake_ops_shapes():
    ops = torch.ops.primus_turbo
    q, k, v = qkv(sq=5, sk=9, d=192, dv=128)
    out, lse = ops.attention_fwd(q, k, v, None, None, None, 5, 9, 0.1, -1, 0, 0)
    assert out.shape == (2, 5, 8, 128) and lse.shape == (2, 8, 5)
    dq, dk, dv, dsink = ops.attention_bwd(out, q, k, v, out, lse, None, None, None, 5, 9, 0.1, -1, 0, 0, False)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert dsink.shape == (0,) and dsink.dtype == torch.float32
    sink = meta(8, dtype=torch.float32)
    *_, dsink = ops.attention_bwd(out, q, k, v, out, lse, sink, None, None, 5, 9, 0.1, -1, 0, 0, False)
    assert dsink.shape == (8,)
    q, k, v = packed()
    out, lse = ops.attention_fwd(q, k, v, None, cu(3), cu(3), 10, 20, 0.1, -1, -1, 0)
    assert out.shape == (30, 8, 128) and lse.shape == (8, 30)


def test_fake_tensor_mode_on_cuda_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 64, 16, 128, device="cuda", dtype=torch.float16)
        k = torch.empty(2, 64, 4, 128, device="cuda", dtype=torch.float16)
        out, lse = fa(q, k, k, causal=True, window_size=(8, 0), return_lse=True)
        dq, dk, _, _ = torch.ops.primus_turbo.attention_bwd(
            out, q, k, k, out, lse, None, None, None, 64, 64, 0.1, 8, 0, 0, False
        )
        k3 = torch.empty(2, 64, 3, 128, device="cuda", dtype=torch.float16)
        with pytest.raises(ValueError, match="argument 'k' has 3 heads"):
            fa(q, k3, k3)
    assert out.shape == (2, 64, 16, 128) and out.device.type == "cuda" and lse.shape == (2, 16, 64)
    assert dq.shape == q.shape and dk.shape == k.shape and dq.device.type == "cuda"


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_traces_without_graph_break(dynamic):
    def fn(q, k, v, sink):
        out, lse = fa(q, k, v, causal=True, window_size=(7, 0), sink=sink, return_lse=True)
        return out * 2, lse

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for b, s in ((2, 16), (3, 24)):  # a second shape: re-traced (static) or the same graph (dynamic)
        q, k, v = qkv(b=b, sq=s, sk=s, grad=True)
        sink = meta(8, dtype=torch.float32, grad=True)
        out, lse = compiled(q, k, v, sink)
        assert out.shape == (b, s, 8, 128) and lse.shape == (b, 8, s)
        out.sum().backward()
        assert q.grad.shape == q.shape and sink.grad.shape == sink.shape


def test_torch_compile_varlen_traces_without_graph_break():
    def fn(q, k, v, cu_q, cu_k):
        return fa_varlen(q, k, v, cu_q, cu_k, 16, 16, causal=True)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    q, k, v = packed(tq=40, grad=True)
    out = compiled(q, k, v, cu(4), cu(4))
    out.sum().backward()
    assert out.shape == (40, 8, 128) and k.grad.shape == k.shape


BAD_ARGS = [
    # (overrides of q, k, v / keyword arguments, exception, message)
    (
        {"k": meta(2, 16, 3, 128), "v": meta(2, 16, 3, 128)},
        ValueError,
        r"argument 'k' has 3 heads; the number of heads of 'q' \(8\)",
    ),
    ({"k": meta(2, 16, 0, 128), "v": meta(2, 16, 0, 128)}, ValueError, "argument 'k' has 0 heads"),
    ({"q": meta(2, 16, 8, 80), "k": meta(2, 16, 2, 80), "v": meta(2, 16, 2, 80)}, NotImplementedError, "head dims"),
    ({"v": meta(2, 16, 2, 64)}, NotImplementedError, r"head dims \(q/k 128, v 64\)"),
    ({"k": meta(2, 16, 2, 64)}, ValueError, "argument 'k' has head_dim 64"),
    ({"q": meta(2, 16, 8, 128, dtype=torch.float32)}, TypeError, "argument 'q' has dtype torch.float32"),
    ({"k": meta(2, 16, 2, 128, dtype=torch.float16)}, TypeError, "argument 'k' has dtype torch.float16"),
    ({"v": meta(2, 16, 2, 128, dtype=torch.float32)}, TypeError, "argument 'v' has dtype torch.float32"),
    ({"q": meta(16, 8, 128)}, ValueError, r"argument 'q' has shape \[16, 8, 128\]; expected \[batch, seqlen"),
    ({"k": meta(3, 16, 2, 128)}, ValueError, "expected the same batch size"),
    ({"v": meta(2, 15, 2, 128)}, ValueError, "argument 'v' has shape"),
    ({"q": [1.0]}, TypeError, "argument 'q' must be a torch.Tensor"),
    ({"sink": meta(7, dtype=torch.float32)}, ValueError, r"argument 'sink' has shape \[7\]; expected \[8\]"),
    ({"sink": meta(8, dtype=torch.int32)}, TypeError, "argument 'sink'"),
    ({"sink": [0.0] * 8}, TypeError, "argument 'sink' must be a float32 torch.Tensor"),
    ({"window_size": (-2, 0)}, ValueError, "argument 'window_size'"),
    ({"window_size": (1.5, 0)}, TypeError, "argument 'window_size'"),
    ({"window_size": 3}, TypeError, "argument 'window_size'"),
    ({"window_size": (2**32, 0)}, ValueError, r"argument 'window_size'.*2\^31"),  # would wrap in int32
    ({"window_size": (0, 2**63)}, ValueError, "argument 'window_size'"),
    ({"window_size": (True, False)}, TypeError, "argument 'window_size'"),
    ({"softmax_scale": 1e300}, ValueError, "finite in float32"),  # inf once read as float32
    ({"softmax_scale": 10**400}, ValueError, "argument 'softmax_scale'"),
    ({"dropout_p": None}, TypeError, "argument 'dropout_p'"),
    ({"softmax_scale": float("inf")}, ValueError, "argument 'softmax_scale'"),
    ({"softmax_scale": "0.1"}, TypeError, "argument 'softmax_scale'"),
    ({"dropout_p": 0.1}, NotImplementedError, "dropout_p"),
    ({"bias": meta(2, 8, 16, 16)}, NotImplementedError, "argument 'bias'"),
    ({"alibi_slopes": meta(8, dtype=torch.float32)}, NotImplementedError, "argument 'alibi_slopes'"),
    ({"return_attn_probs": True}, NotImplementedError, "return_attn_probs"),
]


@pytest.mark.parametrize("overrides,exc,match", BAD_ARGS)
def test_argument_errors(overrides, exc, match):
    q, k, v = qkv()
    args = {"q": q, "k": k, "v": v, **overrides}
    with pytest.raises(exc, match=match):
        fa(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_argument_errors_with_grad_and_in_the_fake_op():
    q = qkv(grad=True)[0]
    with pytest.raises(ValueError, match="argument 'k' has 3 heads"):
        fa(q, meta(2, 16, 3, 128, grad=True), meta(2, 16, 3, 128, grad=True))
    with pytest.raises(NotImplementedError, match="head dims"):
        torch.ops.primus_turbo.attention_fwd(*qkv(d=100), None, None, None, 16, 16, 0.1, -1, -1, 0)


VARLEN_BAD_ARGS = [
    ({"cu_seqlens_k": cu(4)}, ValueError, r"argument 'cu_seqlens_k' has shape \[4\]; expected \[3\]"),
    ({"cu_seqlens_q": cu(1), "cu_seqlens_k": cu(1)}, ValueError, "argument 'cu_seqlens_q' has shape"),
    ({"cu_seqlens_q": torch.empty(2, 3, device="meta", dtype=torch.int32)}, ValueError, "'cu_seqlens_q' has shape"),
    ({"cu_seqlens_q": cu(3, torch.float32)}, TypeError, "argument 'cu_seqlens_q'"),
    ({"cu_seqlens_q": None}, ValueError, "'cu_seqlens_q' and 'cu_seqlens_k' are required"),
    ({"max_seqlen_q": -1}, ValueError, "'max_seqlen_q'"),
    ({"max_seqlen_k": 2.5}, TypeError, "argument 'max_seqlen_k' must be an int"),
    ({"max_seqlen_q": 2**40}, ValueError, r"'max_seqlen_q'.*2\^30"),  # the core's limit, in the fake op too
    ({"q": meta(2, 15, 8, 128)}, ValueError, r"argument 'q' has shape \[2, 15, 8, 128\]; expected \[total_tokens"),
    ({"k": meta(40, 3, 128), "v": meta(40, 3, 128)}, ValueError, "argument 'k' has 3 heads"),
    ({"v": meta(41, 2, 128)}, ValueError, "argument 'v' has shape"),
    ({"dropout_p": 0.5}, NotImplementedError, "dropout_p"),
]


@pytest.mark.parametrize("overrides,exc,match", VARLEN_BAD_ARGS)
def test_varlen_argument_errors(overrides, exc, match):
    q, k, v = packed()
    args = {
        "q": q,
        "k": k,
        "v": v,
        "cu_seqlens_q": cu(3),
        "cu_seqlens_k": cu(3),
        "max_seqlen_q": 10,
        "max_seqlen_k": 20,
    }
    args.update(overrides)
    with pytest.raises(exc, match=match):
        fa_varlen(**args)


def test_cpu_tensors_raise_value_error_naming_the_argument():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="argument 'q' is on cpu"):
        fa(q, q, q)


# ---- turbo.modules.TurboAttention ------------------------------------------------------------


@pytest.mark.parametrize(
    "layout,shape",
    [("bshd", (2, 16, 8, 64)), ("sbhd", (16, 2, 8, 64)), ("bhsd", (2, 8, 16, 64))],
)
def test_module_layouts_on_meta(layout, shape):
    m = turbo.modules.TurboAttention(causal=True, layout=layout, learnable_sink=True, num_heads=8, device="meta")
    assert m.sinks.shape == (8,) and m.sinks.dtype == torch.float32
    q = meta(*shape, grad=True)
    out = m(q, q, q)
    assert out.shape == shape
    out.sum().backward()
    assert m.sinks.grad.shape == (8,) and q.grad.shape == shape


def test_module_packed_and_return_lse():
    m = turbo.modules.TurboAttention(causal=True, return_lse=True, layout="thd")
    q, k, v = packed()
    out, lse = m(q, k, v, cu_seqlens_q=cu(3), cu_seqlens_k=cu(3), max_seqlen_q=10, max_seqlen_k=20)
    assert out.shape == (30, 8, 128) and lse.shape == (8, 30)
    with pytest.raises(ValueError, match="layout 'thd'"):
        m(q, k, v)


def test_module_keeps_the_original_positional_arguments():
    m = turbo.modules.TurboAttention(0.0, 0.125, True, (4, 0))
    assert m.softmax_scale == 0.125 and m.causal and m.window_size == (4, 0)
    q = meta(2, 16, 8, 64)
    assert m(q, q, q).shape == q.shape
    with pytest.raises(TypeError, match="fp8_config"):
        turbo.modules.TurboAttention(fp8_config=object())
    with pytest.raises(NotImplementedError, match="context parallelism"):
        turbo.modules.TurboAttention(ulysses_group=object(), layout="thd")
    with pytest.raises(TypeError, match="ulysses_group"):
        turbo.modules.TurboAttention(ulysses_group=object())(q, q, q)
    with pytest.raises(ValueError, match="argument 'layout'"):
        turbo.modules.TurboAttention(layout="bsd")
    with pytest.raises(ValueError, match="num_heads"):
        turbo.modules.TurboAttention(learnable_sink=True)


def test_module_dropout_applies_in_training_only():
    m = turbo.modules.TurboAttention(0.1, causal=True)
    q = meta(2, 16, 8, 64)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        m(q, q, q)  # training mode: dropout asked for, and not implemented
    assert m.eval()(q, q, q).shape == q.shape  # eval mode: no dropout, as nn.Dropout


def test_module_compiles_without_graph_break():
    m = turbo.modules.TurboAttention(causal=True, layout="sbhd", learnable_sink=True, num_heads=8, device="meta")
    q = meta(16, 2, 8, 64, grad=True)
    out = torch.compile(m, fullgraph=True, backend="aot_eager")(q, q, q)
    out.sum().backward()
    assert out.shape == q.shape and m.sinks.grad.shape == (8,)


# ---- transformers: attn_implementation="primus_turbo" ----------------------------------------


def test_register_hf_attention_without_transformers(monkeypatch):
    from primus_turbo.pytorch.integrations import hf

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(ImportError, match="transformers >= 4.48"):
        hf.register_hf_attention()


def test_register_hf_attention():
    transformers = pytest.importorskip("transformers")
    from primus_turbo.pytorch.integrations.hf import primus_turbo_attention_forward, register_hf_attention

    assert register_hf_attention() == "primus_turbo"
    assert transformers.AttentionInterface._global_mapping["primus_turbo"] is primus_turbo_attention_forward


def test_hf_attention_function_on_meta():
    from primus_turbo.pytorch.integrations.hf import primus_turbo_attention_forward

    module = SimpleNamespace(is_causal=True, sinks=meta(8))  # GPT-OSS keeps bf16 sinks
    q, k = meta(2, 8, 16, 64), meta(2, 2, 16, 64)  # transformers' [B, H, S, D]
    out, weights = primus_turbo_attention_forward(module, q, k, k, None, scaling=0.125, sliding_window=4)
    assert out.shape == (2, 16, 8, 64) and weights is None
    with pytest.raises(NotImplementedError, match="dropout"):
        primus_turbo_attention_forward(module, q, k, k, None, dropout=0.1)
    with pytest.raises(NotImplementedError, match="softcap"):
        primus_turbo_attention_forward(module, q, k, k, None, softcap=30.0)
    with pytest.raises(NotImplementedError, match="2-D padding mask"):
        primus_turbo_attention_forward(module, q, k, k, meta(2, 1, 16, 16))
    # Packed offsets need a batch of one row and both of them; masks must fit the batch.
    offs = torch.tensor([0, 8, 16], dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="batch of 2"):
        primus_turbo_attention_forward(module, q, k, k, None, cu_seq_lens_q=offs, cu_seq_lens_k=offs)
    with pytest.raises(ValueError, match="both cu_seq_lens_q and cu_seq_lens_k"):
        primus_turbo_attention_forward(module, q, k, k, None, cu_seq_lens_q=offs)
    with pytest.raises(ValueError, match="'attention_mask' has shape"):
        primus_turbo_attention_forward(module, q, k, k, torch.ones(3, 16, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="'sliding_window'"):
        primus_turbo_attention_forward(module, q, k, k, None, sliding_window=-1)
    with pytest.raises(TypeError, match="argument 'query'"):
        primus_turbo_attention_forward(module, [1.0], k, k, None)


def test_numpy_scalars_are_numbers():
    np = pytest.importorskip("numpy")

    q, k, v = qkv()
    assert fa(q, k, v, dropout_p=np.float32(0.0), softmax_scale=0.1).shape == q.shape


def test_turbo_attention_module_argument_errors():
    with pytest.raises(TypeError, match="argument 'window_size' must be a pair"):
        turbo.modules.TurboAttention(window_size=5)
    with pytest.raises(ValueError, match="num_heads"):
        turbo.modules.TurboAttention(learnable_sink=True, num_heads=True)
    with pytest.raises(TypeError, match="argument 'dtype'"):
        turbo.modules.TurboAttention(learnable_sink=True, num_heads=8, dtype=torch.int32)
    attn = turbo.modules.TurboAttention(layout="bhsd")
    with pytest.raises(ValueError, match="argument 'q' must be a 4-D tensor"):
        attn(meta(8, 16), meta(8, 16), meta(8, 16))
    with pytest.raises(ValueError, match="argument 'k' must be a 4-D tensor"):
        attn(meta(2, 8, 16, 64), [1.0], meta(2, 2, 16, 64))


@pytest.mark.parametrize("model", ["llama", "mistral_window", "gpt_oss_sinks", "packed"])
def test_hf_plumbing_against_eager_on_cpu(monkeypatch, model):
    """Padding masks, sliding windows, sinks and packed rows reach the op as transformers' eager
    attention applies them: the kernels are replaced by the float32 reference, on the CPU."""
    transformers = pytest.importorskip("transformers")
    from attention_reference import reference_flash_attn_func, reference_flash_attn_varlen_func

    from primus_turbo.pytorch.integrations import hf

    monkeypatch.setattr(hf, "flash_attn_func", reference_flash_attn_func)
    monkeypatch.setattr(hf, "flash_attn_varlen_func", reference_flash_attn_varlen_func)
    hf.register_hf_attention()
    small = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 128}
    if model in ("llama", "packed"):
        config = transformers.LlamaConfig(**small, **heads)
    elif model == "mistral_window":
        config = transformers.MistralConfig(**small, **heads, sliding_window=8)
    else:
        extra = {"sliding_window": 8, "num_local_experts": 4, "num_experts_per_tok": 2}
        config = transformers.GptOssConfig(
            **small, **heads, **extra, layer_types=["sliding_attention", "full_attention"]
        )
    torch.manual_seed(0)
    ours = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="primus_turbo").eval()
    ids = torch.randint(0, 128, (2, 40))
    with torch.no_grad():
        if model == "packed":  # one row holding sequences of 15 and 25 tokens (positions restart at 0)
            pos = torch.cat([torch.arange(15), torch.arange(25)])[None]
            got = ours(input_ids=ids[:1], position_ids=pos).logits
            want = torch.cat([ours(input_ids=ids[:1, :15]).logits, ours(input_ids=ids[:1, 15:]).logits], 1)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            return
        eager = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        eager.load_state_dict(ours.state_dict())
        mask = torch.ones_like(ids)
        mask[1, :13] = 0  # left padding
        for m in (None, mask):
            keep = slice(None) if m is None else m.bool()
            got, want = ours(input_ids=ids, attention_mask=m).logits, eager(input_ids=ids, attention_mask=m).logits
            torch.testing.assert_close(got[keep], want[keep], rtol=1e-4, atol=1e-4)


def test_attention_backend_setting_reaches_the_native_op_and_others_are_refused(monkeypatch):
    from primus_turbo.pytorch.core.backend import GlobalBackendManager
    from primus_turbo.pytorch.ops import attention

    seen = []
    real = attention._fwd_op
    monkeypatch.setattr(attention, "_fwd_op", lambda *a: seen.append(a[-1]) or real(*a))
    q = torch.randn(1, 4, 2, 64, device="meta", dtype=torch.bfloat16)
    try:
        for setting, tune, code in ((None, False, 0), ("TURBO", False, 4), ("CUDNN", False, 3), (None, True, 0)):
            GlobalBackendManager.set_attn_backend(setting, auto_tune=tune)
            assert turbo.ops.flash_attn_func(q, q, q).shape == (1, 4, 2, 64)
            assert seen[-1] == code, setting
        with pytest.raises(ValueError, match="CUBLASLT is not an attention backend"):
            GlobalBackendManager.set_attn_backend("CUBLASLT")
        GlobalBackendManager.set_attn_backend("CK")  # the original's attention kernel: ours here
        turbo.ops.flash_attn_func(q, q, q)
        assert seen[-1] == 4
        GlobalBackendManager.set_attn_backend(None)
        monkeypatch.setenv("PRIMUS_TURBO_ATTN_BACKEND", "CUBLASLT")
        with pytest.raises(NotImplementedError, match="attention backend CUBLASLT"):
            turbo.ops.flash_attn_func(q, q, q)
        monkeypatch.setenv("PRIMUS_TURBO_ATTN_BACKEND", "cudnn")
        turbo.ops.flash_attn_func(q, q, q)
        assert seen[-1] == 3
    finally:
        GlobalBackendManager.set_attn_backend(None)


def test_forced_backend_reaches_the_traced_graph():
    from primus_turbo.pytorch.core.backend import GlobalBackendManager

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm.graph)
        return gm.forward

    q = torch.randn(1, 4, 2, 64, device="meta", dtype=torch.bfloat16)
    GlobalBackendManager.set_attn_backend("CUDNN")
    try:
        torch._dynamo.reset()
        torch.compile(lambda x: turbo.ops.flash_attn_func(x, x, x, causal=True), backend=capture, fullgraph=True)(q)
    finally:
        GlobalBackendManager.set_attn_backend(None)
        torch._dynamo.reset()
    calls = [n for g in graphs for n in g.nodes if "attention_fwd" in str(n.target)]
    assert calls and calls[0].args[-1] == 3, [n.args for n in calls]  # pt_backend CUDNN


def test_backward_op_checks_its_saved_tensors():
    q, k, v = qkv()
    out, lse = torch.ops.primus_turbo.attention_fwd(q, k, v, None, None, None, 16, 16, 0.1, -1, -1, 0)
    args = (None, None, None, 16, 16, 0.1, -1, -1, 0, False)
    with pytest.raises(ValueError, match="argument 'dout' has shape"):
        torch.ops.primus_turbo.attention_bwd(out[:, :8], q, k, v, out, lse, *args)
    with pytest.raises(ValueError, match="argument 'lse' has shape"):
        torch.ops.primus_turbo.attention_bwd(out, q, k, v, out, lse[:, :4], *args)
    dq, dk, dv, _ = torch.ops.primus_turbo.attention_bwd(out, q, k, v, out, lse, *args)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


# ---- FP8 attention (flash_attn_fp8_func / flash_attn_varlen_fp8_func) ----------------------------

fa_fp8 = turbo.ops.flash_attn_fp8_func
fa_varlen_fp8 = turbo.ops.flash_attn_varlen_fp8_func


def _blockwise(block=64, **kwargs):
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity

    return Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=block, **kwargs)


@pytest.mark.parametrize("d,dv", [(64, 64), (96, 96), (128, 128), (192, 128)])
def test_fp8_shapes_forward_and_backward_on_meta(d, dv):
    q, k, v = qkv(sq=33, sk=70, d=d, dv=dv, grad=True)
    out, lse = fa_fp8(q, k, v, causal=True, return_lse=True, fp8_config=_blockwise(128))
    assert out.shape == (2, 33, 8, dv) and lse.shape == (2, 8, 33)
    dq, dk, dv_ = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
    assert dq.shape == q.shape and dk.shape == k.shape and dv_.shape == v.shape
    q, k, v = packed(d=d, dv=dv)
    out, lse = fa_varlen_fp8(q, k, v, cu(4), cu(4), 20, 20, return_lse=True)
    assert out.shape == (30, 8, dv) and lse.shape == (8, 30)


def test_fp8_registered_as_custom_op():
    schema = str(torch.ops.primus_turbo.attention_fp8_fwd.default._schema)
    assert "int scale_rows, bool dequantized) -> (Tensor, Tensor, Tensor, Tensor, Tensor)" in schema
    schema = str(torch.ops.primus_turbo.attention_fp8_bwd.default._schema)
    assert "int window_left, int window_right) -> (Tensor, Tensor, Tensor, Tensor)" in schema


def test_fp8_backward_op_refuses_head_dims_it_lacks():
    """MLA's 192/128 takes the 16-bit backward (the autograd function picks it); the FP8 backward
    op itself names its head dims."""
    q, k, v = qkv(d=192, dv=128)
    out = torch.empty(2, 16, 8, 128, device="meta", dtype=torch.bfloat16)
    lse = torch.empty(2, 8, 16, device="meta")
    with pytest.raises(NotImplementedError, match="FP8 attention backward supports head dims 64, 96 and 128"):
        torch.ops.primus_turbo.attention_fp8_bwd(out, q, k, v, out, lse, None, None, None, 0, 0, 0.1, -1, -1)


def test_fp8_backward_choice(monkeypatch):
    from primus_turbo.pytorch.ops import attention as attn
    from primus_turbo.pytorch.ops import attention_fp8 as fp8

    q, k, v = qkv()
    monkeypatch.setattr(fp8, "_FP8_BWD", False)  # the default: the 16-bit backward
    assert not fp8.fp8_backward(q, v, 0)
    monkeypatch.setattr(fp8, "_FP8_BWD", True)  # PRIMUS_TURBO_ATTN_FP8_BWD=1
    assert fp8.fp8_backward(q, v, 0) and fp8.fp8_backward(q, v, 4)
    assert not fp8.fp8_backward(q, v, attn.BACKEND_CUDNN)  # a forced CUDNN keeps cuDNN's backward
    q, k, v = qkv(d=192, dv=128)
    assert not fp8.fp8_backward(q, v, 0)


@pytest.mark.parametrize(
    "cfg,exc,match",
    [
        ("tensorwise", ValueError, "granularity TENSORWISE"),
        ("e5m2", ValueError, "E5M2"),
        ("block32", ValueError, "block_size=32"),
        ("dict", TypeError, "Float8QuantConfig"),
    ],
)
def test_fp8_config_errors_name_the_argument(cfg, exc, match):
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format

    configs = {
        "tensorwise": lambda: Float8QuantConfig(),
        "e5m2": lambda: _blockwise(format=Format.E5M2),
        "block32": lambda: _blockwise(32),
        "dict": lambda: {"block_size": 64},
    }
    with pytest.raises(exc, match=match) as info:
        fa_fp8(*qkv(), fp8_config=configs[cfg]())
    assert "fp8_config" in str(info.value)


@pytest.mark.parametrize("d,dv", [(256, 256), (192, 192), (32, 32)])
def test_fp8_head_dims_it_lacks_raise_not_implemented(d, dv):
    with pytest.raises(NotImplementedError, match=r"flash_attn_fp8 forward: FP8 attention supports head dims 64, 96"):
        fa_fp8(*qkv(d=d, dv=dv))


def test_fp8_messages_name_the_fp8_op():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="flash_attn_fp8 forward: argument 'k' has dtype"):
        fa_fp8(q, k.float(), v)


def test_fp8_shares_the_16bit_argument_checks():
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match="dropout"):
        fa_fp8(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="heads"):
        fa_fp8(q, meta(2, 16, 3, 128), meta(2, 16, 3, 128))
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        fa_varlen_fp8(*packed(), None, cu(4), 20, 20)


def test_fp8_torch_compile_traces_without_graph_break():
    def fn(q, k, v):
        return fa_fp8(q, k, v, causal=True, fp8_config=_blockwise(128)) * 2

    q, k, v = qkv(grad=True)
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    assert out.shape == (2, 16, 8, 128)
    out.sum().backward()
    assert q.grad.shape == q.shape


@pytest.mark.parametrize("layout,shape", [("sbhd", (16, 2, 8, 64)), ("bhsd", (2, 8, 16, 64))])
def test_module_fp8_config_runs_fp8_attention_on_meta(layout, shape, monkeypatch):
    import primus_turbo.pytorch.modules.attention as mod

    calls = []
    real = mod.flash_attn_fp8_func
    monkeypatch.setattr(mod, "flash_attn_fp8_func", lambda *a, **kw: calls.append(kw["fp8_config"]) or real(*a, **kw))
    cfg = _blockwise(128)
    m = turbo.modules.TurboAttention(
        causal=True, fp8_config=cfg, layout=layout, learnable_sink=True, num_heads=8, device="meta"
    )
    q = meta(*shape, grad=True)
    out = m(q, q, q)
    assert out.shape == q.shape and calls == [cfg]
    out.sum().backward()
    assert q.grad.shape == q.shape


# ---- autotune between TURBO and CUDNN ------------------------------------------------------------


def test_autotune_setting_reaches_the_attention_ops(monkeypatch):
    from primus_turbo.pytorch.core.backend import GlobalBackendManager
    from primus_turbo.pytorch.ops import attention as attn

    try:
        GlobalBackendManager.set_attn_backend(auto_tune=True)
        assert attn.requested_backend_code() == attn.AUTOTUNE
        assert attn.backend_code() == 0  # callers that do not measure leave the choice to the core
        q, k, v = qkv(grad=True)
        assert fa(q, k, v, causal=True).shape == q.shape  # meta tensors: nothing measured
        GlobalBackendManager.set_attn_backend("TURBO")
        assert attn.requested_backend_code() == 4
        GlobalBackendManager.set_attn_backend(None)
        GlobalBackendManager.set_auto_tune(True)  # the global switch, with no attention backend set
        assert attn.requested_backend_code() == attn.AUTOTUNE
        GlobalBackendManager.set_auto_tune(False)
        monkeypatch.setenv("PRIMUS_TURBO_ATTN_BACKEND", "autotune")
        assert attn.requested_backend_code() == attn.AUTOTUNE
    finally:
        GlobalBackendManager.reset()


def test_autotune_problem_keys_candidates_and_remembered_choice(monkeypatch):
    from primus_turbo.pytorch.core.backend import BackendType
    from primus_turbo.pytorch.ops import attention as attn

    q, k, v = qkv()
    args = (q, k, v, None, None, None, 16, 16, 0.1, -1, 0)
    fwd, train = attn.AttentionProblem(args, False, False), attn.AttentionProblem(args, False, True)
    assert fwd.key() != train.key() and "q[2, 16, 8, 128]" in fwd.key() and "w-1,0" in fwd.key()
    assert train.query(BackendType.CUDNN)[0] and train.query(BackendType.TURBO)[0]
    # The CUDNN candidate runs as the backend unset (code 0: cuDNN first, ours where the core knows
    # ours faster or cuDNN cannot run the direction), so it runs every problem and never loses to the default.
    assert attn._tuned_backend_code(BackendType.CUDNN) == 0 and attn._tuned_backend_code(BackendType.TURBO) == 4
    assert attn.AttentionProblem(args, True, True).query(BackendType.CUDNN)[0]  # deterministic backward
    tq, tk, tv = packed()
    two = attn.AttentionProblem((tq, tk, tv, None, cu(3), cu(3), 10, 20, 0.1, -1, -1), False, True)
    one_cu = cu(3)
    one = attn.AttentionProblem((tq, tk, tv, None, one_cu, one_cu, 10, 20, 0.1, -1, -1), False, True)
    assert "=" in one.key() and "!" in two.key()

    calls = []

    def fake_tune(problem, device, agree=True):
        assert not agree  # attention calls need not line up across ranks: no agreement collectives
        calls.append(problem.key())
        return BackendType.TURBO, -1

    monkeypatch.setattr(attn.autotune, "tune", fake_tune)
    cuda = torch.device("cuda")  # looks like a CUDA tensor to the cheap key (no GPU needed)
    fake = [SimpleNamespace(device=cuda, shape=t.shape, stride=t.stride, dtype=t.dtype, is_contiguous=t.is_contiguous)
            for t in (q, k, v)]
    monkeypatch.setattr(attn, "_tuned", {})
    monkeypatch.setattr(attn, "_measurable", lambda q, cu_q: True)
    call = (*fake, None, None, None, 16, 16, 0.1, -1, 0)
    assert attn._tuned_code(call, False, True) == 4 and attn._tuned_code(call, False, True) == 4
    assert len(calls) == 1  # measured once, then remembered
    monkeypatch.setattr(attn.autotune, "tune", lambda problem, device, agree=True: (BackendType.CUDNN, -1))
    monkeypatch.setattr(attn, "_tuned", {})
    assert attn._tuned_code(call, False, True) == 0  # the CUDNN candidate's code: the unset default's


def test_autotune_measures_nothing_it_cannot(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from primus_turbo.pytorch.ops import attention as attn

    q = meta(2, 16, 8, 64)
    assert not attn._measurable(q, None)  # not on a GPU
    with FakeTensorMode():
        fake = torch.empty(2, 16, 8, 64, device="cuda", dtype=torch.bfloat16)
    assert fake.device.type == "cuda" and not attn._measurable(fake, None)  # a fake CUDA tensor
    monkeypatch.setattr(attn.autotune, "tune", lambda *a, **k: pytest.fail("measured"))
    assert attn._tuned_code((q, q, q, None, None, None, 16, 16, 0.1, -1, -1), False, False) == 0
