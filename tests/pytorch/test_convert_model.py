"""turbo.convert_model: which layers it swaps, that the new modules share the old parameter
tensors (state dict and optimizer state stay valid), and, on a GPU, that the converted model
computes what the original does and trains."""

import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity


class LlamaRMSNorm(nn.Module):
    """Hugging Face's RMSNorm as model code writes it (float32 statistics)."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class GemmaRMSNorm(LlamaRMSNorm):
    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (x * (1.0 + self.weight.float())).to(dtype)


class Block(nn.Module):
    def __init__(self, h=64, f=128):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(h)
        self.q_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=True)
        self.post_attention_layernorm = GemmaRMSNorm(h)
        self.gate_up = nn.Linear(h, 2 * f, bias=False)
        self.down = nn.Linear(f, h, bias=False)
        self.ln = nn.LayerNorm(h)
        self.rms = nn.RMSNorm(h, eps=1e-5)
        self.odd = nn.Linear(h, 20, bias=False)  # N = 20: not an FP8 shape

    def forward(self, x):
        x = x + self.o_proj(self.q_proj(self.input_layernorm(x)))
        g, u = self.gate_up(self.post_attention_layernorm(x)).chunk(2, -1)
        x = x + self.down(torch.nn.functional.silu(g) * u)
        return self.rms(self.ln(x)), self.odd(x)


class TinyModel(nn.Module):
    def __init__(self, h=64, vocab=96):
        super().__init__()
        self.layers = nn.ModuleList([Block(h), Block(h)])
        self.lm_head = nn.Linear(h, vocab, bias=False)

    def forward(self, x):
        for layer in self.layers:
            x, _ = layer(x)
        return self.lm_head(x)


def _params(model):
    return {name: p for name, p in model.named_parameters()}


def test_bf16_conversion_swaps_layers_and_keeps_the_parameter_tensors():
    model = TinyModel()
    before, keys = _params(model), list(model.state_dict())
    assert turbo.convert_model(model) is model
    block = model.layers[0]
    assert type(block.q_proj) is turbo.modules.Linear and type(block.odd) is turbo.modules.Linear
    assert type(block.input_layernorm) is turbo.modules.RMSNorm and not block.input_layernorm.zero_centered_gamma
    assert type(block.post_attention_layernorm) is turbo.modules.RMSNorm
    assert block.post_attention_layernorm.zero_centered_gamma  # Gemma's 1 + weight
    assert type(block.ln) is turbo.modules.LayerNorm and type(block.rms) is turbo.modules.RMSNorm
    assert block.rms.eps == 1e-5 and block.input_layernorm.eps == 1e-6
    assert type(model.lm_head) is nn.Linear  # the output head stays on torch by default
    after = _params(model)
    assert list(model.state_dict()) == keys
    assert all(after[name] is p for name, p in before.items())


def test_fp8_conversion_takes_the_shapes_fp8_can_and_logs_the_rest(caplog):
    model = TinyModel()
    config = Float8QuantConfig(granularity=ScalingGranularity.ROWWISE)
    with caplog.at_level("INFO", logger="primus_turbo"):
        turbo.convert_model(model, fp8_config=config)
    block = model.layers[1]
    assert type(block.q_proj) is turbo.modules.Float8Linear and block.q_proj.config is config
    assert type(block.odd) is turbo.modules.Linear  # N = 20
    assert "layers.1.odd" in caplog.text and "Linear -> Float8Linear" in caplog.text


class FakeRegistry:
    """transformers' AttentionInterface / mask-function registries, without transformers installed."""

    def __init__(self):
        self.registered = {}

    def register(self, name, fn):
        self.registered[name] = fn


def _fake_transformers(monkeypatch):
    attention, masks = FakeRegistry(), FakeRegistry()
    monkeypatch.setitem(sys.modules, "transformers", SimpleNamespace(AttentionInterface=attention))
    monkeypatch.setitem(
        sys.modules, "transformers.masking_utils",
        SimpleNamespace(ALL_MASK_ATTENTION_FUNCTIONS=masks, flash_attention_mask=object()),
    )
    return attention


def _hf_like(setter=None, **config):
    model = TinyModel()
    model.config = SimpleNamespace(_attn_implementation="sdpa", **config)
    if setter is not None:  # transformers >= 4.56
        model.set_attn_implementation = setter
    return model


def test_transformers_models_switch_to_our_attention_when_asked(monkeypatch, caplog):
    from primus_turbo.pytorch.integrations.hf import primus_turbo_attention_forward

    registry = _fake_transformers(monkeypatch)
    kept = _hf_like()
    turbo.convert_model(kept)  # off by default
    assert kept.config._attn_implementation == "sdpa" and not registry.registered
    model = _hf_like()
    with caplog.at_level("INFO", logger="primus_turbo"):
        turbo.convert_model(model, convert_attention=True)
    assert model.config._attn_implementation == "primus_turbo"
    assert registry.registered["primus_turbo"] is primus_turbo_attention_forward
    assert "attention sdpa -> primus_turbo" in caplog.text
    seen = []
    turbo.convert_model(_hf_like(setter=seen.append), convert_attention=True)
    assert seen == ["primus_turbo"]  # transformers' own setter, where it has one
    turbo.convert_model(TinyModel(), convert_attention=True)  # not a transformers model: nothing to switch


