"""Benchmark shapes derived from real model configurations (see shared/MODELS.md).

This is the one shape module every benchmark under ``benchmark/ops`` imports. Add shapes for a
new operator here (as a generator over the model tables), never as hand-picked sizes inside a
benchmark script.

Importing this module needs only ``torch`` (for the int64 group-length tensors); it never touches
the GPU or ``primus_turbo``.

Run ``python benchmark/ops/config.py --list`` to print the cases.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

__all__ = [
    "ATTENTION_SEQLENS",
    "ATTENTION_SHAPES",
    "DEFAULT_GEMM_MODELS",
    "DENSE_MODELS",
    "EP_SIZES",
    "GEMM_CASE_NAMES",
    "GROUPED_GEMM_TOKENS_PER_EXPERT",
    "MICRO_BATCH_SIZES",
    "MOE_MODELS",
    "NORM_TOKENS",
    "QUANT_MODELS",
    "QUANT_TOKENS",
    "SQUARE_GEMM_SHAPE",
    "AttentionCase",
    "AttentionShape",
    "DenseModelConfig",
    "GemmCase",
    "GroupedGemmCase",
    "MoEModelConfig",
    "NormCase",
    "QuantCase",
    "attention_fwd_flops",
    "dense_gemm_shapes",
    "gen_attention_doc_lens",
    "gen_attention_test_cases",
    "gen_gemm_test_cases",
    "gen_grouped_gemm_group_lens",
    "gen_grouped_gemm_test_cases",
    "gen_norm_test_cases",
    "gen_quant_test_cases",
    "resolve_dense_models",
    "resolve_moe_models",
]


###############################################################################
# Dense models
###############################################################################


@dataclass(frozen=True)
class DenseModelConfig:
    """A dense decoder's published configuration (one row of the MODELS.md dense table)."""

    name: str
    hidden: int
    num_heads_q: int
    num_heads_kv: int
    head_dim: int
    intermediate: int
    vocab: int
    seq: int  # training sequence length
    sliding_window: int | None = None

    @property
    def q_dim(self) -> int:
        return self.num_heads_q * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_heads_kv * self.head_dim


def _dense(*args, **kwargs) -> tuple[str, DenseModelConfig]:
    cfg = DenseModelConfig(*args, **kwargs)
    return cfg.name, cfg


#: name -> config; values from the models' published config.json files (shared/MODELS.md).
DENSE_MODELS: dict[str, DenseModelConfig] = dict(
    [
        #      name              hidden  q    kv  hd   inter  vocab   seq
        _dense("Llama-2-7B", 4096, 32, 32, 128, 11008, 32000, 4096),
        _dense("Llama-2-70B", 8192, 64, 8, 128, 28672, 32000, 4096),
        _dense("Llama-3.1-8B", 4096, 32, 8, 128, 14336, 128256, 8192),
        _dense("Llama-3.1-70B", 8192, 64, 8, 128, 28672, 128256, 8192),
        _dense("Llama-3.1-405B", 16384, 128, 8, 128, 53248, 128256, 8192),
        _dense("Qwen2.5-7B", 3584, 28, 4, 128, 18944, 152064, 8192),
        _dense("Qwen2.5-72B", 8192, 64, 8, 128, 29568, 152064, 8192),
        _dense("Mistral-7B", 4096, 32, 8, 128, 14336, 32000, 4096, sliding_window=4096),
    ]
)

#: The default dense GEMM model set. Llama-3.1-70B is in the table but left out here: its GEMM
#: shapes are those of Llama-2-70B at twice the sequence length, i.e. Llama-2-70B at MBS 2/4.
DEFAULT_GEMM_MODELS: tuple[str, ...] = (
    "Llama-2-7B",
    "Llama-2-70B",
    "Llama-3.1-8B",
    "Llama-3.1-405B",
    "Qwen2.5-7B",
    "Qwen2.5-72B",
    "Mistral-7B",
)

#: GEMMs of one transformer layer, in the order they run in the forward pass.
GEMM_CASE_NAMES: tuple[str, ...] = ("attn_qkv", "attn_out", "mlp_gate_up", "mlp_down")
#: Optional extra case (not in the default set): the output projection onto the vocabulary.
LM_HEAD_CASE = "lm_head"

