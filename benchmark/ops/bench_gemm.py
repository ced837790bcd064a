"""Dense GEMM benchmark: turbo.ops.gemm against torch.matmul on real-model shapes, forward + backward.

    python benchmark/ops/bench_gemm.py --dtype bf16
    python benchmark/ops/bench_gemm.py --dtype fp16 --models Llama-3.1-8B Qwen2.5-7B --mbs 1 2
    python benchmark/ops/bench_gemm.py --dtype bf16 --backend CUTLASS      # force a backend
    python benchmark/ops/bench_gemm.py --dtype bf16 --autotune             # let autotune pick
    python benchmark/ops/bench_gemm.py --dtype bf16 --quick                # smoke test

Per case (shapes from config.py; a [M, K] activations, b [N, K] weights, trans_b=True):
  1. correctness first: forward, dgrad and wgrad against float64 references of the same inputs,
     under the gates of shared/ACCURACY.md. A FAIL or ERROR voids our timings (NaN), which are
     then left out of every geomean;
  2. timing (CUDA events, median of >= 50 calls, inputs rotated so that L2 cannot serve repeats)
     of ours and of torch, in the same process on the same GPU and the same input sets.

Writes <output-dir>/<gpu>/gemm_<dtype>[_<tag>].csv and .png, and the entry gemm_<dtype>[_<tag>]
of <output-dir>/<gpu>/summary.json. The untagged names belong to the full default case set with
the library's default backend choice; otherwise the tag says what differs (the forced backend,
"autotune", "subset" for other models/micro-batches, "quick"), unless --tag names it.
The full default bf16 set takes about 6-7 minutes on an H100 (the estimate is printed first).
Exits with status 1 when any case failed its check or raised.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

if __package__:  # imported as benchmark.ops.bench_gemm (python -m from the repository root)
    from . import bench_utils as bu
    from . import config as cfg
else:  # run as a script: python benchmark/ops/bench_gemm.py
    # Only this directory goes on sys.path, never the repository root: that would shadow the
    # installed primus_turbo (with its compiled core) by the source tree.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_utils as bu  # type: ignore[no-redef]
    import config as cfg  # type: ignore[no-redef]

BASELINE_NAME = "torch.matmul"
METRIC = "combined TFLOPS"

COLUMNS = [
    "TestID",
    "GPU",
    "Case",
    "MBS",
    "M",
    "N",
    "K",
    "dtype",
    "Check",
    "Forward Time (ms)",
    "Forward TFLOPS",
    "Backward Time (ms)",
    "Backward TFLOPS",
    "Combined TFLOPS",
    "Baseline Forward Time (ms)",
    "Baseline Forward TFLOPS",
    "Baseline Backward Time (ms)",
    "Baseline Backward TFLOPS",
    "Baseline Combined TFLOPS",
    "Ratio",
    # diagnostics
    "Group",
    "Backend",
    "Fwd SNR (dB)",
    "Dgrad SNR (dB)",
    "Wgrad SNR (dB)",
    "Rotating Sets",
    "Peak Mem (GB)",
    "Note",
]

TABLE_COLUMNS = [
    ("Case", "Case"),
    ("MBS", "MBS"),
    ("M", "M"),
    ("N", "N"),
    ("K", "K"),
    ("Check", "Check"),
    ("Forward TFLOPS", "Fwd TF"),
    ("Backward TFLOPS", "Bwd TF"),
    ("Combined TFLOPS", "Comb TF"),
    ("Baseline Forward TFLOPS", "Base Fwd"),
    ("Baseline Backward TFLOPS", "Base Bwd"),
    ("Baseline Combined TFLOPS", "Base Comb"),
    ("Ratio", "Ratio"),
]


###############################################################################
# Arguments and backend
###############################################################################


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument(
        "--models",
        nargs="+",
        default=None,
        help=f"dense models (default: {' '.join(cfg.DEFAULT_GEMM_MODELS)}; 'all' for the whole table)",
    )
    p.add_argument("--mbs", nargs="+", type=int, default=None, help="micro-batch sizes (default: 1 2 4)")
    p.add_argument("--lm-head", action="store_true", help="also run the lm_head GEMM of each model")
    p.add_argument(
        "--backend",
        default=None,
        type=str.upper,
        help="force the GEMM backend (CUBLASLT, CUTLASS, ...); AUTO (default) leaves the choice to "
        "the library: PRIMUS_TURBO_GEMM_BACKEND, autotune, or its default",
    )
    p.add_argument(
        "--autotune", action="store_true", help="enable GEMM autotuning (GlobalBackendManager.set_auto_tune)"
    )
    p.add_argument(
        "--output-dir",
        default=str(bu.DEFAULT_RESULTS_DIR),
        help="results root; files go to <output-dir>/<gpu>/ (default: benchmark/results)",
    )
    p.add_argument(
        "--tag",
        default=None,
        help="suffix of the file and summary-entry names (default: the forced backend or 'autotune', "
        "plus 'subset' or 'quick' when the case set is not the default one; none for a default run)",
    )
    p.add_argument("--quick", action="store_true", help="smoke test: one model (Llama-3.1-8B), MBS 1")
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="CSV",
        help="report from the CSVs of runs over disjoint --models subsets (e.g. two device sessions) "
        "instead of running: writes the combined CSV, plot and summary entry as one full run would",
    )
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS, help="timed calls per measurement (>= 50)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up calls per measurement (fewer on huge shapes)")
    p.add_argument(
        "--mem-budget-gb",
        type=float,
        default=16.0,
        help="device memory allowed for the rotating input sets of one case",
    )
    p.add_argument("--no-square", action="store_true", help="skip the 8192^3 square-shape row")
    p.add_argument("--no-summary", action="store_true", help="do not update summary.json")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if args.iters < bu.MIN_TIMED_ITERS:
        p.error(f"--iters must be >= {bu.MIN_TIMED_ITERS}")
    args.default_set = args.models is None and args.mbs is None and not args.lm_head and not args.quick
    if args.quick:
        args.models = args.models or ["Llama-3.1-8B"]
        args.mbs = args.mbs or [1]
    args.mbs = args.mbs or list(cfg.MICRO_BATCH_SIZES)
    return args


def configure_backend(args: argparse.Namespace) -> tuple[str, str]:
    """Apply --backend/--autotune; return (label for the CSV, default tag for file names)."""
    from primus_turbo.pytorch.core.backend import BackendType, GlobalBackendManager

    GlobalBackendManager.reset()
    if args.backend == "AUTOTUNE":  # the library's own name for "let autotune pick"
        args.autotune = True
    forced = args.backend if args.backend not in (None, "AUTO", "DEFAULT", "AUTOTUNE") else None
    if forced:
        try:
            backend = BackendType[forced]
        except KeyError:
            backend = BackendType.from_name(forced)  # raises ValueError naming the choices
        GlobalBackendManager.set_gemm_backend(backend)
    if args.autotune:
        GlobalBackendManager.set_auto_tune(True)

    env_backend = os.environ.get("PRIMUS_TURBO_GEMM_BACKEND", "").strip()
    env_tune = os.environ.get("PRIMUS_TURBO_AUTO_TUNE", "").strip() not in ("", "0")
    # Priority as the library applies it: code setting > environment > autotune > default.
    if forced:
        label = forced
    elif env_backend:
        label = f"env:{env_backend}"
    elif args.autotune or env_tune:
        label = "autotune"
    else:
        label = "default"
    tag = {"default": ""}.get(label, label.replace("env:", "").replace(",", "-").replace(":", "").lower())
    return label, tag


def reset_backend() -> None:
    try:
        from primus_turbo.pytorch.core.backend import GlobalBackendManager

        GlobalBackendManager.reset()
    except Exception as e:  # noqa: BLE001 -- cleanup at exit must not mask the results
        print(f"[bench_gemm] could not reset the backend settings: {e}", file=sys.stderr)


###############################################################################
# One case
###############################################################################


def make_inputs(m: int, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """a [M, K] ~ N(0, 1), b [N, K] ~ N(0, 1/K) so that outputs are O(1), grad_out [M, N] ~ N(0, 1)."""
    a = torch.randn(m, k, device="cuda", dtype=dtype).requires_grad_()
    b = torch.randn(n, k, device="cuda", dtype=dtype).mul_(k**-0.5).requires_grad_()
    g = torch.randn(m, n, device="cuda", dtype=dtype)
    return a, b, g


def check_gemm(gemm: Callable, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor, dtype: torch.dtype) -> dict:
    """Forward, dgrad and wgrad of ``gemm`` against float64 references built from the same inputs."""
    m, k = a.shape
    n = b.shape[0]
    bu.poison_allocator([(m, n)], dtype)
    out = gemm(a, b)
    if out.dtype != dtype:
        raise TypeError(f"forward returned {out.dtype}, expected {dtype}")
    r_fwd = bu.check_matmul(out.detach(), a.detach(), b.detach(), trans_b=True, dtype=dtype, what="fwd")
    bu.poison_allocator([(m, k), (n, k)], dtype)
    grad_a, grad_b = torch.autograd.grad(out, (a, b), g)
    del out
    r_dgrad = bu.check_matmul(grad_a, g, b.detach(), dtype=dtype, what="dgrad")  # g[M,N] @ b[N,K]
    del grad_a
    r_wgrad = bu.check_matmul(grad_b, g, a.detach(), trans_a=True, dtype=dtype, what="wgrad")  # g^T[N,M] @ a[M,K]
    del grad_b
    results = (r_fwd, r_dgrad, r_wgrad)
    return {
        "Check": "PASS" if all(results) else "FAIL",
        "Fwd SNR (dB)": r_fwd.snr_db,
        "Dgrad SNR (dB)": r_dgrad.snr_db,
        "Wgrad SNR (dB)": r_wgrad.snr_db,
        "Note": "; ".join(r.message for r in results if not r),
    }


def time_fwd_bwd(gemm: Callable, sets: list[tuple[torch.Tensor, ...]], args: argparse.Namespace) -> tuple[float, float]:
    """Median forward ms and median backward ms of ``gemm`` over the rotating input sets.

    Forward: ``gemm(a, b)`` with autograd recording, as in training.
    Backward: the outputs are produced once per set outside the timed region, then
    ``torch.autograd.grad(out, (a, b), grad_out, retain_graph=True)`` is timed. This is exactly
    what a training step runs for this op (the op's own backward: dgrad + wgrad and whatever
    layout work it does), not a hand-picked pair of GEMMs that could differ from it; the
    autograd engine's small per-call cost is paid equally by ours and torch.
    """
    fwd_ms = bu.time_cuda(lambda a, b, g: gemm(a, b), rotate=sets, warmup=args.warmup, iters=args.iters)
    bwd_sets = [(gemm(a, b), a, b, g) for a, b, g in sets]
    bwd_ms = bu.time_cuda(
        lambda out, a, b, g: torch.autograd.grad(out, (a, b), g, retain_graph=True),
        rotate=bwd_sets,
        warmup=args.warmup,
        iters=args.iters,
    )
    del bwd_sets
    return fwd_ms, bwd_ms


def _error_note(what: str, e: BaseException) -> str:
    traceback.print_exc()
    msg = f"{what}: {type(e).__name__}: {e}".replace("\n", " ")
    return msg[:400]


def run_case(
    row: dict, m: int, n: int, k: int, dtype: torch.dtype, ours: Callable, baseline: Callable, args: argparse.Namespace
) -> None:
    """Fill ``row`` in place: check, then timings of ours (if the check passed) and of the baseline."""
    nan = float("nan")
    notes = []
    torch.cuda.reset_peak_memory_stats()
    a, b, g = make_inputs(m, n, k, dtype)

    try:
        row.update(check_gemm(ours, a, b, g, dtype))
        if row["Note"]:
            notes.append(row["Note"])
    except Exception as e:  # noqa: BLE001 -- one bad case must not end the run
        row["Check"] = "ERROR"
        notes.append(_error_note("check", e))

    # Rotating input sets: set 0 is the checked one; enough more that a pass over all of them
    # reads over 2x L2, within the memory budget (footprint counts the output kept for backward).
    traffic = bu.tensor_bytes(a, b)
    footprint = bu.tensor_bytes(a, b, g) + bu.tensor_bytes(g)
    n_sets = bu.num_rotating_sets(traffic, footprint, memory_budget_bytes=int(args.mem_budget_gb * 2**30))
    sets = [(a, b, g)] + [make_inputs(m, n, k, dtype) for _ in range(n_sets - 1)]
    row["Rotating Sets"] = n_sets

    fwd = bwd = nan
    if row["Check"] == "PASS":
        try:
            fwd, bwd = time_fwd_bwd(ours, sets, args)
        except Exception as e:  # noqa: BLE001
            row["Check"] = "ERROR"
            notes.append(_error_note("timing", e))
    base_fwd = base_bwd = nan
    try:
        base_fwd, base_bwd = time_fwd_bwd(baseline, sets, args)
    except Exception as e:  # noqa: BLE001
        notes.append(_error_note("baseline", e))
    del sets, a, b, g

    f = 2.0 * m * n * k
    row.update(
        {
            "Forward Time (ms)": fwd,
            "Forward TFLOPS": bu.tflops(f, fwd),
            "Backward Time (ms)": bwd,
            "Backward TFLOPS": bu.tflops(2 * f, bwd),
            "Combined TFLOPS": bu.tflops(3 * f, fwd + bwd),
            "Baseline Forward Time (ms)": base_fwd,
            "Baseline Forward TFLOPS": bu.tflops(f, base_fwd),
            "Baseline Backward Time (ms)": base_bwd,
            "Baseline Backward TFLOPS": bu.tflops(2 * f, base_bwd),
            "Baseline Combined TFLOPS": bu.tflops(3 * f, base_fwd + base_bwd),
            "Peak Mem (GB)": torch.cuda.max_memory_allocated() / 2**30,
            "Note": " | ".join(notes),
        }
    )
    ours_c, base_c = row["Combined TFLOPS"], row["Baseline Combined TFLOPS"]
    row["Ratio"] = ours_c / base_c if math.isfinite(ours_c) and math.isfinite(base_c) and base_c > 0 else nan


def _cuda_usable() -> bool:
    """False once the CUDA context is broken (e.g. an illegal address): later cases cannot run."""
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return True
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return False


###############################################################################
# Main
###############################################################################


def _progress(row: dict, total: int, seconds: float) -> str:
    def f(key, digits=1):
        v = row.get(key)
        return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"

    return (
        f"[{row['TestID']:>3}/{total}] {row['Case']:<28} MBS={row['MBS']!s:<2} M={row['M']:<6} N={row['N']:<6} "
        f"K={row['K']:<6} {row['Check']:<5} ours fwd {f('Forward TFLOPS')} bwd {f('Backward TFLOPS')} "
        f"comb {f('Combined TFLOPS')} | torch comb {f('Baseline Combined TFLOPS')} | ratio {f('Ratio', 3)} "
        f"| sets {row.get('Rotating Sets', '-')} peak {f('Peak Mem (GB)')} GB ({seconds:.1f}s)"
    )


def load_rows(paths: Sequence[str]) -> list[dict]:
    """Rows of earlier runs' CSVs, numbers parsed back, TestIDs renumbered in order."""
    import csv

    rows = []
    for path in paths:
        with open(path, newline="") as f:
            for raw in csv.DictReader(f):
                row = {}
                for key, value in raw.items():
                    try:
                        row[key] = int(value) if key in ("TestID", "M", "N", "K") else float(value)
                    except (TypeError, ValueError):
                        row[key] = value
                    if key in ("Case", "GPU", "dtype", "Check", "Group", "Backend", "Note", "MBS"):
                        row[key] = value
                rows.append(row)
    # Square rows go last, as in a single run; keep only the first.
    model = [r for r in rows if r.get("Group") == "model"]
    square = [r for r in rows if r.get("Group") == "square"][:1]
    merged = model + square
    for i, row in enumerate(merged, start=1):
        row["TestID"] = i
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        return report_merged(args)
    if not torch.cuda.is_available():
        print("bench_gemm: no CUDA device", file=sys.stderr)
        return 2
    import primus_turbo.pytorch as turbo  # lazily: config and bench_utils import without it

    dtype = bu.DTYPES[args.dtype]
    cases = cfg.gen_gemm_test_cases(args.models, args.mbs, include_lm_head=args.lm_head)
    try:
        label, default_tag = configure_backend(args)
    except ValueError as e:  # an unknown --backend name
        print(f"bench_gemm: {e}", file=sys.stderr)
        return 2
    set_tag = "quick" if args.quick else ("" if args.default_set else "subset")
    tag = args.tag if args.tag is not None else "_".join(t for t in (default_tag, set_tag) if t)
    stem = f"gemm_{args.dtype}" + (f"_{tag}" if tag else "")

    gpu_name = torch.cuda.get_device_name()
    gpu = bu.gpu_short_name(gpu_name)
    out_dir = bu.results_dir_for(args.output_dir, gpu)
    csv_path = out_dir / f"{stem}.csv"
    info = bu.env_info()
    print(
        f"[bench_gemm] {gpu_name} ({gpu}); torch {info['torch']} CUDA {info['cuda']}; dtype {args.dtype}; "
        f"backend {label}; {len(cases)} model cases; iters {args.iters}; commit {bu.git_commit()}"
    )
    # Rough wall time: ours + torch, (iters + ~6 warm-up) fwd+bwd passes at ~600 TFLOPS, plus the
    # float64 reference check at ~50 TFLOPS.
    step_flops = sum(c.step_flops for c in cases)
    eta_s = step_flops * (2 * (args.iters + 6) / 600e12 + 1 / 50e12)
    print(f"[bench_gemm] writing {csv_path}; expect roughly {eta_s / 60:.1f} min on an H100")

    def ours(a, b):
        return turbo.ops.gemm(a, b, trans_b=True)

    def baseline(a, b):
        return torch.matmul(a, b.t())

    jobs = [(c.name, c.MBS, c.M, c.N, c.K, "model") for c in cases]
    if not args.no_square:
        sm, sn, sk = cfg.SQUARE_GEMM_SHAPE
        jobs.append((f"square/{sm}x{sn}x{sk}", "", sm, sn, sk, "square"))

    rows: list[dict] = []
    usable = True
    interrupted = False
    t_start = time.perf_counter()
    try:
        for i, (name, mbs, m, n, k, group) in enumerate(jobs, start=1):
            row = {
                "TestID": i,
                "GPU": gpu_name,
                "Case": name,
                "MBS": mbs,
                "M": m,
                "N": n,
                "K": k,
                "dtype": args.dtype,
                "Group": group,
                "Backend": label,
            }
            rows.append(row)
            t0 = time.perf_counter()
            if not usable:
                row.update(Check="ERROR", Note="skipped: the CUDA context is unusable after an earlier error")
                continue
            torch.manual_seed(args.seed + i)
            try:
                run_case(row, m, n, k, dtype, ours, baseline, args)
            except Exception as e:  # noqa: BLE001 -- e.g. out of memory while allocating inputs
                row["Check"] = "ERROR"
                row["Note"] = _error_note("case", e)
            usable = _cuda_usable()
            print(_progress(row, len(jobs), time.perf_counter() - t0), flush=True)
            bu.write_csv(csv_path, rows, COLUMNS)  # partial results survive a crash or a kill
    except KeyboardInterrupt:
        interrupted = True
        print("[bench_gemm] interrupted; writing what was measured (summary.json left alone)", file=sys.stderr)
        if rows and "Check" not in rows[-1]:
            rows[-1].update(Check="ERROR", Note="interrupted")
    finally:
        reset_backend()

    status = report(rows, args, stem, out_dir, csv_path, gpu_name, gpu, label, interrupted)
    print(f"[bench_gemm] done in {time.perf_counter() - t_start:.0f}s")
    return status


