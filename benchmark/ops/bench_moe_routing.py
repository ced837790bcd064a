"""MoE routing benchmark: turbo.ops.fused_group_topk_routing_with_aux_score against torch eager and
torch.compile of the same math (float32 scores, group-limited top-k, dense probabilities and the
aux-loss scores in the logits' dtype), forward and backward, on the router configurations of
DeepSeek-V3 (256 experts, 8 groups, 4 selected, top-8, sigmoid, scaling 2.5), Qwen3-MoE (128,
top-8, softmax), Mixtral (8, top-2, softmax) and Kimi-K2 (384, top-8, sigmoid); the engine is
membound.py.

    python benchmark/ops/bench_moe_routing.py --dtype bf16 [--quick] [--models DeepSeek-V3]

Inputs are normal logits whose routing decisions are not near-ties (rows with a relative gap
below 1e-4 at the k-th expert or the selected-group boundary are drawn again), so the chosen
experts are well defined and the float64 reference checks probs, scores and the logits gradient
under the gates of shared/ACCURACY.md. Both sides return (scores, probs); ours also writes the
bool routing map. Bytes counted once ([T, E] each): forward logits, scores, probs (+ the 1-byte
map); backward logits, map, dscores, dprobs, dlogits. Summary entries moe_routing_fwd,
moe_routing_bwd. Exits 1 if a case failed. --quick: DeepSeek-V3 at 16384 tokens (one torch.compile
baseline to build, so it stays within a minute); add --models Qwen3-MoE for the softmax path.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import membound as mb  # noqa: E402

# name: (experts, topk, groups, selected_groups, score_function, scaling)
MODELS = {
    "DeepSeek-V3": (256, 8, 8, 4, "sigmoid", 2.5),
    "Qwen3-MoE": (128, 8, 1, 1, "softmax", 1.0),
    "Mixtral": (8, 2, 1, 1, "softmax", 1.0),
    "Kimi-K2": (384, 8, 1, 1, "sigmoid", 2.827),
}
TOKENS = (4096, 8192, 16384, 32768)


@dataclass(frozen=True)
class Case:
    name: str
    tokens: int
    experts: int
    topk: int
    groups: int
    selected_groups: int
    score_function: str
    scaling: float


def torch_routing(x, topk, groups, selected_groups, score_function, scaling):
    """The same math in plain torch (float32), returning (scores, probs) in x's dtype."""
    s = torch.sigmoid(x.float()) if score_function == "sigmoid" else torch.softmax(x.float(), dim=-1)
    t, e = s.shape
    if groups > 1:
        gscore = s.view(t, groups, -1).topk(topk // selected_groups, dim=-1).values.sum(-1)
        gidx = gscore.topk(selected_groups, dim=-1).indices
        gmask = torch.zeros_like(gscore, dtype=torch.bool).scatter(1, gidx, True)
        masked = s.masked_fill(~gmask.repeat_interleave(e // groups, dim=1), float("-inf"))
    else:
        masked = s
    idx = masked.topk(topk, dim=-1).indices
    vals = s.gather(1, idx)
    scores = s
    if score_function == "sigmoid" and topk > 1:
        vals = vals / (vals.sum(-1, keepdim=True) + 1e-20)
        scores = s / (s.sum(-1, keepdim=True) + 1e-20)
    probs = torch.zeros_like(s).scatter(1, idx, vals * scaling)
    return scores.to(x.dtype), probs.to(x.dtype)


def ours(x, topk, groups, selected_groups, score_function, scaling):
    scores, probs, _ = mb.turbo().ops.fused_group_topk_routing_with_aux_score(
        x, topk, groups, selected_groups, score_function, scaling
    )
    return scores, probs


def _margin(x, c: Case):
    """Relative gap of each row's closest routing decision, in float64."""
    s = torch.sigmoid(x.double()) if c.score_function == "sigmoid" else torch.softmax(x.double(), dim=-1)
    t, e = s.shape
    margin = torch.full((t,), float("inf"), dtype=torch.float64, device=x.device)
    masked = s
    if c.groups > 1:
        gscore = s.view(t, c.groups, -1).topk(c.topk // c.selected_groups, dim=-1).values.sum(-1)
        gs = gscore.sort(dim=-1, descending=True).values
        if c.selected_groups < c.groups:
            margin = torch.minimum(margin, gs[:, c.selected_groups - 1] - gs[:, c.selected_groups])
        gidx = gscore.topk(c.selected_groups, dim=-1).indices
        gmask = torch.zeros_like(gscore, dtype=torch.bool).scatter(1, gidx, True)
        masked = s.masked_fill(~gmask.repeat_interleave(e // c.groups, dim=1), float("-inf"))
    v = masked.sort(dim=-1, descending=True).values
    if c.topk < e // c.groups * c.selected_groups:
        margin = torch.minimum(margin, v[:, c.topk - 1] - v[:, c.topk])
    return margin / v[:, 0].clamp_min(1e-300)


def make(c: Case, dtype):
    x = torch.randn(c.tokens, c.experts, device="cuda").to(dtype)
    for _ in range(100):
        bad = _margin(x, c) < 1e-4
        n = int(bad.sum())
        if n == 0:
            break
        x[bad] = torch.randn(n, c.experts, device="cuda").to(dtype)
    x.requires_grad_()
    d_scores = torch.randn(c.tokens, c.experts, device="cuda").to(dtype)
    d_probs = torch.randn(c.tokens, c.experts, device="cuda").to(dtype)
    args = (x, c.topk, c.groups, c.selected_groups, c.score_function, c.scaling)
    return mb.Inputs(args, (x,), (d_scores, d_probs))


def reference(inp):
    x, topk, groups, sel, fn, scaling = inp.args
    xr = x.detach().double().requires_grad_()
    s = torch.sigmoid(xr) if fn == "sigmoid" else torch.softmax(xr, dim=-1)
    t, e = s.shape
    masked = s.detach()
    if groups > 1:
        gscore = masked.view(t, groups, -1).topk(topk // sel, dim=-1).values.sum(-1)
        gidx = gscore.topk(sel, dim=-1).indices
        gmask = torch.zeros_like(gscore, dtype=torch.bool).scatter(1, gidx, True)
        masked = masked.masked_fill(~gmask.repeat_interleave(e // groups, dim=1), float("-inf"))
    idx = masked.topk(topk, dim=-1).indices
    vals = s.gather(1, idx)
    scores = s
    if fn == "sigmoid" and topk > 1:
        vals = vals / (vals.sum(-1, keepdim=True) + 1e-20)
        scores = s / (s.sum(-1, keepdim=True) + 1e-20)
    probs = torch.zeros_like(s).scatter(1, idx, vals * scaling)
    (grad,) = torch.autograd.grad((scores, probs), (xr,), tuple(d.double() for d in inp.douts))
    return scores.detach(), probs.detach(), grad


OP = mb.OpBench(
    "moe_routing",
    make,
    ours,
    torch_routing,
    reference,
    fwd_bytes=lambda c, es: c.tokens * c.experts * (3 * es + 1),
    bwd_bytes=lambda c, es: c.tokens * c.experts * (4 * es + 1),
    names=("scores", "probs", "dlogits"),
)


def routing_cases(args):
    if args.quick:
        args.models = args.models or ["DeepSeek-V3"]
        args.tokens = args.tokens or [16384]
    args.tokens = args.tokens or list(TOKENS)
    models = args.models or list(MODELS)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"bench_moe_routing: unknown models {unknown}; choose from {list(MODELS)}")
    return [Case(m, t, *MODELS[m]) for m in models for t in args.tokens]


def describe(case):
    return {
        "Case": case.name,
        "Tokens": case.tokens,
        "Experts": case.experts,
        "TopK": case.topk,
        "Groups": f"{case.selected_groups}/{case.groups}",
        "Score": case.score_function,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="bench_moe_routing", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return mb.main({"moe_routing": OP}, p, routing_cases, describe, "{Case} T={Tokens} E={Experts} k={TopK}", argv)


if __name__ == "__main__":
    sys.exit(main())