MICRO_BATCH_SIZES: tuple[int, ...] = (1, 2, 4)

#: Reported beside the model set (flagged "square", never part of its geomean).
SQUARE_GEMM_SHAPE: tuple[int, int, int] = (8192, 8192, 8192)


def _resolve(names: Iterable[str] | None, table: dict[str, object], default: Sequence[str], what: str) -> list[str]:
    if names is None:
        return list(default)
    names = list(names)
    if any(n.lower() == "all" for n in names):
        return list(table)
    by_lower = {k.lower(): k for k in table}
    out = []
    for n in names:
        key = by_lower.get(n.lower())
        if key is None:
            raise ValueError(f"unknown {what} model '{n}'; choose from: {', '.join(table)} (or 'all')")
        if key not in out:
            out.append(key)
    return out


def resolve_dense_models(names: Iterable[str] | None = None) -> list[str]:
    """Canonical dense model names (case-insensitive match; None -> default set; 'all' -> table)."""
    return _resolve(names, DENSE_MODELS, DEFAULT_GEMM_MODELS, "dense")


def dense_gemm_shapes(model: str | DenseModelConfig, include_lm_head: bool = False) -> dict[str, tuple[int, int]]:
    """(N, K) per GEMM of one layer; weights are stored [N, K] (trans_b=True), M = seq * mbs."""
    cfg = model if isinstance(model, DenseModelConfig) else DENSE_MODELS[resolve_dense_models([model])[0]]
    shapes = {
        "attn_qkv": (cfg.q_dim + 2 * cfg.kv_dim, cfg.hidden),
        "attn_out": (cfg.hidden, cfg.q_dim),
        "mlp_gate_up": (2 * cfg.intermediate, cfg.hidden),
        "mlp_down": (cfg.hidden, cfg.intermediate),
    }
    if include_lm_head:
        shapes[LM_HEAD_CASE] = (cfg.vocab, cfg.hidden)
    return shapes


class _ItemAccess:
    """Lets the case dataclasses be read like dicts too (case["M"] as well as case.M)."""

    def __getitem__(self, key):
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def keys(self):
        return self.as_dict().keys()

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GemmCase(_ItemAccess):
    """One dense GEMM: out[M, N] = a[M, K] @ b[N, K]^T (trans_b=True)."""

    model: str
    case: str
    MBS: int
    M: int
    N: int
    K: int
    trans_b: bool = True

    @property
    def name(self) -> str:
        return f"{self.model}/{self.case}"

    @property
    def fwd_flops(self) -> int:
        return 2 * self.M * self.N * self.K

    @property
    def bwd_flops(self) -> int:  # dgrad + wgrad
        return 4 * self.M * self.N * self.K

    @property
    def step_flops(self) -> int:  # forward + backward
        return 6 * self.M * self.N * self.K


def gen_gemm_test_cases(
    models: Iterable[str] | None = None,
    mbs: Iterable[int] = MICRO_BATCH_SIZES,
    include_lm_head: bool = False,
) -> list[GemmCase]:
    """Dense GEMM cases: per model, per micro-batch, the four GEMMs of a layer (plus lm_head if asked).

    ``models`` None means ``DEFAULT_GEMM_MODELS``; names match case-insensitively; ``["all"]`` means
    every dense model in the table. M = seq * mbs with the model's training sequence length.
    """
    cases = []
    mbs = [int(x) for x in mbs]
    if any(x < 1 for x in mbs):
        raise ValueError(f"micro-batch sizes must be >= 1, got {mbs}")
    for name in resolve_dense_models(models):
        cfg = DENSE_MODELS[name]
        shapes = dense_gemm_shapes(cfg, include_lm_head=include_lm_head)
        for b in mbs:
            for case, (n, k) in shapes.items():
                cases.append(GemmCase(model=name, case=case, MBS=b, M=cfg.seq * b, N=n, K=k))
    return cases


###############################################################################
# Mixture-of-experts models
###############################################################################


