"""Attention benchmark: turbo.ops.flash_attn_func (and flash_attn_varlen_func) against torch's
scaled_dot_product_attention on cuDNN, forward, backward and the training step, on the attention
shapes of the model tables (config.gen_attention_test_cases, shared/MODELS.md).

    python benchmark/ops/bench_attention.py                 # every shape x 2K..32K, 16K tokens a step
    python benchmark/ops/bench_attention.py --quick         # GQA, MLA and the varlen case at 4K
    python benchmark/ops/bench_attention.py --seqlens 4096 8192 --tokens 32768
    python benchmark/ops/bench_attention.py --quick --backend TURBO   # our kernel only (default: unset,
                                                                      # cuDNN where it runs, else ours)
    python benchmark/ops/bench_attention.py --quick --fp8   # flash_attn_fp8_func: vs our bf16 and SDPA

Cases ([B, S, H, D] inputs, B = tokens // S): every head configuration causal, the MHA/GQA ones
also non-causal, GPT-OSS's (64, 8, 64, 64) with a 128-token window and sinks, and one varlen step
of documents packed back to back (config.gen_attention_doc_lens), causal per document.

Baseline: SDPA under sdpa_kernel(CUDNN_ATTENTION), falling back to FLASH_ATTENTION, then
EFFICIENT_ATTENTION, when a backend refuses the shape (GQA tries enable_gqa first, then k and v
expanded to the query heads); the backend that ran is recorded. A window or sinks run first on
FlexAttention (compiled; the window as a block mask, the sinks joined to each softmax denominator
through its log-sum-exp: out * sigmoid(lse - sink), exact), then on SDPA with an explicit additive
mask ([1, Hq, S, S + 1]: the sink is an extra key of value 0) when the mask fits --mask-budget-gb.
The varlen baseline is SDPA per document.

Per case:
  1. correctness first: out, dq, dk, dv against the baseline's (SNR >= 40 dB, shared/ACCURACY.md),
     and out and dq of 512 query rows x 4 heads against the float32 reference; a FAIL or ERROR
     voids our timings;
  2. timing (CUDA events, median of >= 50 calls) on the same inputs: forward with autograd
     recording, backward (autograd.grad of the output), step = forward + backward.

FLOPs: 2*B*Sq*Sk*Hq*(D + Dv), halved for causal (the exact visible pairs with a window); backward
2.5x the forward, step 3.5x. Writes <output-dir>/<gpu>/attn_<dtype>[_<tag>].csv and .png and the
summary.json entries attn_<dtype>_fwd, attn_<dtype>_bwd, attn_<dtype>_step (fixed-length cases
without window or sinks), attn_mla_<dtype>_step, attn_window_sink_<dtype>_step (against the
FlexAttention / masked baselines) and attn_varlen_<dtype>_step (suffixed with the tag). Exits 1
when a case fails.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__:
    from . import bench_utils as bu
    from . import config as cfg
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_utils as bu  # type: ignore[no-redef]
    import config as cfg  # type: ignore[no-redef]

BASELINE = "torch SDPA"
QUICK_SHAPES = {(32, 8, 128, 128), (128, 128, 192, 128)}  # Llama-3.1-8B GQA, DeepSeek MLA (+ varlen)
QUICK_SEQLEN = 4096
NONCAUSAL_SHAPES = {(32, 32, 128, 128), (32, 8, 128, 128)}
VARLEN_SHAPE = (32, 8, 128, 128)
REF_ROWS, REF_HEADS = 512, 4

COLUMNS = [
    "TestID", "GPU", "Case", "Kind", "Batch", "SeqLen", "HeadsQ", "HeadsKV", "DimQK", "DimV", "Causal", "Window",
    "Sinks", "dtype", "Check", "Forward Time (ms)", "Forward TFLOPS", "Backward Time (ms)", "Backward TFLOPS",
    "Step TFLOPS", "Baseline Backend", "Baseline Forward Time (ms)", "Baseline Forward TFLOPS",
    "Baseline Backward Time (ms)", "Baseline Backward TFLOPS", "Baseline Step TFLOPS", "Forward Ratio",
    "Backward Ratio", "Step Ratio", "Out SNR vs Baseline (dB)", "Min Grad SNR vs Baseline (dB)",
    "Out SNR vs Reference (dB)", "dQ SNR vs Reference (dB)", "BF16 Forward TFLOPS", "BF16 Step TFLOPS",
    "Peak Mem (GB)", "Note",
]  # fmt: skip
TABLE = [
    ("Case", "Case"), ("SeqLen", "S"), ("Batch", "B"), ("Check", "Check"), ("Forward TFLOPS", "Fwd TF"),
    ("Backward TFLOPS", "Bwd TF"), ("Step TFLOPS", "Step TF"), ("Baseline Backend", "Base"),
    ("Baseline Step TFLOPS", "Base Step"), ("Step Ratio", "Ratio"),
]  # fmt: skip
BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")


@dataclass(frozen=True)
class Case:
    hq: int
    hkv: int
    d: int
    dv: int
    batch: int
    seqlen: int  # per sequence; the longest document for varlen
    causal: bool
    window: int | None = None  # left window (with causal: window_size = (window, 0))
    sinks: bool = False
    doc_lens: tuple[int, ...] = ()  # varlen: the packed documents

    @property
    def kind(self) -> str:
        return "varlen" if self.doc_lens else ("mla" if self.d != self.dv else "fixed")

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        extra = (f"_w{self.window}" if self.window else "") + ("_sink" if self.sinks else "")
        docs = f"_{len(self.doc_lens)}docs" if self.doc_lens else ""
        return f"h{self.hq}/{self.hkv}_d{self.d}/{self.dv}_{mask}{extra}{docs}"

    @property
    def window_size(self) -> tuple[int, int]:
        return (self.window, 0 if self.causal else self.window) if self.window else (-1, -1)

    @property
    def fwd_flops(self) -> float:
        f = lambda b, s: cfg.attention_fwd_flops(b, s, s, self.hq, self.d, self.dv, self.causal, self.window)
        return sum(f(1, n) for n in self.doc_lens) if self.doc_lens else f(self.batch, self.seqlen)


def gen_cases(args) -> list[Case]:
    cases = []
    for c in cfg.gen_attention_test_cases(args.seqlens, args.tokens, causal=True):
        shape = (c.num_heads_q, c.num_heads_kv, c.head_dim_qk, c.head_dim_v)
        if args.quick and shape not in QUICK_SHAPES:
            continue
        cases.append(Case(*shape, c.batch, c.seqlen, True, c.window, c.sinks))
        if shape in NONCAUSAL_SHAPES and not args.quick:
            cases.append(Case(*shape, c.batch, c.seqlen, False))
    if not args.no_varlen:
        docs = tuple(cfg.gen_attention_doc_lens(args.tokens, max_len=max(args.seqlens), seed=args.seed))
        cases.append(Case(*VARLEN_SHAPE, 1, max(docs), True, doc_lens=docs))
    return cases


###############################################################################
# Inputs, ours, the baseline
###############################################################################


def make_inputs(case: Case, dtype: torch.dtype) -> dict:
    """q, k, v (leaves), dout and the sink; packed [T, H, D] for varlen, else [B, S, H, D]."""
    lead = (sum(case.doc_lens),) if case.doc_lens else (case.batch, case.seqlen)
    t = lambda h, d: torch.randn(*lead, h, d, device="cuda", dtype=dtype)
    x = {"q": t(case.hq, case.d), "k": t(case.hkv, case.d), "v": t(case.hkv, case.dv), "dout": t(case.hq, case.dv)}
    for name in ("q", "k", "v"):
        x[name].requires_grad_()
    x["sink"] = torch.randn(case.hq, device="cuda").requires_grad_() if case.sinks else None
    return x


def ours_fn(case: Case, turbo, fp8: bool = False):
    """Ours on the case: flash_attn_func (or its varlen form), or the FP8 functions with ``fp8``."""
    kw = {"causal": case.causal, "window_size": case.window_size}
    ops = turbo.ops
    if case.doc_lens:
        cu = torch.tensor((0, *case.doc_lens), device="cuda").cumsum(0).to(torch.int32)
        n = max(case.doc_lens)
        fn = ops.flash_attn_varlen_fp8_func if fp8 else ops.flash_attn_varlen_func
        return lambda q, k, v, sink: fn(q, k, v, cu, cu, n, n, sink=sink, **kw)
    fn = ops.flash_attn_fp8_func if fp8 else ops.flash_attn_func
    return lambda q, k, v, sink: fn(q, k, v, sink=sink, **kw)


def _sdpa(backend, q, k, v, causal, mask=None, gqa=False):
    """SDPA on [B, S, H, D] views (transposed to its [B, H, S, D] without a copy)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, backend)]):
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
            is_causal=causal and mask is None, enable_gqa=gqa,
        )  # fmt: skip
    return o.transpose(1, 2)


