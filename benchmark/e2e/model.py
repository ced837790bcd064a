"""The decoder stacks the end-to-end benchmark trains: one model class per architecture whose
layers run on torch ops or, after ``use_turbo(...)``, on ours, with the same parameters either way
(so every variant starts from one state dict).

- Dense (Llama-style): RMSNorm, fused QKV projection, RoPE, causal GQA attention, output
  projection, RMSNorm, SwiGLU MLP.
- MoE (Qwen3-30B-A3B / DeepSeek-V2-Lite dims): the same attention (MLA models as plain attention
  with MLA's head dims, 192 for q/k and 128 for v, without the low-rank compression), then a
  softmax top-k router, token permutation, per-expert SwiGLU (gate/up and down grouped GEMMs) with
  the routing probability folded into the activation, unpermutation, and shared experts where the
  model has them.

torch path: SDPA, torch RoPE and SwiGLU, ``torch._grouped_mm`` experts with argsort / index_add
routing. turbo path: ``turbo.ops.rope``, ``flash_attn_func`` (``flash_attn_fp8_func`` with
``fp8_attention``), ``fused_group_topk_routing_with_aux_score``
(softmax top-k; the k probabilities renormalized as the torch path does), ``swiglu``, ``token_permute``,
``grouped_gemm`` (``grouped_gemm_fp8`` with an FP8 config), ``swiglu_with_probs``,
``token_unpermute``; the Linear and RMSNorm layers become ours through ``turbo.convert_model``.
A dense MLP whose two projections are TENSORWISE ``Float8Linear`` layers runs as one
``turbo.ops.swiglu_mlp_fp8`` call (the SwiGLU kernels hand their amaxes to the quantizations), so
the ``turbo_fp8_tensorwise`` variants measure that fused MLP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rope_tables(seq: int, head_dim: int, device, theta: float = 500000.0):
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    ang = torch.arange(seq, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def torch_rope(x, cos, sin):
    """Rotate-half RoPE of x [B, S, H, D] with float32 tables [S, D/2]."""
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    x1, x2 = x.float().chunk(2, -1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).to(x.dtype)


class Attention(nn.Module):
    """Causal GQA attention with RoPE on q and k (head dims dqk for q/k, dv for v)."""

    def __init__(self, hidden: int, hq: int, hkv: int, dqk: int, dv: int):
        super().__init__()
        self.hq, self.hkv, self.dqk, self.dv = hq, hkv, dqk, dv
        self.splits = [hq * dqk, hkv * dqk, hkv * dv]
        self.qkv = nn.Linear(hidden, sum(self.splits), bias=False)
        self.out = nn.Linear(hq * dv, hidden, bias=False)
        self.turbo = None
        self.fp8_attention = False  # turbo path: flash_attn_fp8_func (q, k, v in FP8 blocks) for the core

    def forward(self, x, cos, sin):
        b, s = x.shape[:2]
        q, k, v = self.qkv(x).split(self.splits, -1)
        q = q.view(b, s, self.hq, self.dqk)
        k = k.view(b, s, self.hkv, self.dqk)
        v = v.view(b, s, self.hkv, self.dv)
        if self.turbo is not None:
            q, k = self.turbo.ops.rope(q, k, cos, sin)
            attend = self.turbo.ops.flash_attn_fp8_func if self.fp8_attention else self.turbo.ops.flash_attn_func
            attn = attend(q, k, v, causal=True)  # [B, S, H, Dv]
        else:
            q, k = torch_rope(q, cos, sin), torch_rope(k, cos, sin)
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
            ).transpose(1, 2)
        return self.out(attn.reshape(b, s, self.hq * self.dv))

    def flops(self, tokens: int, seq: int) -> float:
        """Forward + backward: projections 6 x weights x tokens, causal attention 3.5 x forward."""
        linear = self.qkv.weight.numel() + self.out.weight.numel()
        attn_fwd = 2 * tokens * seq * self.hq * (self.dqk + self.dv) / 2
        return 6 * linear * tokens + 3.5 * attn_fwd


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)
        self.turbo = None

    def forward(self, x):
        fused = self._fused_fp8_config()
        if fused is not None:  # one op: the SwiGLU kernels hand their amaxes to the quantizations
            return self.turbo.ops.swiglu_mlp_fp8(x, self.gate_up.weight_operand(), self.down.weight_operand(), fused)
        h = self.gate_up(x)
        if self.turbo is not None:
            h = self.turbo.ops.swiglu(h)
        else:
            gate, up = h.chunk(2, -1)
            h = F.silu(gate) * up
        return self.down(h)

    def _fused_fp8_config(self):
        """The FP8 config when both projections are TENSORWISE Float8Linear layers without bias (turbo
        path; turbo.ops.swiglu_mlp_fp8 then runs the MLP, quantizing the weights each call or reading
        the layers' per-step weight caches), else None."""
        if self.turbo is None:
            return None
        layers = (self.gate_up, self.down)
        if not all(isinstance(layer, self.turbo.modules.Float8Linear) and layer.bias is None for layer in layers):
            return None
        config = self.gate_up.config
        tensorwise = config.granularity == self.turbo.core.low_precision.ScalingGranularity.TENSORWISE
        return config if tensorwise and self.down.config == config else None

    def flops(self, tokens: int) -> float:
        return 6 * (self.gate_up.weight.numel() + self.down.weight.numel()) * tokens


class Experts(nn.Module):
    """E SwiGLU experts as two weights in nn.Linear layout per expert: gate_up [E, 2I, H] and
    down [E, H, I] (the layout turbo.modules.GroupedLinear and torch._grouped_mm both read)."""

    def __init__(self, num: int, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up = nn.Parameter(torch.randn(num, 2 * intermediate, hidden) * hidden**-0.5)
        self.down = nn.Parameter(torch.randn(num, hidden, intermediate) * intermediate**-0.5)


class MoEMLP(nn.Module):
    """Softmax router, top-k (probabilities renormalized over the k), experts, shared experts."""

    def __init__(self, hidden: int, num_experts: int, topk: int, intermediate: int, num_shared: int):
        super().__init__()
        self.num_experts, self.topk = num_experts, topk
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden, intermediate)
        self.shared = DenseMLP(hidden, num_shared * intermediate) if num_shared else None
        self.turbo = None
        self.fp8_config = None  # turbo path: FP8 grouped GEMMs for the experts
        self.fp8_layers = None  # (gate_up, down) GroupedLinear sharing the experts' weights, when cached
        self.routes = None  # a list: each forward appends its sorted top-k expert ids (Stack.record_routes)
        self.fused_routing = True  # turbo path: turbo.ops.fused_group_topk_routing_with_aux_score

    def route(self, x2):
        """(top-k probabilities renormalized over the k, their expert ids) [tokens, k] each."""
        probs = self.router(x2).float().softmax(-1)
        top_p, top_i = probs.topk(self.topk, dim=-1)
        return top_p / top_p.sum(-1, keepdim=True), top_i

    def route_dense(self, x2):
        """The same routing as (probs, routing_map) [tokens, experts] for token_permute: turbo's fused
        softmax top-k (one kernel a direction), or torch's ops scattered into the dense layout."""
        logits = self.router(x2).float()
        if self.fused_routing:
            _, probs, routing_map = self.turbo.ops.fused_group_topk_routing_with_aux_score(
                logits, self.topk, score_function="softmax"
            )
            return probs / probs.sum(-1, keepdim=True), routing_map
        probs = logits.softmax(-1)
        top_p, top_i = probs.topk(self.topk, dim=-1)
        t = x2.shape[0]
        routing_map = torch.zeros(t, self.num_experts, dtype=torch.bool, device=x2.device).scatter_(1, top_i, True)
        dense = torch.zeros(t, self.num_experts, dtype=torch.float32, device=x2.device)
        return dense.scatter(1, top_i, top_p / top_p.sum(-1, keepdim=True)), routing_map

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.turbo is not None:
            probs, routing_map = self.route_dense(x2)
            if self.routes is not None:  # the chosen ids in ascending order, as sort() gives them
                self.routes.append(routing_map.nonzero()[:, 1].view(-1, self.topk))
            y = self._turbo_experts(x2, probs, routing_map)
        else:
            top_p, top_i = self.route(x2)
            if self.routes is not None:
                self.routes.append(top_i.sort(-1).values)
            y = self._torch_experts(x2, top_p, top_i)
        if self.shared is not None:
            y = y + self.shared(x2)
        return y.view(shape)

    def _torch_experts(self, x2, top_p, top_i):
        w = self.experts
        flat = top_i.reshape(-1)
        order = flat.argsort(stable=True)
        token = order // self.topk
        offs = torch.bincount(flat, minlength=self.num_experts).cumsum(0).to(torch.int32)
        h = torch._grouped_mm(x2[token], w.gate_up.transpose(-2, -1), offs=offs)
        gate, up = h.chunk(2, -1)
        h = F.silu(gate) * up * top_p.reshape(-1)[order].unsqueeze(-1).to(h.dtype)
        y = torch._grouped_mm(h, w.down.transpose(-2, -1), offs=offs)
        return torch.zeros_like(x2).index_add_(0, token, y)

    def _turbo_experts(self, x2, probs, routing_map):
        ops, w, t = self.turbo.ops, self.experts, x2.shape[0]
        xs, pprobs, row_id_map = ops.token_permute(
            x2, probs=probs, routing_map=routing_map, num_out_tokens=t * self.topk
        )
        group_lens = routing_map.sum(0)  # int64 per expert, on the device: no sync
        if self.fp8_layers is not None:  # the layers keep the quantized weights for the step
            layers = {id(w.gate_up): self.fp8_layers[0], id(w.down): self.fp8_layers[1]}
            gemm = lambda a, b: layers[id(b)](a, group_lens)  # noqa: E731
        elif self.fp8_config is not None:
            gemm = lambda a, b: ops.grouped_gemm_fp8(a, b, group_lens, trans_b=True, config=self.fp8_config)  # noqa: E731
        else:
            gemm = lambda a, b: ops.grouped_gemm(a, b, group_lens, trans_b=True)  # noqa: E731
        h = ops.swiglu_with_probs(gemm(xs, w.gate_up), pprobs)
        return ops.token_unpermute(gemm(h, w.down), row_id_map)

    def flops(self, tokens: int) -> float:
        e = self.experts
        per_token = self.topk * (e.gate_up[0].numel() + e.down[0].numel()) + self.router.weight.numel()
        return 6 * per_token * tokens + (self.shared.flops(tokens) if self.shared is not None else 0)


def _cached_grouped(turbo, weight: nn.Parameter, fp8_config):
    """A GroupedLinear with the FP8 weight cache whose weight is ``weight`` itself (shared, no copy)."""
    g, n, k = weight.shape
    with torch.device("meta"):
        layer = turbo.modules.GroupedLinear(g, k, n, dtype=weight.dtype, config=fp8_config, cache_quantized_weight=True)
    layer.weight = weight
    return layer


def _add_norm(turbo, norm, branch, x):
    """(norm(x + branch), x + branch) with the add fused into the norm; (norm(x), x) without a branch."""
    if branch is None:
        return norm(x), x
    return turbo.ops.rmsnorm_residual(branch, x, norm.weight, norm.eps, getattr(norm, "zero_centered_gamma", False))


class Block(nn.Module):
    def __init__(self, hidden: int, attn: Attention, mlp: nn.Module):
        super().__init__()
        self.attn_norm = nn.RMSNorm(hidden, eps=1e-5)
        self.attn = attn
        self.mlp_norm = nn.RMSNorm(hidden, eps=1e-5)
        self.mlp = mlp

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Stack(nn.Module):
    """``layers`` blocks and a final norm; the loss is taken on the hidden states (the vocabulary
    head is left out: a GEMM of its own that dominates small stacks)."""

    def __init__(self, m, layers: int, arch: str):
        super().__init__()
        self.arch = arch
        blocks = []
        for _ in range(layers):
            if arch == "dense":
                attn = Attention(m.hidden, m.num_heads_q, m.num_heads_kv, m.head_dim, m.head_dim)
                mlp = DenseMLP(m.hidden, m.intermediate)
            else:
                attn = Attention(m.hidden, m.num_heads_q, m.num_heads_kv, m.head_dim_qk, m.head_dim_v)
                mlp = MoEMLP(m.hidden, m.num_experts, m.topk, m.expert_intermediate, m.num_shared_experts)
            blocks.append(Block(m.hidden, attn, mlp))
        self.layers = nn.ModuleList(blocks)
        self.norm = nn.RMSNorm(m.hidden, eps=1e-5)
        self.rope_dim = self.layers[0].attn.dqk

    def use_turbo(self, turbo, fp8_config=None, cache_fp8_weights: bool = False, fused_routing: bool = True,
                  fp8_attention: bool = False) -> None:
        for layer in self.layers:
            layer.attn.turbo = layer.mlp.turbo = turbo
            layer.attn.fp8_attention = fp8_attention
            if isinstance(layer.mlp, MoEMLP):
                layer.mlp.fused_routing = fused_routing
                layer.mlp.fp8_config = fp8_config
                if fp8_config is not None and cache_fp8_weights:
                    layer.mlp.fp8_layers = tuple(_cached_grouped(turbo, w, fp8_config)
                                                 for w in (layer.mlp.experts.gate_up, layer.mlp.experts.down))
                if layer.mlp.shared is not None:
                    layer.mlp.shared.turbo = turbo

    def forward(self, x, cos, sin):
        turbo = self.layers[0].attn.turbo
        if turbo is None:
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.norm(x)
        # turbo path: each residual add is fused into the norm that follows it (rmsnorm_residual:
        # one pass instead of an add and a norm). The forward's values are Block.forward's; the
        # backward sums the residual stream's two gradients in fp32 and rounds once (the unfused
        # path rounds the norm's gradient, then the sum).
        branch = None  # the last branch's output, not yet added to the residual stream x
        for layer in self.layers:
            h, x = _add_norm(turbo, layer.attn_norm, branch, x)
            h, x = _add_norm(turbo, layer.mlp_norm, layer.attn(h, cos, sin), x)
            branch = layer.mlp(h)
        return _add_norm(turbo, self.norm, branch, x)[0]

    def record_routes(self, *inputs):
        """Each MoE layer's sorted top-k expert ids [tokens, k] in one no-grad forward (None for a
        dense stack): which experts every token went to, to compare two implementations' routing."""
        mlps = [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoEMLP)]
        if not mlps:
            return None
        for mlp in mlps:
            mlp.routes = []
        try:
            with torch.no_grad():
                self(*inputs)
            return [mlp.routes[0] for mlp in mlps]
        finally:
            for mlp in mlps:
                mlp.routes = None

    def flops(self, batch: int, seq: int) -> float:
        """Forward + backward FLOPs of one step (routed experts: the top-k that run)."""
        tokens = batch * seq
        return sum(layer.attn.flops(tokens, seq) + layer.mlp.flops(tokens) for layer in self.layers)