@dataclass(frozen=True)
class MoEModelConfig:
    """An MoE model's published configuration (one row of the MODELS.md MoE table)."""

    name: str
    hidden: int
    num_experts: int  # routed experts
    topk: int
    expert_intermediate: int
    num_shared_experts: int
    # attention
    attention: str  # "MLA" or "GQA"
    num_heads_q: int
    num_heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    sliding_window: int | None = None  # on alternate layers (GPT-OSS)
    attention_sinks: bool = False
    # group-limited routing (DeepSeek-V3): experts in n_groups groups, topk_groups of them selected
    n_groups: int = 1
    topk_groups: int = 1


#: name -> config (shared/MODELS.md). MLA models: K/V heads equal the query heads after up-projection.
MOE_MODELS: dict[str, MoEModelConfig] = {
    c.name: c
    for c in [
        MoEModelConfig("DeepSeek-V3", 7168, 256, 8, 2048, 1, "MLA", 128, 128, 192, 128, n_groups=8, topk_groups=4),
        MoEModelConfig("DeepSeek-V2", 5120, 160, 6, 1536, 2, "MLA", 128, 128, 192, 128),
        MoEModelConfig("DeepSeek-V2-Lite", 2048, 64, 6, 1408, 2, "MLA", 16, 16, 192, 128),
        MoEModelConfig("Kimi-K2", 7168, 384, 8, 2048, 1, "MLA", 64, 64, 192, 128),
        MoEModelConfig("Qwen3-30B-A3B", 2048, 128, 8, 768, 0, "GQA", 32, 4, 128, 128),
        MoEModelConfig("Qwen3-235B-A22B", 4096, 128, 8, 1536, 0, "GQA", 64, 4, 128, 128),
        MoEModelConfig("Mixtral-8x7B", 4096, 8, 2, 14336, 0, "GQA", 32, 8, 128, 128),
        MoEModelConfig("Mixtral-8x22B", 6144, 8, 2, 16384, 0, "GQA", 48, 8, 128, 128),
        MoEModelConfig(
            "GPT-OSS-20B", 2880, 32, 4, 2880, 0, "GQA", 64, 8, 64, 64, sliding_window=128, attention_sinks=True
        ),
    ]
}

#: Expert-parallel sizes; a size is used for a model only where it divides the expert count.
EP_SIZES: tuple[int, ...] = (8, 16, 32)
#: Average tokens per local expert.
GROUPED_GEMM_TOKENS_PER_EXPERT: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)


def resolve_moe_models(names: Iterable[str] | None = None) -> list[str]:
    """Canonical MoE model names (case-insensitive; None or 'all' -> every MoE model)."""
    return _resolve(names, MOE_MODELS, tuple(MOE_MODELS), "MoE")