@dataclass
class Baseline:
    """SDPA with the inputs it takes: ``prepare(x)`` builds its leaves from ours (outside the timed
    region), ``fn(*leaves)`` runs it, ``grads_back`` maps its gradients onto q, k, v's shapes."""

    fn: object
    prepare: object
    grads_back: object
    backend: str


def _baselines(case: Case, dtype: torch.dtype, mask_budget: int):
    """Candidate (label, fn, prepare, grads_back) in order of preference."""
    g = case.hq // case.hkv
    rep = lambda t: t.detach().repeat_interleave(g, dim=-2).requires_grad_()  # k/v heads repeated to q's
    fold = lambda t: t.unflatten(-2, (case.hkv, g)).sum(-2)  # and their gradients summed back
    ident = lambda x: (x["q"], x["k"], x["v"])
    expanded = lambda x: (x["q"], rep(x["k"]), rep(x["v"]))
    same = lambda gq, gk, gv: (gq, gk, gv)
    folded = lambda gq, gk, gv: (gq, fold(gk), fold(gv))

    if case.doc_lens:
        offs = [0]
        for n in case.doc_lens:
            offs.append(offs[-1] + n)

        def per_doc(backend, gqa):
            def fn(q, k, v):
                docs = itertools.pairwise(offs)
                return torch.cat(
                    [_sdpa(backend, q[None, a:b], k[None, a:b], v[None, a:b], case.causal, gqa=gqa)[0] for a, b in docs]
                )

            return fn

        for b in BACKENDS:
            yield f"{b} per document", per_doc(b, g > 1), ident, same
        for b in BACKENDS:
            yield f"{b} per document, kv expanded", per_doc(b, False), expanded, folded
        return

    if case.window or case.sinks:
        yield "FLEX_ATTENTION (compiled, block mask)", *_flex_window_sink(case, g)
        s = case.seqlen
        if case.hq * s * (s + 1) * 2 > mask_budget:
            return  # the explicit mask does not fit
        mask = _window_sink_mask(case, dtype)
        pad = lambda t: torch.cat((t.detach(), t.new_zeros(t.shape[0], 1, *t.shape[2:])), 1).requires_grad_()

        def with_sink(x):  # one extra key of value 0 whose logit is the sink (the mask's last column)
            mask[..., -1] = x["sink"].detach().to(dtype)[:, None] if x["sink"] is not None else float("-inf")
            return x["q"], pad(x["k"]), pad(x["v"])

        def with_sink_expanded(x):
            q, k, v = with_sink(x)
            return q, rep(k), rep(v)

        drop = lambda gq, gk, gv: (gq, gk[:, :-1], gv[:, :-1])
        for b in BACKENDS:
            yield f"{b} + mask", lambda q, k, v, b=b: _sdpa(b, q, k, v, False, mask, g > 1), with_sink, drop
        for b in BACKENDS:
            fn = lambda q, k, v, b=b: _sdpa(b, q, k, v, False, mask)
            yield f"{b} + mask, kv expanded", fn, with_sink_expanded, lambda *gs: drop(*folded(*gs))
        return

    for b in BACKENDS:
        yield b, lambda q, k, v, b=b: _sdpa(b, q, k, v, case.causal, gqa=g > 1), ident, same
    if g > 1:
        for b in BACKENDS:
            yield f"{b}, kv expanded", lambda q, k, v, b=b: _sdpa(b, q, k, v, case.causal), expanded, folded