def report(rows, args, stem, out_dir, csv_path, gpu_name, gpu, label, interrupted) -> int:
    """Writes the CSV, prints the table, plots, and updates the summary entry."""
    bu.write_csv(csv_path, rows, COLUMNS)
    model_rows = [r for r in rows if r["Group"] == "model"]
    square_rows = [r for r in rows if r["Group"] == "square"]
    print()
    print(bu.format_table(rows, [c for c, _ in TABLE_COLUMNS], [h for _, h in TABLE_COLUMNS]))
    print()

    passed = [r.get("Check") == "PASS" for r in model_rows]
    nan = float("nan")
    square = {}
    if square_rows and square_rows[0].get("Check") == "PASS":
        sq = square_rows[0]
        square = {
            "ours_fwd_tflops": sq.get("Forward TFLOPS", nan),
            "baseline_fwd_tflops": sq.get("Baseline Forward TFLOPS", nan),
        }
    entry = bu.summary_entry(
        ours=[r.get("Combined TFLOPS", nan) for r in model_rows],
        baseline_values=[r.get("Baseline Combined TFLOPS", nan) for r in model_rows],
        passed=passed,
        metric=METRIC,
        baseline=BASELINE_NAME,
        gpu=gpu_name,
        dtype=args.dtype,
        backend=label,
        failed=sum(r.get("Check") == "FAIL" for r in model_rows),
        errors=sum(r.get("Check") == "ERROR" for r in model_rows),
        ours_fwd_geomean=bu.geomean(r.get("Forward TFLOPS") for r, p in zip(model_rows, passed) if p),
        ours_bwd_geomean=bu.geomean(r.get("Backward TFLOPS") for r, p in zip(model_rows, passed) if p),
        square_8192=square,
        models=cfg.resolve_dense_models(args.models),
        mbs=list(args.mbs),
        torch=torch.__version__,
        csv=csv_path.name,
    )
    if model_rows:
        png = bu.plot_comparison(
            out_dir / f"{stem}.png",
            [f"{r['Case']} x{r['MBS']}" for r in model_rows],
            [r.get("Combined TFLOPS", nan) for r in model_rows],
            [r.get("Baseline Combined TFLOPS", nan) for r in model_rows],
            metric="Combined fwd+bwd TFLOPS (6MNK / (fwd + bwd))",
            title=f"GEMM {args.dtype} on {gpu_name}: turbo.ops.gemm ({label}) vs {BASELINE_NAME}",
            ours_label=f"Primus-Turbo ({label})",
            baseline_label=BASELINE_NAME,
            failed=[r.get("Check") in ("FAIL", "ERROR") for r in model_rows],
        )
        if png:
            print(f"[bench_gemm] plot: {png}")
    if not args.no_summary and model_rows and not interrupted:
        path = bu.update_summary(args.output_dir, gpu, stem, entry)
        print(f"[bench_gemm] summary entry '{stem}' in {path}")

    print(
        f"[bench_gemm] {entry['passed']}/{entry['cases']} model cases passed; geomean combined TFLOPS "
        f"ours {entry['ours_geomean']:.1f} vs {BASELINE_NAME} {entry['baseline_geomean']:.1f} over "
        f"{entry['compared']} cases: ratio geomean {entry['ratio_geomean']:.3f}, min {entry['ratio_min']:.3f}"
    )
    if square:
        print(
            f"[bench_gemm] square 8192^3 forward: ours {square['ours_fwd_tflops']:.1f} TFLOPS, "
            f"{BASELINE_NAME} {square['baseline_fwd_tflops']:.1f} TFLOPS"
        )
    print(f"[bench_gemm] results: {csv_path}")
    return 0 if all(r.get("Check") == "PASS" for r in rows) else 1



def report_merged(args: argparse.Namespace) -> int:
    rows = load_rows(args.merge)
    if not rows:
        print("bench_gemm: --merge found no rows", file=sys.stderr)
        return 2
    gpu_name = rows[0]["GPU"]
    gpu = bu.gpu_short_name(gpu_name)
    args.dtype = rows[0]["dtype"]
    label = rows[0].get("Backend", "default")
    stem = f"gemm_{args.dtype}" + (f"_{args.tag}" if args.tag else "")
    out_dir = bu.results_dir_for(args.output_dir, gpu)
    models = sorted({r["Case"].split("/")[0] for r in rows if r.get("Group") == "model"})
    args.models = [m for m in cfg.resolve_dense_models(None) if m in models] or models
    return report(rows, args, stem, out_dir, out_dir / f"{stem}.csv", gpu_name, gpu, label, False)

if __name__ == "__main__":
    sys.exit(main())