def gen_grouped_gemm_group_lens(
    num_groups: int,
    total_tokens: int,
    balanced: bool = True,
    seed: int = 0,
    distribution: str = "dirichlet",
    alpha: float = 0.5,
    zipf_s: float = 1.2,
    empty_fraction: float = 0.125,
):
    """Tokens per group (an int64 CPU tensor of length ``num_groups`` summing to ``total_tokens``).

    balanced=True: an equal split (the remainder goes one token each to the first groups).
    balanced=False: a skewed split, deterministic for a given seed: weights drawn from a
    Dirichlet(alpha) (``distribution="dirichlet"``) or a Zipf-like 1/rank^s over a random expert
    order (``"zipf"``); when ``num_groups >= 2`` at least one expert (``empty_fraction`` of them,
    rounded down, at least 1) gets no tokens at all. Counts are rounded with the largest-remainder
    method, so the sum is exact.

    Move the result to the GPU yourself (``.cuda()``): the operator takes group_lens on the device.
    """
    import torch

    num_groups, total_tokens = int(num_groups), int(total_tokens)
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if total_tokens < 0:
        raise ValueError(f"total_tokens must be >= 0, got {total_tokens}")

    if balanced or num_groups == 1:
        base, rem = divmod(total_tokens, num_groups)
        lens = [base + (1 if i < rem else 0) for i in range(num_groups)]
        return torch.tensor(lens, dtype=torch.int64)

    # Python's own RNG: deterministic across machines and torch versions, and no global state touched.
    rng = random.Random(f"group_lens:{seed}:{num_groups}:{total_tokens}:{distribution}")
    if distribution == "dirichlet":
        weights = [rng.gammavariate(alpha, 1.0) for _ in range(num_groups)]
    elif distribution == "zipf":
        ranks = list(range(1, num_groups + 1))
        rng.shuffle(ranks)
        weights = [1.0 / r**zipf_s for r in ranks]
    else:
        raise ValueError(f"distribution must be 'dirichlet' or 'zipf', got '{distribution}'")

    num_empty = min(num_groups - 1, max(1, int(num_groups * empty_fraction)))
    for i in rng.sample(range(num_groups), num_empty):
        weights[i] = 0.0
    if sum(weights) <= 0.0:  # every non-emptied weight underflowed; keep the sum on one expert
        weights[next(i for i in range(num_groups) if weights[i] == 0.0)] = 1.0

    wsum = sum(weights)
    exact = [w / wsum * total_tokens for w in weights]
    lens = [math.floor(x) for x in exact]
    short = total_tokens - sum(lens)
    # Largest remainder first; only groups with weight > 0 may receive the leftover tokens.
    order = sorted((i for i in range(num_groups) if weights[i] > 0), key=lambda i: exact[i] - lens[i], reverse=True)
    for i in order[:short]:
        lens[i] += 1
    assert sum(lens) == total_tokens
    return torch.tensor(lens, dtype=torch.int64)


@dataclass(frozen=True)
class GroupedGemmCase(_ItemAccess):
    """One grouped GEMM: G local experts, a [sum(group_lens), K] @ b[G, N, K]^T (trans_b=True)."""

    model: str
    case: str  # "gate_up" or "down"
    EP: int
    G: int  # local experts = experts / EP
    tokens_per_expert: int  # average; total tokens = G * tokens_per_expert
    N: int
    K: int
    balanced: bool
    trans_b: bool = True

    @property
    def name(self) -> str:
        return f"{self.model}/{self.case}"

    @property
    def total_tokens(self) -> int:
        return self.G * self.tokens_per_expert

    @property
    def fwd_flops(self) -> int:  # independent of the split: sum over groups of 2 * m_g * N * K
        return 2 * self.total_tokens * self.N * self.K