def _flex_window_sink(case: Case, g: int, device: str = "cuda", compiled: bool = True):
    """(fn, prepare, grads_back) of FlexAttention for a window and/or sinks: the window as a block
    mask (blocks outside it skipped), each sink joined to its head's softmax denominator through
    the returned log-sum-exp (natural log): out * exp(lse) / (exp(lse) + exp(sink)) = out *
    sigmoid(lse - sink). The sink is a constant here, as in the masked SDPA baseline. Built in
    prepare (inside pick_baseline's try: a torch without FlexAttention moves on to the next
    candidate), compiled afresh per case (dynamo would fall back to the eager, materializing
    version past its recompile limit)."""
    left, right = case.window_size
    right = 0 if case.causal else right

    def visible(b, h, q_idx, kv_idx):
        ok = kv_idx >= 0
        if left >= 0:
            ok = ok & (kv_idx >= q_idx - left)
        if right >= 0:
            ok = ok & (kv_idx <= q_idx + right)
        return ok

    state = {}

    def prepare(x):
        if "mask" not in state:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            torch._dynamo.reset()
            # The backward is timed alone, replayed on one forward graph (retain_graph=True), which
            # a compiled backward with donated buffers refuses.
            torch._functorch.config.donated_buffer = False
            state["flex"] = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
            state["mask"] = create_block_mask(visible, None, None, case.seqlen, case.seqlen, device=device)
        state["sink"] = None if x["sink"] is None else x["sink"].detach().float()[None, :, None]
        return x["q"], x["k"], x["v"]

    def fn(q, k, v):
        o, lse = state["flex"](q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=state["mask"],
                               enable_gqa=g > 1, return_lse=True)
        if state["sink"] is not None:
            o = (o.float() * torch.sigmoid(lse - state["sink"])[..., None]).to(q.dtype)
        return o.transpose(1, 2)

    return fn, prepare, lambda gq, gk, gv: (gq, gk, gv)


