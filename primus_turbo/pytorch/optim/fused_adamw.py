"""turbo.optim.FusedAdamW: torch.optim.AdamW's update in one pass over each parameter's tensors,
one native call per step for all parameters of a group (csrc/bindings/torch/optim_ops.cpp,
kernels/optim/adamw.cuh).

torch's default AdamW (``foreach``) runs about ten elementwise passes over the parameters, the
moments and the gradients; this reads each of them once and writes the parameter and the moments
once, in float32 arithmetic with one rounding per stored value. Its state (``step``, ``exp_avg``,
``exp_avg_sq``) and param-group keys are torch.optim.AdamW's, so state dicts load either way.

FP8 layers: a :class:`~primus_turbo.pytorch.modules.Float8Linear` or
:class:`~primus_turbo.pytorch.modules.GroupedLinear` built with ``cache_quantized_weight=True``
gets its weight's FP8 copy from the step itself, and reuses it until the next step:
- BLOCKWISE (128 x 128 weight blocks): the update writes the copy from the values it holds (one
  scale per tile of the pass), bit for bit the quantizer's, so the weight is not read again, and
  its transposed copy (each expert's for a GroupedLinear stack), which the dgrad reads;
- TENSORWISE: the update reports max |weight| as it stores the weight, and the quantization takes
  that maximum instead of an amax pass over the weight.
Other granularities keep quantizing the weight at its first use in the step.
"""

from typing import Dict, List, Optional

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.ops import quantization as _quant

__all__ = ["FusedAdamW"]


def _fused_adamw_fake(params, grads, exp_avgs, exp_avg_sqs, amax, lr, beta1, beta2, eps, weight_decay, step):
    return None


library.register_fake("fused_adamw_", _fused_adamw_fake)
_native_step = native.ops.fused_adamw_.default


def _fused_adamw_fp8_blocks_fake(params, grads, exp_avgs, exp_avg_sqs, qdata, scale_inv, qdata_t, lr, beta1, beta2,
                                 eps, weight_decay, step):
    return None


library.register_fake("fused_adamw_fp8_blocks_", _fused_adamw_fp8_blocks_fake)
_native_step_fp8_blocks = native.ops.fused_adamw_fp8_blocks_.default

_UNSUPPORTED = ("amsgrad", "maximize", "capturable", "differentiable")


def _refuse_unsupported(options: dict) -> None:
    """NotImplementedError for an option of torch's AdamW this one does not implement, set True in
    ``options`` (the constructor's arguments, or a param group loaded from another optimizer)."""
    for name in _UNSUPPORTED:
        if options.get(name, False):
            raise NotImplementedError(f"FusedAdamW: {name}=True is not supported")