def gen_grouped_gemm_test_cases(
    models: Iterable[str] | None = None,
    ep_sizes: Iterable[int] = EP_SIZES,
    tokens_per_expert: Iterable[int] = GROUPED_GEMM_TOKENS_PER_EXPERT,
    balanced: Iterable[bool] = (True, False),
) -> list[GroupedGemmCase]:
    """Grouped GEMM (MoE expert) cases: per model, EP size dividing the experts, tokens, split.

    gate+up: N = 2 * expert intermediate, K = hidden; down: N = hidden, K = expert intermediate.
    Build the group sizes with ``gen_grouped_gemm_group_lens(case.G, case.total_tokens, case.balanced, seed)``.
    """
    cases = []
    for name in resolve_moe_models(models):
        cfg = MOE_MODELS[name]
        shapes = {"gate_up": (2 * cfg.expert_intermediate, cfg.hidden), "down": (cfg.hidden, cfg.expert_intermediate)}
        for ep in ep_sizes:
            if cfg.num_experts % ep:
                continue
            for t in tokens_per_expert:
                for bal in balanced:
                    for case, (n, k) in shapes.items():
                        cases.append(GroupedGemmCase(name, case, ep, cfg.num_experts // ep, t, n, k, bool(bal)))
    return cases


###############################################################################
# Attention
###############################################################################


@dataclass(frozen=True)
class AttentionShape(_ItemAccess):
    """Head configuration of one attention variant (shared/MODELS.md, "Attention shapes")."""

    num_heads_q: int
    num_heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    window: int | None = None  # sliding window (left), None for full attention
    sinks: bool = False
    models: tuple[str, ...] = ()


#: The attention head configurations of the model tables, deduplicated.
ATTENTION_SHAPES: tuple[AttentionShape, ...] = (
    AttentionShape(32, 32, 128, 128, models=("Llama-2-7B",)),
    AttentionShape(32, 8, 128, 128, models=("Llama-3.1-8B", "Mistral-7B", "Mixtral-8x7B")),
    AttentionShape(64, 8, 128, 128, models=("Llama-2-70B", "Llama-3.1-70B", "Qwen2.5-72B")),
    AttentionShape(28, 4, 128, 128, models=("Qwen2.5-7B",)),
    AttentionShape(128, 128, 192, 128, models=("DeepSeek-V3", "DeepSeek-V2")),
    AttentionShape(16, 16, 192, 128, models=("DeepSeek-V2-Lite",)),
    AttentionShape(64, 8, 64, 64, window=128, sinks=True, models=("GPT-OSS-20B",)),
)

ATTENTION_SEQLENS: tuple[int, ...] = (2048, 4096, 8192, 16384, 32768)
#: Target tokens per step (batch * seqlen); MODELS.md asks for 8k-32k.
ATTENTION_TOKENS_PER_STEP = 16384


@dataclass(frozen=True)
class AttentionCase(_ItemAccess):
    num_heads_q: int
    num_heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    batch: int
    seqlen: int
    causal: bool
    window: int | None = None
    sinks: bool = False

    @property
    def name(self) -> str:
        w = f"_w{self.window}" if self.window else ""
        s = "_sink" if self.sinks else ""
        return f"h{self.num_heads_q}/{self.num_heads_kv}_d{self.head_dim_qk}/{self.head_dim_v}{w}{s}"

    @property
    def fwd_flops(self) -> float:
        return attention_fwd_flops(
            self.batch,
            self.seqlen,
            self.seqlen,
            self.num_heads_q,
            self.head_dim_qk,
            self.head_dim_v,
            self.causal,
            self.window,
        )


def attention_fwd_flops(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    heads_q: int,
    dim_qk: int,
    dim_v: int,
    causal: bool,
    window: int | None = None,
) -> float:
    """2*B*Sq*Sk*Hq*(Dqk+Dv), halved for causal (MODELS.md); backward counts 2.5x this.

    With a sliding window (causal, left window w, Sq == Sk) the count uses the exact number of
    attended (query, key) pairs, which is far below half the square for w << S.
    """
    if window is not None and window >= 0 and causal:
        s, w = seqlen_q, window
        pairs = sum(min(i + 1, w + 1) for i in range(min(s, w + 1))) + max(0, s - (w + 1)) * (w + 1)
        return 2.0 * batch * pairs * heads_q * (dim_qk + dim_v)
    flops = 2.0 * batch * seqlen_q * seqlen_k * heads_q * (dim_qk + dim_v)
    return flops / 2 if causal else flops


def gen_attention_test_cases(
    seqlens: Iterable[int] = ATTENTION_SEQLENS,
    tokens_per_step: int = ATTENTION_TOKENS_PER_STEP,
    causal: bool = True,
    shapes: Sequence[AttentionShape] = ATTENTION_SHAPES,
) -> list[AttentionCase]:
    """Attention cases: every head configuration x sequence length, batch = tokens_per_step // seqlen (>= 1)."""
    cases = []
    for sh in shapes:
        for s in seqlens:
            b = max(1, tokens_per_step // s)
            cases.append(
                AttentionCase(
                    sh.num_heads_q, sh.num_heads_kv, sh.head_dim_qk, sh.head_dim_v, b, s, causal, sh.window, sh.sinks
                )
            )
    return cases


def gen_attention_doc_lens(tokens: int = ATTENTION_TOKENS_PER_STEP, max_len: int = 8192, seed: int = 0) -> list[int]:
    """Document lengths packed back to back into one step of ``tokens`` (the varlen attention case):
    log-normal around 1.5K tokens with a fixed seed, clipped to [32, max_len], the last document cut
    so that the step is filled exactly."""
    rng = random.Random(seed)
    lens, left = [], tokens
    while left > 0:
        n = int(min(max(rng.lognormvariate(math.log(1500), 1.0), 32), max_len, left))
        lens.append(n)
        left -= n
    return lens


###############################################################################
# CLI: print the cases
###############################################################################


###############################################################################
# Normalization (RMSNorm): hidden sizes of every model table, tokens per micro-batch
###############################################################################

#: Tokens per call (rows of the [tokens, hidden] activation): one 4K sequence to 32K tokens.
NORM_TOKENS: tuple[int, ...] = (4096, 8192, 16384, 32768)


@dataclass(frozen=True)
class NormCase:
    name: str  # the models sharing this hidden size
    tokens: int
    hidden: int


def gen_norm_test_cases(tokens: Sequence[int] = NORM_TOKENS, models: Iterable[str] | None = None) -> list[NormCase]:
    """One case per distinct hidden size of the dense and MoE tables (or of ``models``) and token count."""
    table = {**{n: m.hidden for n, m in DENSE_MODELS.items()}, **{n: m.hidden for n, m in MOE_MODELS.items()}}
    names = list(table) if models is None or list(models) == ["all"] else list(models)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown models {unknown}; choose from {sorted(table)}")
    by_hidden: dict[int, list[str]] = {}
    for n in names:
        by_hidden.setdefault(table[n], []).append(n)
    return [
        NormCase("/".join(by_hidden[h][:2]) + ("/..." if len(by_hidden[h]) > 2 else ""), t, h)
        for h in sorted(by_hidden)
        for t in tokens
    ]


###############################################################################
# Gated activations (SwiGLU / GeGLU): MLP intermediate sizes of the dense and MoE tables
###############################################################################


@dataclass(frozen=True)
class ActivationCase:
    name: str  # the models sharing this intermediate size
    tokens: int  # rows of the [tokens, 2 * cols] gate/up projection output
    cols: int  # the intermediate size: the activation's output width


def gen_activation_test_cases(
    tokens: Sequence[int] = NORM_TOKENS, models: Iterable[str] | None = None
) -> list[ActivationCase]:
    """One case per distinct MLP intermediate size (dense ``intermediate``, MoE
    ``expert_intermediate``) of the tables (or of ``models``) and token count. MoE experts see a
    share of the tokens; the same token counts keep the sizes comparable across models."""
    table = {
        **{n: m.intermediate for n, m in DENSE_MODELS.items()},
        **{n: m.expert_intermediate for n, m in MOE_MODELS.items()},
    }
    names = list(table) if models is None or list(models) == ["all"] else list(models)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown models {unknown}; choose from {sorted(table)}")
    by_cols: dict[int, list[str]] = {}
    for n in names:
        by_cols.setdefault(table[n], []).append(n)
    return [
        ActivationCase("/".join(by_cols[c][:2]) + ("/..." if len(by_cols[c]) > 2 else ""), t, c)
        for c in sorted(by_cols)
        for t in tokens
    ]


###############################################################################
# RoPE: the attention head configurations, tokens per micro-batch
###############################################################################

#: Tokens per call, as [batch, seq] = [tokens // ROPE_SEQLEN, ROPE_SEQLEN].
ROPE_TOKENS: tuple[int, ...] = (4096, 8192, 16384, 32768)
ROPE_SEQLEN = 4096
#: MLA (head_dim_qk 192) rotates only its 64 positional features.
MLA_ROPE_DIM = 64


@dataclass(frozen=True)
class RopeCase:
    name: str
    tokens: int
    heads_q: int
    heads_k: int
    head_dim: int
    rotary_dim: int


def gen_rope_test_cases(tokens: Sequence[int] = ROPE_TOKENS, shapes: Sequence[AttentionShape] = ATTENTION_SHAPES) -> list[RopeCase]:
    """One case per attention head configuration (q heads, k heads, head_dim) and token count."""
    cases = []
    for sh in shapes:
        rd = MLA_ROPE_DIM if sh.head_dim_qk == 192 else sh.head_dim_qk
        name = f"h{sh.num_heads_q}/{sh.num_heads_kv}_d{sh.head_dim_qk}" + (f"_r{rd}" if rd != sh.head_dim_qk else "")
        for t in tokens:
            cases.append(RopeCase(name, t, sh.num_heads_q, sh.num_heads_kv, sh.head_dim_qk, rd))
    return cases


# Quantization: the GEMM operands of a layer. Activations [tokens, K] for every distinct K of the
# layer's GEMMs (hidden, attention output, MLP intermediate); weights [N, K] as dense_gemm_shapes.
# ----------------------------------------------------------------------------------------------------

#: Default models and tokens of the quantization benchmark (a small, representative set).
QUANT_MODELS: tuple[str, ...] = ("Llama-3.1-8B", "Qwen2.5-7B")
QUANT_TOKENS: tuple[int, ...] = (8192,)


@dataclass(frozen=True)
class QuantCase:
    name: str  # model/operand, e.g. "Llama-3.1-8B/act_K14336" or "Llama-3.1-8B/w_mlp_down"
    kind: str  # "activation" or "weight"
    m: int
    k: int


def gen_quant_test_cases(
    tokens: Sequence[int] = QUANT_TOKENS, models: Iterable[str] | None = None
) -> list[QuantCase]:
    """Activation [tokens, K] per distinct GEMM K and token count, then each weight [N, K]."""
    cases: list[QuantCase] = []
    for name in resolve_dense_models(models) if models is not None else list(QUANT_MODELS):
        shapes = dense_gemm_shapes(name)
        for k in sorted({kk for _, kk in shapes.values()}):
            cases += [QuantCase(f"{name}/act_K{k}", "activation", t, k) for t in tokens]
        cases += [QuantCase(f"{name}/w_{g}", "weight", n, k) for g, (n, k) in shapes.items()]
    return cases


def _print_rows(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(header)]
    print("  ".join(str(h).rjust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths)))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Print benchmark shapes derived from real model configs.")
    p.add_argument("--list", action="store_true", help="print the cases (the default action)")
    p.add_argument("--op", choices=("gemm", "grouped_gemm", "attention", "norm", "all"), default="gemm")
    p.add_argument("--models", nargs="+", default=None, help="model names ('all' for the whole table)")
    p.add_argument("--mbs", nargs="+", type=int, default=list(MICRO_BATCH_SIZES))
    p.add_argument("--lm-head", action="store_true", help="also list the lm_head GEMM")
    args = p.parse_args(argv)

    if args.op in ("gemm", "all"):
        cases = gen_gemm_test_cases(args.models, args.mbs, include_lm_head=args.lm_head)
        print(f"# dense GEMM cases: {len(cases)} (trans_b=True; TFLOP counts forward / fwd+bwd)")
        _print_rows(
            ("model/case", "MBS", "M", "N", "K", "fwd TFLOP", "step TFLOP"),
            [(c.name, c.MBS, c.M, c.N, c.K, f"{c.fwd_flops / 1e12:.2f}", f"{c.step_flops / 1e12:.2f}") for c in cases],
        )
        print(f"# total step TFLOP: {sum(c.step_flops for c in cases) / 1e12:.1f}")
    if args.op in ("grouped_gemm", "all"):
        models = args.models if args.op == "grouped_gemm" else None
        cases = gen_grouped_gemm_test_cases(models)
        print(f"# grouped GEMM cases: {len(cases)}")
        _print_rows(
            ("model/case", "EP", "G", "tok/expert", "N", "K", "balanced"),
            [(c.name, c.EP, c.G, c.tokens_per_expert, c.N, c.K, c.balanced) for c in cases],
        )
    if args.op in ("attention", "all"):
        cases = gen_attention_test_cases()
        print(f"# attention cases: {len(cases)}")
        _print_rows(
            ("heads/dims", "B", "S", "causal", "fwd TFLOP"),
            [(c.name, c.batch, c.seqlen, c.causal, f"{c.fwd_flops / 1e12:.2f}") for c in cases],
        )
    if args.op in ("norm", "all"):
        cases = gen_norm_test_cases()
        print(f"# normalization cases: {len(cases)}")
        _print_rows(("models", "tokens", "hidden"), [(c.name, c.tokens, c.hidden) for c in cases])


if __name__ == "__main__":
    main()