def _window_sink_mask(case: Case, dtype: torch.dtype) -> torch.Tensor:
    """Additive [1, Hq, S, S + 1] mask: 0 where a key is visible, -inf elsewhere; the last column
    (the sink logit) is filled per input set by the baseline's prepare."""
    s = case.seqlen
    i = torch.arange(s, device="cuda")[:, None]
    j = torch.arange(s, device="cuda")[None, :]
    visible = torch.ones(s, s, dtype=torch.bool, device="cuda")
    left, right = case.window_size
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    if case.causal:  # also without a window (sinks alone)
        visible &= j <= i
    mask = torch.zeros(1, case.hq, s, s + 1, device="cuda", dtype=dtype)
    mask[..., :s].masked_fill_(~visible, float("-inf"))
    return mask


def pick_baseline(case: Case, x: dict, mask_budget: int) -> tuple[Baseline | None, str]:
    """The first candidate that runs forward and backward on these inputs, or (None, why)."""
    tried = []
    for label, fn, prepare, back in _baselines(case, x["q"].dtype, mask_budget):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SDPA explains each refusal; the note keeps one line
                leaves = prepare(x)
                out = fn(*leaves)
                torch.autograd.grad(out, leaves, x["dout"])
            torch.cuda.synchronize()
            return Baseline(fn, prepare, back, label), ""
        # SDPA's refusals ("No available kernel"), unsupported shapes, compile errors, no FlexAttention.
        except (RuntimeError, NotImplementedError, ValueError, AssertionError, ImportError) as e:
            tried.append(f"{label}: {str(e).splitlines()[0][:80]}")
    return None, "no torch backend ran: " + "; ".join(tried)


###############################################################################
# Correctness
###############################################################################


