"""Pieces shared by the grouped GEMM benchmarks (bench_grouped_gemm, bench_grouped_gemm_fp8): the
case selection on the MoE shape table, the inputs and their group sizes, the per-group float32
references, the output checks, the timing of a (forward, backward) pair and the row bookkeeping.

Imports only torch, the standard library and the sibling modules bench_utils / config.
"""

from __future__ import annotations

import time

import torch

if __package__:
    from . import bench_utils as bu
    from . import config as cfg
else:  # the bench scripts put this directory on sys.path
    import bench_utils as bu  # type: ignore[no-redef]
    import config as cfg  # type: ignore[no-redef]

#: The CSV columns that describe a case, in order (see case_fields).
CASE_COLUMNS = ["Case", "EP", "G", "Tokens/Expert", "Balanced", "M", "N", "K"]
#: The per-output SNR columns of check_outputs, in order.
SNR_COLUMNS = ["Out SNR (dB)", "DGrad SNR (dB)", "WGrad SNR (dB)"]


def select_cases(args, quick_models, quick_tokens, balanced_only: bool = False) -> list:
    """The cases of --models/--ep/--tokens; with --quick, each quick model at its largest EP that
    divides its experts (balanced group sizes only when ``balanced_only``)."""
    if not args.quick:
        return cfg.gen_grouped_gemm_test_cases(
            args.models, args.ep or cfg.EP_SIZES, args.tokens or cfg.GROUPED_GEMM_TOKENS_PER_EXPERT
        )
    cases = []
    for name in args.models or quick_models:
        experts = cfg.MOE_MODELS[cfg.resolve_moe_models([name])[0]].num_experts
        ep = max(e for e in (args.ep or cfg.EP_SIZES) if experts % e == 0 or e == min(cfg.EP_SIZES))
        picked = cfg.gen_grouped_gemm_test_cases([name], [ep], args.tokens or quick_tokens)
        cases += [c for c in picked if c.balanced] if balanced_only else picked
    return cases


def run_tag(args) -> str:
    """The file / summary-entry suffix: --tag, else "" (default set), "quick" or "subset"."""
    return args.tag if args.tag is not None else ("" if args.default_set else ("quick" if args.quick else "subset"))


def case_set(args) -> str:
    return "quick" if args.quick else ("default" if args.default_set else "subset")


def make_inputs(case, dtype, seed: int):
    """Group sizes (CPU) and x [T, K], w [G, N, K] (scaled by 1/sqrt(K)), grad [T, N] on the GPU."""
    lens_cpu = cfg.gen_grouped_gemm_group_lens(case.G, case.total_tokens, case.balanced, seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t, n, k = case.total_tokens, case.N, case.K
    x = torch.randn(t, k, device="cuda", dtype=dtype, generator=gen)
    w = (torch.randn(case.G, n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
    grad = torch.randn(t, n, device="cuda", dtype=dtype, generator=gen)
    return lens_cpu, x, w, grad


def references(lens_cpu, x, w, grad):
    """Per-group float32 references (TF32 off): out [T, N], dgrad [T, K], wgrad [G, N, K]."""
    offs = [0] + torch.cumsum(lens_cpu, 0).tolist()
    out = torch.empty(x.shape[0], w.shape[1], device="cuda")
    dx = torch.empty(x.shape, device="cuda")
    dw = torch.empty(w.shape, device="cuda")
    for g in range(w.shape[0]):
        s, e = offs[g], offs[g + 1]
        wg, xg, gg = w[g].float(), x[s:e].float(), grad[s:e].float()
        out[s:e] = xg @ wg.t()
        dx[s:e] = gg @ wg
        dw[g] = gg.t() @ xg
    return out, dx, dw


def check_outputs(results, refs, dtype=None, gate=None) -> tuple[bool, list, list]:
    """(out, dgrad, wgrad) against the references under the gate of ``dtype`` (or ``gate``):
    (all passed, the SNRs in dB, the messages of the failed checks)."""
    checks = [
        bu.check_close(r, ref, dtype, gate=gate, what=w) for r, ref, w in zip(results, refs, ("out", "dgrad", "wgrad"))
    ]
    return all(c.passed for c in checks), [c.snr_db for c in checks], [c.message for c in checks if not c.passed]


def time_pair(fwd, bwd, valid: bool, iters: int) -> tuple[float, float]:
    """Median ms of fwd, then of bwd; (NaN, NaN) without timing when not ``valid``."""
    if not valid:
        return float("nan"), float("nan")
    return bu.time_cuda(fwd, iters=iters), bu.time_cuda(bwd, iters=iters)


def budget_reached(args, start: float) -> bool:
    return args.time_budget is not None and time.monotonic() - start > args.time_budget


def case_fields(case) -> dict:
    """The CASE_COLUMNS values of a case."""
    return {
        "Case": case.name, "EP": case.EP, "G": case.G, "Tokens/Expert": case.tokens_per_expert,
        "Balanced": case.balanced, "M": case.total_tokens, "N": case.N, "K": case.K,
    }


def write_rows(csv_path, rows, columns) -> None:
    """Rewrites the CSV after each case (a crash keeps what ran) and frees the case's memory."""
    bu.write_csv(csv_path, rows, columns)
    torch.cuda.empty_cache()


def print_table(rows, table_columns) -> None:
    print()
    print(bu.format_table(rows, [c for c, _ in table_columns], [h for _, h in table_columns]))


def passed_geomean(rows, passed, column: str) -> float:
    """Geomean of ``column`` over the cases that passed."""
    return bu.geomean(r[column] for r, p in zip(rows, passed) if p)