def refuse(name):
    raise ValueError("this model does not support the attention interface")


@pytest.mark.parametrize(
    "model,why",
    [
        (lambda: _hf_like(attn_logit_softcapping=50.0), "soft-caps"),
        (lambda: _hf_like(setter=refuse), "does not support the attention interface"),
    ],
    ids=["softcap", "refused"],
)
def test_transformers_attention_kept_where_ours_cannot_run_it(monkeypatch, caplog, model, why):
    _fake_transformers(monkeypatch)
    m = model()
    with caplog.at_level("INFO", logger="primus_turbo"):
        turbo.convert_model(m, convert_attention=True)
    assert m.config._attn_implementation == "sdpa" and "attention kept" in caplog.text and why in caplog.text


def test_transformers_attention_kept_without_transformers(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    model = _hf_like()
    with caplog.at_level("INFO", logger="primus_turbo"):
        turbo.convert_model(model, convert_attention=True)
    assert model.config._attn_implementation == "sdpa" and "attention kept" in caplog.text


def test_filter_and_kinds():
    model = TinyModel()
    turbo.convert_model(model, module_filter_fn=lambda m, fqn: fqn.endswith("q_proj") or fqn == "lm_head")
    assert type(model.lm_head) is turbo.modules.Linear
    assert type(model.layers[0].q_proj) is turbo.modules.Linear and type(model.layers[0].o_proj) is nn.Linear
    model = TinyModel()
    turbo.convert_model(model, convert_linear=False)
    assert type(model.layers[0].q_proj) is nn.Linear and type(model.layers[0].ln) is turbo.modules.LayerNorm
    with pytest.raises(TypeError, match="fp8_config"):
        turbo.convert_model(model, fp8_config="fp8")


def test_training_mode_is_kept_and_shapes_flow_on_meta():
    model = TinyModel().to(device="meta", dtype=torch.bfloat16).eval()
    turbo.convert_model(model)
    assert not model.layers[0].q_proj.training
    x = torch.empty(2, 5, 64, device="meta", dtype=torch.bfloat16)
    assert model(x).shape == (2, 5, 96)


class Qwen3NextRMSNorm(GemmaRMSNorm):
    """A zero-centered norm whose class name does not say so."""


def test_zero_centered_norms_are_recognized_by_their_output():
    for cls, centered in ((Qwen3NextRMSNorm, True), (GemmaRMSNorm, True), (LlamaRMSNorm, False)):
        holder = nn.Sequential(cls(64))
        with torch.no_grad():
            holder[0].weight.uniform_(-0.5, 0.5)
        turbo.convert_model(holder)
        assert type(holder[0]) is turbo.modules.RMSNorm and holder[0].zero_centered_gamma is centered, cls.__name__


def test_converting_twice_shared_modules_hooks_and_odd_linears():
    model = TinyModel()
    shared = model.layers[0].q_proj
    model.layers[1].q_proj = shared  # one module under two parents
    calls = []
    shared.register_forward_hook(lambda m, i, o: calls.append(1))
    wn = nn.Linear(64, 64)
    torch.nn.utils.weight_norm(wn)  # weight is computed by a hook, not a Parameter
    model.layers[1].odd = wn
    turbo.convert_model(model)
    assert model.layers[0].q_proj is model.layers[1].q_proj and type(shared) is nn.Linear
    assert type(model.layers[1].odd) is nn.Linear  # left as it is
    gemma = model.layers[0].post_attention_layernorm
    turbo.convert_model(model)  # a second call converts nothing again
    assert model.layers[0].post_attention_layernorm is gemma and gemma.zero_centered_gamma
    assert model.layers[0].q_proj._forward_hooks, "the old module's hooks run on the new one"


def test_linear_from_float_shares_parameters():
    lin = nn.Linear(32, 16)
    new = turbo.modules.Linear.from_float(lin)
    assert new.weight is lin.weight and new.bias is lin.bias
    with pytest.raises(TypeError, match="Linear.from_float: expected an nn.Linear"):
        turbo.modules.Linear.from_float(nn.LayerNorm(4))


@pytest.mark.gpu
def test_converted_model_matches_and_trains():
    torch.manual_seed(0)
    ref = TinyModel().to(device="cuda", dtype=torch.bfloat16)
    model = TinyModel().to(device="cuda", dtype=torch.bfloat16)
    model.load_state_dict(ref.state_dict())
    turbo.convert_model(model)
    x = torch.randn(4, 33, 64, device="cuda", dtype=torch.bfloat16)
    from turbo_test_utils import snr_db

    with torch.no_grad():
        assert snr_db(model(x).float(), ref(x).float()) > 30
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