def reference_rows(case: Case, x: dict, scale: float):
    """float32 out and dq of REF_ROWS query rows (spread over the sequence) x REF_HEADS heads of the
    first sequence (the longest document for varlen): rows are independent, so these are exact."""
    if case.doc_lens:
        n = max(case.doc_lens)
        start = sum(case.doc_lens[: case.doc_lens.index(n)])
        seq = lambda t: t[start : start + n]
    else:
        seq = lambda t: t[0]
    q, k, v, dout = (seq(x[name]).detach() for name in ("q", "k", "v", "dout"))
    s = q.shape[0]
    rows = torch.linspace(0, s - 1, min(REF_ROWS, s), device="cuda").long().unique()
    heads = torch.arange(min(REF_HEADS, case.hq), device="cuda")
    kv_heads = heads // (case.hq // case.hkv)
    qr = q[rows][:, heads].float().requires_grad_()
    kr, vr = k[:, kv_heads].float(), v[:, kv_heads].float()
    logits = torch.einsum("rhd,khd->hrk", qr, kr) * scale
    j = torch.arange(s, device="cuda")[None, :]
    visible = torch.ones(len(rows), s, dtype=torch.bool, device="cuda")
    left, right = case.window_size if case.window else (-1, 0 if case.causal else -1)
    if left >= 0:
        visible &= j >= rows[:, None] - left
    if right >= 0:
        visible &= j <= rows[:, None] + right
    logits = logits.masked_fill(~visible, float("-inf"))
    if x["sink"] is not None:
        logits = torch.cat((logits, x["sink"].detach()[heads].view(-1, 1, 1).expand(-1, len(rows), 1)), -1)
    p = logits.softmax(-1)[..., :s]
    out = torch.einsum("hrk,khd->rhd", p, vr)
    (dq,) = torch.autograd.grad(out, qr, dout[rows][:, heads].float())
    pick = lambda t: seq(t)[rows][:, heads]
    return pick, out.detach(), dq


def check_case(case: Case, x: dict, ours, base: Baseline | None, gate=bu.ATTENTION_GATE) -> dict:
    leaves = [x["q"], x["k"], x["v"]] + ([x["sink"]] if x["sink"] is not None else [])
    bu.poison_allocator([x["dout"].shape], x["dout"].dtype)  # an unwritten output element shows as NaN
    out = ours(x["q"], x["k"], x["v"], x["sink"])
    dq, dk, dv = torch.autograd.grad(out, leaves, x["dout"])[:3]
    results = {}
    pick, ref_out, ref_dq = reference_rows(case, x, case.d**-0.5)
    results["out_ref"] = bu.check_close(pick(out.detach()), ref_out, gate=gate, what="out vs float32")
    results["dq_ref"] = bu.check_close(pick(dq), ref_dq, gate=gate, what="dq vs float32")
    if base is not None:
        bleaves = base.prepare(x)
        bout = base.fn(*bleaves)
        bgrads = base.grads_back(*torch.autograd.grad(bout, bleaves, x["dout"]))
        for name, a, b in zip(("out", "dq", "dk", "dv"), (out.detach(), dq, dk, dv), (bout.detach(), *bgrads)):
            results[name] = bu.check_close(a, b, gate=gate, what=f"{name} vs SDPA")
    bad = [r for r in results.values() if not r]
    grads = [results[n].snr_db for n in ("dq", "dk", "dv") if n in results]
    return {
        "Check": "FAIL" if bad else "PASS",
        "Out SNR vs Baseline (dB)": results["out"].snr_db if "out" in results else float("nan"),
        "Min Grad SNR vs Baseline (dB)": min(grads) if grads else float("nan"),
        "Out SNR vs Reference (dB)": results["out_ref"].snr_db,
        "dQ SNR vs Reference (dB)": results["dq_ref"].snr_db,
        "Note": "; ".join(r.message for r in bad),
    }


###############################################################################
# Timing and one case
###############################################################################


def time_fwd_bwd(fn, leaves: tuple, dout: torch.Tensor, args) -> tuple[float, float]:
    """Median ms of the forward (autograd recording, as in training) and of the backward
    (autograd.grad of the output, produced once outside the timed region)."""
    fwd = bu.time_cuda(lambda: fn(*leaves), warmup=args.warmup, iters=args.iters)
    out = fn(*leaves)
    wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    bwd = bu.time_cuda(
        lambda: torch.autograd.grad(out, wrt, dout, retain_graph=True), warmup=args.warmup, iters=args.iters
    )
    return fwd, bwd


