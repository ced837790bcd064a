"""Grouped GEMM (MoE experts) benchmark: turbo.ops.grouped_gemm against torch._grouped_mm on the MoE
shape table (config.gen_grouped_gemm_test_cases), forward, backward (dgrad + wgrad) and the
combined training step, with balanced and skewed group sizes.

    python benchmark/ops/bench_grouped_gemm.py --quick --autotune       # a few minutes
    python benchmark/ops/bench_grouped_gemm.py --autotune               # every model, EP, token count
    python benchmark/ops/bench_grouped_gemm.py --models DeepSeek-V3 --ep 8 --tokens 4096

Per case (x [T, K], w [G, N, K] used as x_g @ w_g^T, like GroupedLinear; grad [T, N]):
  1. correctness first: our forward, dgrad and wgrad (and the baseline's) against per-group float32
     references of the same inputs (TF32 off) under the gates of shared/ACCURACY.md; a FAIL or
     ERROR voids our timings (NaN);
  2. timing (CUDA events, median of >= 50 calls): forward, backward (dgrad + wgrad) and their sum,
     the combined step. TFLOPS count 2*T*N*K per GEMM, whatever the split.
Writes <output-dir>/<gpu>/grouped_gemm_<dtype>[_<tag>].csv, a PNG and the summary.json entry
grouped_gemm_<dtype>[_<tag>] (combined-step TFLOPS). Exits 1 if a case failed.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

import torch

if __package__:  # imported as benchmark.ops.bench_grouped_gemm
    from . import bench_utils as bu
    from . import config as cfg
    from . import grouped_common as gc
else:  # run as a script; only this directory on sys.path (never the repository root)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_utils as bu  # type: ignore[no-redef]
    import config as cfg  # type: ignore[no-redef]
    import grouped_common as gc  # type: ignore[no-redef]

METRIC = "combined step TFLOPS"
BASELINE_NAME = "torch._grouped_mm"
QUICK_MODELS = ("DeepSeek-V3", "Qwen3-30B-A3B", "Qwen3-235B-A22B", "Mixtral-8x7B", "GPT-OSS-20B", "DeepSeek-V2-Lite")
QUICK_TOKENS = (1024, 4096)

COLUMNS = [
    "TestID", "GPU", *gc.CASE_COLUMNS, "dtype", "Check",
    "Forward Time (ms)", "Forward TFLOPS", "Backward Time (ms)", "Backward TFLOPS", "Combined TFLOPS",
    "Baseline Forward TFLOPS", "Baseline Backward TFLOPS", "Baseline Combined TFLOPS", "Baseline Check",
    "Forward Ratio", "Backward Ratio", "Combined Ratio", *gc.SNR_COLUMNS,
    "Note",
]
TABLE_COLUMNS = [
    ("Case", "Case"), ("EP", "EP"), ("Tokens/Expert", "Tok/E"), ("Balanced", "Bal"), ("Check", "Check"),
    ("Forward TFLOPS", "Fwd"), ("Backward TFLOPS", "Bwd"), ("Combined TFLOPS", "Step"),
    ("Baseline Combined TFLOPS", "Base step"), ("Combined Ratio", "Ratio"),
]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--models", nargs="+", default=None, help="MoE models (default: all)")
    p.add_argument("--ep", nargs="+", type=int, default=None, help=f"default: {list(cfg.EP_SIZES)}")
    p.add_argument("--tokens", nargs="+", type=int, default=None,
                   help=f"average tokens per expert (default: {list(cfg.GROUPED_GEMM_TOKENS_PER_EXPERT)})")
    p.add_argument("--quick", action="store_true",
                   help=f"{', '.join(QUICK_MODELS)} at their largest EP, {list(QUICK_TOKENS)} tokens per expert")
    p.add_argument("--autotune", action="store_true", help="autotune our kernel configs (the recommended setting)")
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--tag", default=None, help="suffix of the file and summary-entry names")
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS)
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds; start no new case after this (the summary covers the cases run)")
    p.add_argument("--no-summary", action="store_true")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    args.default_set = not args.quick and args.models is None and args.ep is None and args.tokens is None
    return args


def select_cases(args) -> list:
    return gc.select_cases(args, QUICK_MODELS, QUICK_TOKENS)


def check_impl(results, refs, dtype) -> tuple[bool, list, str]:
    ok, snrs, failures = gc.check_outputs(results, refs, dtype)
    return ok, snrs, "; ".join(failures)


def run_case(row: dict, case, dtype, args) -> None:
    nan = float("nan")
    lens_cpu, x, w, grad = gc.make_inputs(case, dtype, args.seed + row["TestID"])
    lens = lens_cpu.cuda()
    offs32 = torch.cumsum(lens_cpu, 0).to(torch.int32).cuda()
    ops = torch.ops.primus_turbo
    ours_fwd = lambda: ops.grouped_gemm(x, w, lens, None, True)
    ours_bwd = lambda: (ops.grouped_gemm(grad, w, lens, None, False), ops.grouped_gemm_wgrad(x, grad, lens, None, True))
    base_fwd = lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs32)
    base_bwd = lambda: (torch._grouped_mm(grad, w, offs=offs32), torch._grouped_mm(grad.t(), x, offs=offs32))

    flops = case.fwd_flops
    refs = gc.references(lens_cpu, x, w, grad)
    try:
        ok, snrs, msg = check_impl([ours_fwd(), *ours_bwd()], refs, dtype)
    except Exception as e:  # an error is a failed case, not a crashed benchmark
        traceback.print_exc()
        ok, snrs, msg = False, [nan] * 3, f"ERROR {type(e).__name__}: {e}"
    row["Check"] = "PASS" if ok else "FAIL"
    row.update(zip(gc.SNR_COLUMNS, snrs))
    notes = [msg] if msg else []
    try:
        base_ok, _, base_msg = check_impl([base_fwd(), *base_bwd()], refs, dtype)
    except Exception as e:
        base_ok, base_msg = False, f"baseline ERROR {type(e).__name__}: {e}"
    row["Baseline Check"] = "PASS" if base_ok else "FAIL"
    if base_msg:
        notes.append("baseline: " + base_msg)
    del refs

    t_f, t_b = gc.time_pair(ours_fwd, ours_bwd, ok, args.iters)
    b_f, b_b = gc.time_pair(base_fwd, base_bwd, base_ok, args.iters)
    row["Forward Time (ms)"], row["Backward Time (ms)"] = t_f, t_b
    row["Forward TFLOPS"], row["Backward TFLOPS"] = bu.tflops(flops, t_f), bu.tflops(2 * flops, t_b)
    row["Combined TFLOPS"] = bu.tflops(3 * flops, t_f + t_b)
    row["Baseline Forward TFLOPS"], row["Baseline Backward TFLOPS"] = bu.tflops(flops, b_f), bu.tflops(2 * flops, b_b)
    row["Baseline Combined TFLOPS"] = bu.tflops(3 * flops, b_f + b_b)
    for d in ("Forward", "Backward", "Combined"):
        row[f"{d} Ratio"] = row[f"{d} TFLOPS"] / row[f"Baseline {d} TFLOPS"]
    row["Note"] = " | ".join(notes)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_grouped_gemm: no CUDA device", file=sys.stderr)
        return 2
    import primus_turbo.pytorch as turbo  # noqa: F401  (registers the ops)
    from primus_turbo.pytorch.core.backend import GlobalBackendManager

    torch.backends.cuda.matmul.allow_tf32 = False
    if args.autotune:
        GlobalBackendManager.set_grouped_gemm_backend(auto_tune=True)
    dtype = bu.DTYPES[args.dtype]
    cases = select_cases(args)
    gpu_name = torch.cuda.get_device_name()
    gpu = bu.gpu_short_name(gpu_name)
    out_dir = bu.results_dir_for(args.output_dir, gpu)
    tag = gc.run_tag(args)
    stem = f"grouped_gemm_{args.dtype}{'_' + tag if tag else ''}"
    csv_path = out_dir / f"{stem}.csv"
    print(f"[bench_grouped_gemm] {len(cases)} cases on {gpu_name}; autotune={args.autotune}", flush=True)

    rows = []
    start = time.monotonic()
    for i, case in enumerate(cases, 1):
        if gc.budget_reached(args, start):
            print(f"[bench_grouped_gemm] time budget reached: {i - 1} of {len(cases)} cases run", flush=True)
            break
        row = {"TestID": i, "GPU": gpu, **gc.case_fields(case), "dtype": args.dtype}
        run_case(row, case, dtype, args)
        rows.append(row)
        print(
            f"[{i:>3}/{len(cases)}] {case.name:<28} EP={case.EP:<2} G={case.G:<3} T/E={case.tokens_per_expert:<5} "
            f"{'bal ' if case.balanced else 'skew'} {row['Check']:<4} fwd {row['Forward TFLOPS']:.0f} "
            f"bwd {row['Backward TFLOPS']:.0f} step {row['Combined TFLOPS']:.0f} TFLOPS | base step "
            f"{row['Baseline Combined TFLOPS']:.0f} | ratio {row['Combined Ratio']:.3f}",
            flush=True,
        )
        gc.write_rows(csv_path, rows, COLUMNS)

    gc.print_table(rows, TABLE_COLUMNS)
    passed = [r.get("Check") == "PASS" for r in rows]
    labels = [f"{r['Case']} EP{r['EP']} {r['Tokens/Expert']}{'' if r['Balanced'] else ' skew'}" for r in rows]
    bu.plot_comparison(
        out_dir / f"{stem}.png", labels, [r["Combined TFLOPS"] for r in rows],
        [r["Baseline Combined TFLOPS"] for r in rows], metric=METRIC,
        title=f"Grouped GEMM {args.dtype} on {gpu_name}", baseline_label=BASELINE_NAME, failed=[not p for p in passed],
    )
    entry = bu.summary_entry(
        ours=[r["Combined TFLOPS"] for r in rows],
        baseline_values=[r["Baseline Combined TFLOPS"] for r in rows],
        passed=passed,
        metric=METRIC,
        baseline=BASELINE_NAME,
        gpu=gpu_name,
        dtype=args.dtype,
        autotune=args.autotune,
        case_set=gc.case_set(args),
        cases_planned=len(cases),
        forward_ratio_geomean=gc.passed_geomean(rows, passed, "Forward Ratio"),
        backward_ratio_geomean=gc.passed_geomean(rows, passed, "Backward Ratio"),
        torch=torch.__version__,
        csv=csv_path.name,
    )
    if not args.no_summary:
        bu.update_summary(args.output_dir, gpu, stem, entry)
    print(
        f"[bench_grouped_gemm] {stem}: {entry['passed']}/{entry['cases']} passed; combined step geomean "
        f"{entry['ours_geomean']:.0f} TFLOPS vs {BASELINE_NAME} {entry['baseline_geomean']:.0f}: ratio "
        f"{entry['ratio_geomean']:.3f} (min {entry['ratio_min']:.3f}; fwd {entry['forward_ratio_geomean']:.3f}, "
        f"bwd {entry['backward_ratio_geomean']:.3f})"
    )
    print(f"[bench_grouped_gemm] results: {csv_path}")
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
