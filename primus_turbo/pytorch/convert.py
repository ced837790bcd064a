"""``primus_turbo.pytorch.convert_model``: one call that puts a model's layers on this library's
modules, in place and sharing the same parameter tensors (state dict, optimizer state and
checkpoints stay valid, nothing is copied)."""

import importlib
import logging
from collections import Counter
from typing import Callable, Optional

import torch
from torch import nn

from primus_turbo.pytorch.core.low_precision import Float8QuantConfig
from primus_turbo.pytorch.modules import Float8Linear, LayerNorm, Linear, RMSNorm

__all__ = ["convert_model"]

log = logging.getLogger("primus_turbo")

# Output projections left in high precision and on torch by default: Hugging Face's and Megatron's
# vocabulary head, TorchTitan's final projection.
DEFAULT_SKIP = ("lm_head", "output_layer", "output")


def _fp8_shape_ok(linear: nn.Module) -> bool:
    # FP8 GEMMs read 16-byte rows along K (in_features) and, in the backward, along N (out_features).
    return linear.in_features % 16 == 0 and linear.out_features % 16 == 0


# Model code's RMSNorm classes that apply ``1 + weight`` (weights initialized to zero).
_ZERO_CENTERED_PREFIXES = ("Gemma", "Qwen3Next")


def _applies_one_plus_weight(module: nn.Module, weight: torch.Tensor, eps: float, by_name: bool) -> bool:
    """Whether an RMSNorm class scales by ``1 + weight``: its output on a probe row against both
    forms (the class name decides where the module cannot run: meta tensors)."""
    if weight.device.type == "meta":
        return by_name
    probe = torch.linspace(-1.0, 1.0, weight.shape[0], device=weight.device, dtype=torch.float32)[None]
    normed = probe * torch.rsqrt(probe.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.detach().float()
    with torch.no_grad():
        out = module(probe.to(weight.dtype)).float()
    plain, centered = (out - normed * w).abs().max(), (out - normed * (1.0 + w)).abs().max()
    return bool(centered < plain)


def _hf_rmsnorm(module: nn.Module) -> Optional[RMSNorm]:
    """Model code's RMSNorm classes (Hugging Face's LlamaRMSNorm, Qwen2RMSNorm, MistralRMSNorm,
    GemmaRMSNorm, ...): a 1-D ``weight`` and ``variance_epsilon`` (or ``eps``). Whether the class
    applies ``weight`` or ``1 + weight`` is read off its output on a probe row."""
    name = type(module).__name__
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not name.endswith("RMSNorm") or not isinstance(weight, nn.Parameter) or weight.dim() != 1 or eps is None:
        return None
    zero_centered = _applies_one_plus_weight(module, weight, float(eps), name.startswith(_ZERO_CENTERED_PREFIXES))
    new = _on_meta(RMSNorm, weight.shape[0], eps=float(eps), zero_centered_gamma=zero_centered)
    new.weight = weight
    return new


def _on_meta(cls, *args, **kwargs):
    """A module built without allocating (its parameters are replaced by the old module's)."""
    with torch.device("meta"):
        return cls(*args, **kwargs)


# This library's modules: never converted again (a second convert_model call is a no-op for them).
_OURS = (Linear, Float8Linear, RMSNorm, LayerNorm)


def _norm(module: nn.Module) -> Optional[nn.Module]:
    if isinstance(module, _OURS):
        return None
    if type(module) is torch.nn.LayerNorm:
        new = _on_meta(LayerNorm, module.normalized_shape, eps=module.eps,
                       elementwise_affine=module.elementwise_affine, bias=module.bias is not None)
        new.weight, new.bias = module.weight, module.bias
        return new
    if hasattr(torch.nn, "RMSNorm") and type(module) is torch.nn.RMSNorm:
        new = _on_meta(RMSNorm, module.normalized_shape, eps=module.eps, elementwise_affine=module.elementwise_affine)
        new.weight = module.weight
        return new
    return _hf_rmsnorm(module)


def _hf_attention(model: nn.Module) -> Optional[str]:
    """Switches a transformers model to attn_implementation="primus_turbo"; what it did or why it
    kept the model's attention, for the log line (None where the model is not a transformers model
    or already uses ours)."""
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if before is None:
        return None
    from primus_turbo.pytorch.integrations.hf import ATTN_IMPLEMENTATION, register_hf_attention

    if before == ATTN_IMPLEMENTATION:
        return None
    if getattr(config, "attn_logit_softcapping", None):  # Gemma 2: soft-capping, which ours does not do
        return "attention kept (the model soft-caps its logits)"
    try:  # transformers >= 4.53 builds masks per implementation; older ones a 4-D mask ours refuses
        importlib.import_module("transformers.masking_utils")
        name = register_hf_attention()
    except ImportError as e:
        return f"attention kept (needs transformers >= 4.53: {e})"
    setter = getattr(model, "set_attn_implementation", None)  # transformers >= 4.56 checks and propagates
    try:
        if callable(setter):
            setter(name)
        else:
            config._attn_implementation = name
    except (ValueError, TypeError) as e:  # e.g. a model without the attention interface
        return f"attention kept ({e})"
    return f"attention {before} -> {name}"


def _keeps_hooks(old: nn.Module, new: nn.Module) -> None:
    """The new module runs the hooks registered on the old one."""
    for attr in ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks"):
        if getattr(old, attr, None):
            getattr(new, attr).update(getattr(old, attr))


def convert_model(
    model: nn.Module,
    fp8_config: Optional[Float8QuantConfig] = None,
    module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
    convert_linear: bool = True,
    convert_norms: bool = True,
    convert_attention: bool = False,
) -> nn.Module:
    """Swaps, in place, ``torch.nn.Linear`` for ``turbo.modules.Linear`` (or ``Float8Linear`` with
    ``fp8_config``), and ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm`` / Hugging Face's RMSNorm
    classes for ``turbo.modules.LayerNorm`` / ``RMSNorm``. Every new module shares the old one's
    parameter tensors. Returns ``model``.

    Args:
        fp8_config: None keeps bf16/fp16 GEMMs; a :class:`Float8QuantConfig` makes Linear layers
            FP8 where their shape allows (in and out features multiples of 16; the others become
            ``turbo.modules.Linear`` and are listed in the log line).
        module_filter_fn: ``fn(module, fqn) -> bool``; False keeps a module as it is. Default:
            skip the output heads (``lm_head``, ``output_layer``, ``output``).
        convert_linear, convert_norms: which kinds of layer to convert.
        convert_attention: a Hugging Face transformers model (one with ``config._attn_implementation``)
            also switches to ``attn_implementation="primus_turbo"`` (registered on the way). Off by
            default: the model's attention must be one ours runs (no soft-capping, no attention
            dropout in training, head dims of ``turbo.ops.flash_attn_func``); it needs transformers
            >= 4.53, and a model that refuses the switch keeps its attention (the log line says why).

    Mixture-of-experts expert weights are not converted yet (``turbo.modules.GroupedLinear`` needs
    the experts' weights as one [E, N, K] tensor, which model code stores in several layouts).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert_model: model must be a torch.nn.Module, got {type(model).__name__}")
    if fp8_config is not None and not isinstance(fp8_config, Float8QuantConfig):
        raise TypeError(f"convert_model: fp8_config must be a Float8QuantConfig or None, got {type(fp8_config).__name__}")

    def wanted(module, fqn):
        if module_filter_fn is not None:
            return module_filter_fn(module, fqn)
        return fqn.rsplit(".", 1)[-1] not in DEFAULT_SKIP

    counts, kept_bf16 = Counter(), []
    replaced = {}  # id(old module) -> new: a module shared by several parents stays shared
    for parent_name, parent in list(model.named_modules(remove_duplicate=False)):
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            fqn = f"{parent_name}.{name}" if parent_name else name
            if id(child) in replaced:
                setattr(parent, name, replaced[id(child)])
                continue
            new = None
            # Only plain nn.Linear (subclasses have their own forward) with a real weight Parameter
            # (not a parametrization or an old-style weight_norm).
            linear_ok = type(child) is nn.Linear and isinstance(child.__dict__.get("_parameters", {}).get("weight"), nn.Parameter)
            if convert_linear and linear_ok and wanted(child, fqn):
                if fp8_config is not None and _fp8_shape_ok(child):
                    new = Float8Linear.from_float(child, config=fp8_config)
                else:
                    new = Linear.from_float(child)
                    if fp8_config is not None:
                        kept_bf16.append(fqn)
            elif convert_norms and wanted(child, fqn):
                new = _norm(child)
            if new is not None:
                new.train(child.training)
                _keeps_hooks(child, new)
                replaced[id(child)] = new
                setattr(parent, name, new)
                counts[f"{type(child).__name__} -> {type(new).__name__}"] += 1
    attention = _hf_attention(model) if convert_attention else None
    summary = ", ".join(f"{n} {what}" for what, n in sorted(counts.items())) or "nothing"
    extra = f"; not FP8 (shape): {', '.join(kept_bf16)}" if kept_bf16 else ""
    extra += f"; {attention}" if attention else ""
    log.info("convert_model: converted %s%s", summary, extra)
    return model