def run_case(row: dict, case: Case, dtype: torch.dtype, turbo, args) -> None:
    nan = float("nan")
    notes = []
    torch.cuda.reset_peak_memory_stats()
    x = make_inputs(case, dtype)
    ours = ours_fn(case, turbo, fp8=args.fp8)
    base, why = pick_baseline(case, x, int(args.mask_budget_gb * 2**30))
    if why:
        notes.append(why)
    row["Baseline Backend"] = base.backend if base else "none"
    try:
        row.update(check_case(case, x, ours, base, bu.FP8_ATTENTION_GATE if args.fp8 else bu.ATTENTION_GATE))
    except Exception as e:  # noqa: BLE001 -- one bad case must not end the run
        traceback.print_exc()
        row.update(Check="ERROR", Note=f"check: {type(e).__name__}: {e}"[:300])
    if row.get("Note"):
        notes.append(row["Note"])
    fwd = bwd = bfwd = bbwd = nan
    if row["Check"] == "PASS":
        try:
            fwd, bwd = time_fwd_bwd(ours, (x["q"], x["k"], x["v"], x["sink"]), x["dout"], args)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row["Check"] = "ERROR"
            notes.append(f"timing: {type(e).__name__}: {e}"[:300])
    if base is not None:
        try:
            bfwd, bbwd = time_fwd_bwd(base.fn, base.prepare(x), x["dout"], args)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            notes.append(f"baseline timing: {type(e).__name__}: {e}"[:300])
    bf16_fwd = bf16_bwd = nan  # with --fp8: our 16-bit functions on the same inputs
    if args.fp8 and row["Check"] == "PASS":
        bf16_fwd, bf16_bwd = time_fwd_bwd(ours_fn(case, turbo), (x["q"], x["k"], x["v"], x["sink"]), x["dout"], args)
    f = case.fwd_flops
    row.update(
        {
            "BF16 Forward TFLOPS": bu.tflops(f, bf16_fwd),
            "BF16 Step TFLOPS": bu.tflops(3.5 * f, bf16_fwd + bf16_bwd),
            "Forward Time (ms)": fwd,
            "Forward TFLOPS": bu.tflops(f, fwd),
            "Backward Time (ms)": bwd,
            "Backward TFLOPS": bu.tflops(2.5 * f, bwd),
            "Step TFLOPS": bu.tflops(3.5 * f, fwd + bwd),
            "Baseline Forward Time (ms)": bfwd,
            "Baseline Forward TFLOPS": bu.tflops(f, bfwd),
            "Baseline Backward Time (ms)": bbwd,
            "Baseline Backward TFLOPS": bu.tflops(2.5 * f, bbwd),
            "Baseline Step TFLOPS": bu.tflops(3.5 * f, bfwd + bbwd),
            "Peak Mem (GB)": torch.cuda.max_memory_allocated() / 2**30,
            "Note": " | ".join(notes),
        }
    )
    for d in ("Forward", "Backward", "Step"):
        o, b = row[f"{d} TFLOPS"], row[f"Baseline {d} TFLOPS"]
        row[f"{d} Ratio"] = o / b if math.isfinite(o) and math.isfinite(b) and b > 0 else nan


###############################################################################
# Main
###############################################################################


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--seqlens", nargs="+", type=int, default=None, help=f"default: {list(cfg.ATTENTION_SEQLENS)}")
    p.add_argument(
        "--tokens", type=int, default=None, help=f"tokens per step (default {cfg.ATTENTION_TOKENS_PER_STEP})"
    )
    p.add_argument("--quick", action="store_true", help=f"three shapes: GQA and MLA at {QUICK_SEQLEN}, and varlen")
    p.add_argument("--no-varlen", action="store_true", help="skip the packed-documents case")
    p.add_argument("--mask-budget-gb", type=float, default=2.0, help="largest explicit SDPA mask (window + sinks)")
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--tag", default=None, help="suffix of the file and summary-entry names")
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--no-summary", action="store_true")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--backend",
        choices=("auto", "TURBO", "CUDNN", "AUTOTUNE"),
        default="auto",
        help="attention backend of ours (auto: unset, the library's choice per shape; AUTOTUNE: both measured "
        "per problem at first sight, the faster kept)",
    )
    p.add_argument(
        "--fp8",
        action="store_true",
        help="ours = flash_attn_fp8_func (FP8 gate; also times our 16-bit functions): entries attn_fp8_fwd/_step",
    )
    args = p.parse_args(argv)
    args.default_set = args.seqlens is None and args.tokens is None and not args.quick
    args.seqlens = args.seqlens or ([QUICK_SEQLEN] if args.quick else list(cfg.ATTENTION_SEQLENS))
    args.tokens = args.tokens or cfg.ATTENTION_TOKENS_PER_STEP
    return args