def adamw_reference(p, g, m, v, step: int, lr, beta1, beta2, eps, weight_decay) -> None:
    """The update in torch ops, float32 arithmetic, in place (CPU tensors, and the tests' reference)."""
    pf, gf, mf, vf = p.float(), g.float(), m.float(), v.float()
    pf.mul_(1 - lr * weight_decay)
    mf.lerp_(gf, 1 - beta1)
    vf.mul_(beta2).addcmul_(gf, gf, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    denom = (vf.sqrt() / bias_correction2_sqrt).add_(eps)
    pf.addcdiv_(mf, denom, value=-lr / bias_correction1)
    for dst, src in ((p, pf), (m, mf), (v, vf)):
        if dst is not src:
            dst.copy_(src)


def _block_scale_shape(p: torch.Tensor) -> tuple:
    """The 128 x 128 block scales of p seen as [rows, cols] (cols its last dim), as the quantizer's
    2-D blocks lay them out."""
    cols = p.shape[-1]
    rows = p.numel() // cols if cols else 0
    return _quant._scale_shape(_quant._BLOCKWISE, 128, rows, cols, True, False, True)


def _transposed_target(p: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """Where the step writes a weight's transposed FP8 copy, the dgrad's operand: ``[N, K]`` ->
    ``[K, N]``, or per expert ``[G, N, K]`` -> ``[G, K, N]`` (N a multiple of 128); else an empty
    tensor (none)."""
    if p.dim() == 2 or (p.dim() == 3 and p.shape[1] % 128 == 0):
        return p.new_empty((*p.shape[:-2], p.shape[-1], p.shape[-2]), dtype=fmt)
    return p.new_empty((0,), dtype=fmt)


class FusedAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, as :class:`torch.optim.AdamW`) fused into one pass a parameter.

    Args:
        params, lr, betas, eps, weight_decay: as :class:`torch.optim.AdamW` (``lr`` a float).
        amsgrad, maximize, capturable, differentiable: only False (``NotImplementedError`` otherwise).
        foreach, fused: accepted for drop-in use and ignored (this is the fused implementation).
        fp8_weights: give the FP8 layers with a weight cache (BLOCKWISE, TENSORWISE) their
            weight's FP8 copy from the step (module docstring). Default True.

    Parameters of any float dtype (float32, float16, bfloat16; the gradient in the parameter's
    dtype), the moments in the parameter's dtype as torch keeps them (or float32 when loaded so).
    Contiguous CUDA parameters take the fused kernel; others (CPU, strided views) the same
    arithmetic in torch ops. Sparse gradients raise.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        amsgrad: bool = False,
        maximize: bool = False,
        foreach: Optional[bool] = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        fp8_weights: bool = True,
    ):
        if isinstance(lr, torch.Tensor):
            raise TypeError("FusedAdamW: 'lr' must be a float (a tensor lr is for capturable optimizers)")
        lr, eps, weight_decay = float(lr), float(eps), float(weight_decay)
        if not lr >= 0.0:
            raise ValueError(f"FusedAdamW: invalid learning rate {lr}")
        if not eps >= 0.0:
            raise ValueError(f"FusedAdamW: invalid epsilon {eps}")
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"FusedAdamW: 'betas' must be a pair, got {betas!r}")
        for i, b in enumerate(betas):
            if not 0.0 <= float(b) < 1.0:
                raise ValueError(f"FusedAdamW: invalid beta parameter at index {i}: {b}")
        if not weight_decay >= 0.0:
            raise ValueError(f"FusedAdamW: invalid weight_decay value {weight_decay}")
        flags = dict(amsgrad=amsgrad, maximize=maximize, capturable=capturable, differentiable=differentiable)
        _refuse_unsupported(flags)
        defaults = dict(lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps, weight_decay=weight_decay,
                        foreach=foreach, fused=fused, **flags)
        super().__init__(params, defaults)
        self.fp8_weights = bool(fp8_weights)

    def _fp8_layers(self) -> Dict[int, tuple]:
        """id(weight) -> (FP8 layer with a weight cache that owns it, its step_refresh kind)."""
        if not self.fp8_weights:
            return {}
        from primus_turbo.pytorch.modules import _weight_cache

        found = {}
        for layer in list(_weight_cache._CACHING_LAYERS):
            kind = layer.step_refresh()
            if kind is not None:
                found[id(layer.weight)] = (layer, kind)
        return found

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        fp8_layers = self._fp8_layers()
        for group in self.param_groups:
            _refuse_unsupported(group)  # a group loaded from another optimizer's state dict
            batches: Dict[tuple, List[list]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if g.is_sparse:
                    raise RuntimeError("FusedAdamW does not support sparse gradients")
                if g.dtype != p.dtype:
                    raise TypeError(f"FusedAdamW: a gradient has dtype {g.dtype}; expected its parameter's {p.dtype}")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                elif state["step"].device.type != "cpu":  # loaded from a capturable optimizer
                    state["step"] = state["step"].cpu()
                state["step"] += 1
                step = int(state["step"].item())  # a CPU tensor: no device sync
                m, v = state["exp_avg"], state["exp_avg_sq"]
                layer, kind = fp8_layers.get(id(p), (None, None))
                # The kernel updates contiguous tensors in place; anything else takes torch ops.
                native_ok = p.is_cuda and p.is_contiguous() and m.is_contiguous() and v.is_contiguous()
                if not native_ok:
                    kind = None
                # Block-quantized weights take their own launches (one FP8 format each).
                fmt = layer._fp8_dtype() if kind == "blocks" else None
                key = (p.device if native_ok else None, p.dtype, m.dtype, step, fmt)
                lists = batches.setdefault(key, [[], [], [], [], []])
                for lst, t in zip(lists, (p, g, m, v, (layer, kind))):
                    lst.append(t)
            beta1, beta2 = group["betas"]
            hyper = tuple(map(float, (group["lr"], beta1, beta2, group["eps"], group["weight_decay"])))
            for (device, _, _, step, fmt), (ps, gs, ms, vs, layers) in batches.items():
                if device is None:  # CPU, or not contiguous
                    for p, g, m, v in zip(ps, gs, ms, vs):
                        adamw_reference(p, g, m, v, step, *hyper)
                    continue
                try:
                    if fmt is not None:
                        qs = [torch.empty_like(p, dtype=fmt) for p in ps]
                        scales = [p.new_empty(_block_scale_shape(p), dtype=torch.float32) for p in ps]
                        qts = [_transposed_target(p, fmt) for p in ps]
                        _native_step_fp8_blocks(ps, gs, ms, vs, qs, scales, qts, *hyper, step)
                        for (layer, _), q, sc, qt in zip(layers, qs, scales, qts):
                            layer.refresh_weight_cache_blocks(q, sc, qt)
                        continue
                    amax = None
                    if any(kind == "amax" for _, kind in layers):
                        amax = torch.empty(len(ps), dtype=torch.float32, device=device)
                    _native_step(ps, gs, ms, vs, amax, *hyper, step)
                except RuntimeError as e:
                    raise native.translate(e) from None
                for i, (layer, kind) in enumerate(layers):
                    if kind == "amax":
                        layer.refresh_weight_cache(amax[i : i + 1])
        return loss