def report(rows, args, gpu_name, gpu, out_dir, csv_path, tag) -> None:
    print()
    print(bu.format_table(rows, [c for c, _ in TABLE], [h for _, h in TABLE]))
    nan = float("nan")
    suffix = f"_{tag}" if tag else ""
    if args.fp8:
        report_fp8(rows, args, gpu_name, gpu, csv_path, suffix)
        return
    # Window / sink cases have their own baseline (FlexAttention or a masked SDPA): their own entry.
    plain = [r for r in rows if r["Kind"] != "varlen" and not r["Window"] and not r["Sinks"]]
    groups = {
        f"attn_{args.dtype}_fwd": (plain, "Forward"),
        f"attn_{args.dtype}_bwd": (plain, "Backward"),
        f"attn_{args.dtype}_step": (plain, "Step"),
        f"attn_mla_{args.dtype}_step": ([r for r in rows if r["Kind"] == "mla"], "Step"),
        f"attn_window_sink_{args.dtype}_step": ([r for r in rows if r["Window"] or r["Sinks"]], "Step"),
        f"attn_varlen_{args.dtype}_step": ([r for r in rows if r["Kind"] == "varlen"], "Step"),
    }
    for name, (group, d) in groups.items():
        if not group:
            continue
        backends = sorted({r.get("Baseline Backend", "none") for r in group})
        entry = group_entry(
            group, d, "Baseline", BASELINE, args, gpu_name, csv_path, baseline_backends=backends,
            cudnn=torch.backends.cudnn.version(), ours_backend=args.backend,
        )  # fmt: skip
        publish(args, gpu, name + suffix, entry, BASELINE)
        print(f"    over {entry['compared']} cases; all ours {entry['ours_all_geomean']:.1f}")
    bu.plot_comparison(
        out_dir / f"{csv_path.stem}.png",
        [f"{r['Case']} S{r['SeqLen']}" for r in rows],
        [r.get("Step TFLOPS", nan) for r in rows],
        [r.get("Baseline Step TFLOPS", nan) for r in rows],
        metric="Step TFLOPS (3.5x forward FLOPs / (fwd + bwd))",
        title=f"Attention {args.dtype} on {gpu_name}: turbo.ops.flash_attn_func vs {BASELINE}",
        baseline_label=BASELINE,
        failed=[r.get("Check") in ("FAIL", "ERROR") for r in rows],
    )


def group_entry(group, d, baseline, baseline_name, args, gpu_name, csv_path, **extra) -> dict:
    """The summary entry of rows `group` for direction d ("Forward", "Step", ...): our `d TFLOPS`
    against the rows' `<baseline> d TFLOPS`, geomean over the passing rows."""
    nan = float("nan")
    passed = [r.get("Check") == "PASS" for r in group]
    extra.setdefault("dtype", args.dtype)
    return bu.summary_entry(
        ours=[r.get(f"{d} TFLOPS", nan) for r in group],
        baseline_values=[r.get(f"{baseline} {d} TFLOPS", nan) for r in group],
        passed=passed,
        metric=f"{d.lower()} TFLOPS",
        baseline=baseline_name,
        gpu=gpu_name,
        ours_all_geomean=bu.geomean(r.get(f"{d} TFLOPS") for r, p in zip(group, passed) if p),
        failed=sum(r.get("Check") == "FAIL" for r in group),
        errors=sum(r.get("Check") == "ERROR" for r in group),
        seqlens=list(args.seqlens),
        tokens=args.tokens,
        torch=torch.__version__,
        csv=csv_path.name,
        **extra,
    )


def publish(args, gpu, name, entry, against) -> None:
    if not args.no_summary:
        bu.update_summary(args.output_dir, gpu, name, entry)
    print(
        f"[bench_attention] {name}: {entry['passed']}/{entry['cases']} passed; {entry['metric']} geomean "
        f"{entry['ours_geomean']:.1f} vs {against} {entry['baseline_geomean']:.1f}: ratio {entry['ratio_geomean']:.3f} "
        f"(min {entry['ratio_min']:.3f})"
    )


def report_fp8(rows, args, gpu_name, gpu, csv_path, suffix) -> None:
    """attn_fp8_fwd / attn_fp8_step: FP8 TFLOPS against our 16-bit functions (the targets' ratio),
    with the ratio to SDPA beside it."""
    for name, d in (("attn_fp8_fwd", "Forward"), ("attn_fp8_step", "Step")):
        passed = [r.get("Check") == "PASS" for r in rows]
        vs_sdpa = bu.geomean(r.get(f"{d} Ratio") for r, p in zip(rows, passed) if p)
        entry = group_entry(
            rows, d, "BF16", "ours bf16 (flash_attn_func, backend unset)", args, gpu_name, csv_path,
            dtype=f"fp8 (inputs {args.dtype})", ratio_vs_sdpa_geomean=vs_sdpa,
        )  # fmt: skip
        publish(args, gpu, name + suffix, entry, "ours bf16")
        print(f"    vs {BASELINE}: ratio {vs_sdpa:.3f}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_attention: no CUDA device", file=sys.stderr)
        return 2
    import primus_turbo.pytorch as turbo

    if args.backend == "AUTOTUNE":
        turbo.core.backend.GlobalBackendManager.set_attn_backend(None, auto_tune=True)
    elif args.backend != "auto":
        turbo.core.backend.GlobalBackendManager.set_attn_backend(args.backend)
    dtype = bu.DTYPES[args.dtype]
    cases = gen_cases(args)
    gpu_name = torch.cuda.get_device_name()
    gpu = bu.gpu_short_name(gpu_name)
    out_dir = bu.results_dir_for(args.output_dir, gpu)
    tag = args.tag if args.tag is not None else ("" if args.default_set else ("quick" if args.quick else "subset"))
    stem = f"attn_fp8_{args.dtype}" if args.fp8 else f"attn_{args.dtype}"
    csv_path = out_dir / f"{stem}{'_' + tag if tag else ''}.csv"
    print(
        f"[bench_attention] {len(cases)} cases on {gpu_name}; torch {torch.__version__}, cuDNN "
        f"{torch.backends.cudnn.version()}; {args.tokens} tokens a step; commit {bu.git_commit()}",
        flush=True,
    )
    rows = []
    for i, case in enumerate(cases, 1):
        row = {
            "TestID": i, "GPU": gpu, "Case": case.name, "Kind": case.kind, "Batch": case.batch,
            "SeqLen": case.seqlen, "HeadsQ": case.hq, "HeadsKV": case.hkv, "DimQK": case.d, "DimV": case.dv,
            "Causal": case.causal, "Window": case.window or "", "Sinks": case.sinks, "dtype": args.dtype,
            "Backend": args.backend,
        }  # fmt: skip
        rows.append(row)
        t0 = time.perf_counter()
        torch.manual_seed(args.seed + i)
        try:
            run_case(row, case, dtype, turbo, args)
        except Exception as e:  # noqa: BLE001 -- e.g. out of memory while allocating inputs
            traceback.print_exc()
            row.update(Check="ERROR", Note=f"case: {type(e).__name__}: {e}"[:300])
        torch.cuda.empty_cache()
        fmt = lambda key, row=row: f"{row.get(key, float('nan')):.0f}"
        print(
            f"[{i:>2}/{len(cases)}] {case.name:<34} S={case.seqlen:<6} B={case.batch:<2} {row['Check']:<5} "
            f"ours fwd {fmt('Forward TFLOPS')} bwd {fmt('Backward TFLOPS')} step {fmt('Step TFLOPS')} | "
            f"{row.get('Baseline Backend', '-')}: step {fmt('Baseline Step TFLOPS')} | ratio "
            f"{row.get('Step Ratio', float('nan')):.3f} ({time.perf_counter() - t0:.1f}s)",
            flush=True,
        )
        bu.write_csv(csv_path, rows, COLUMNS)  # partial results survive a crash
    report(rows, args, gpu_name, gpu, out_dir, csv_path, tag)
    print(f"[bench_attention] results: {csv_path}")
    return 0 if all(r.get("Check") == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
