"""RMSNorm benchmark: turbo.ops.rmsnorm against torch eager and torch.compile of the same math,
forward and backward, on the hidden sizes of the model tables (config.gen_norm_test_cases).

    python benchmark/ops/bench_rmsnorm.py --dtype bf16
    python benchmark/ops/bench_rmsnorm.py --dtype bf16 --tokens 8192 --models Llama-3.1-8B
    python benchmark/ops/bench_rmsnorm.py --quick

Per case ([tokens, hidden] input, gamma in the input's dtype):
  1. correctness first: y, dx and dgamma against float64 references of the same inputs under the
     gates of shared/ACCURACY.md; a FAIL or ERROR voids our timings (NaN);
  2. timing (CUDA events, median of >= 50 calls, inputs rotated so that L2 cannot serve repeats).

Memory bound, so the metric is effective bandwidth: the bytes the op must move, each counted once
(forward: x, gamma, y, rstd; backward: x, dy, gamma, rstd, dx, dgamma), over the median time; and
that as a fraction of the measured device-to-device copy bandwidth (bu.measure_copy_bandwidth).
Writes <output-dir>/<gpu>/rmsnorm_<dtype>[_<tag>].csv and the summary.json entries rmsnorm_fwd
and rmsnorm_bwd (suffixed with _<dtype> unless bf16, and the tag). Exits 1 if a case failed.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

if __package__:  # imported as benchmark.ops.bench_rmsnorm
    from . import bench_utils as bu
    from . import config as cfg
else:  # run as a script; only this directory on sys.path (never the repository root)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_utils as bu  # type: ignore[no-redef]
    import config as cfg  # type: ignore[no-redef]

EPS = 1e-6
METRIC = "effective GB/s"
BASELINE_NAME = "torch.compile"

COLUMNS = [
    "TestID", "GPU", "Case", "Tokens", "Hidden", "dtype", "Check",
    "Forward Time (ms)", "Forward GB/s", "Forward BW Fraction",
    "Backward Time (ms)", "Backward GB/s", "Backward BW Fraction",
    "Eager Forward GB/s", "Eager Backward GB/s",
    "Compiled Forward GB/s", "Compiled Backward GB/s",
    "Forward Ratio", "Backward Ratio",
    "Y SNR (dB)", "DX SNR (dB)", "DGamma SNR (dB)", "Rotating Sets", "Note",
]
TABLE_COLUMNS = [
    ("Case", "Case"), ("Tokens", "Tokens"), ("Hidden", "Hidden"), ("Check", "Check"),
    ("Forward GB/s", "Fwd GB/s"), ("Forward BW Fraction", "Fwd frac"),
    ("Backward GB/s", "Bwd GB/s"), ("Backward BW Fraction", "Bwd frac"),
    ("Compiled Forward GB/s", "Comp Fwd"), ("Compiled Backward GB/s", "Comp Bwd"),
    ("Eager Forward GB/s", "Eager Fwd"), ("Eager Backward GB/s", "Eager Bwd"),
    ("Forward Ratio", "Fwd ratio"), ("Backward Ratio", "Bwd ratio"),
]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--models", nargs="+", default=None, help="models whose hidden sizes to run (default: all)")
    p.add_argument("--tokens", nargs="+", type=int, default=None, help=f"default: {list(cfg.NORM_TOKENS)}")
    p.add_argument("--quick", action="store_true", help="smoke test: Llama-3.1-8B, 8192 tokens")
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--tag", default=None, help="suffix of the file and summary-entry names")
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--mem-budget-gb", type=float, default=8.0)
    p.add_argument("--no-compile-baseline", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--no-summary", action="store_true")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if args.iters < bu.MIN_TIMED_ITERS:
        p.error(f"--iters must be >= {bu.MIN_TIMED_ITERS}")
    args.default_set = args.models is None and args.tokens is None and not args.quick
    if args.quick:
        args.models = args.models or ["Llama-3.1-8B"]
        args.tokens = args.tokens or [8192]
    args.tokens = args.tokens or list(cfg.NORM_TOKENS)
    return args


def torch_rmsnorm(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """The same math in plain torch: float32 statistics, output in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * gamma.float()).to(x.dtype)


def fwd_bytes(t: int, h: int, es: int) -> int:
    return 2 * t * h * es + h * es + t * 4


def bwd_bytes(t: int, h: int, es: int) -> int:
    return 3 * t * h * es + 2 * h * es + t * 4


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9 if ms and math.isfinite(ms) and ms > 0 else float("nan")


def make_inputs(t: int, h: int, dtype: torch.dtype):
    x = torch.randn(t, h, device="cuda", dtype=dtype).requires_grad_()
    g = (1.0 + 0.1 * torch.randn(h, device="cuda")).to(dtype).requires_grad_()
    dy = torch.randn(t, h, device="cuda", dtype=dtype)
    return x, g, dy


def check_case(ours: Callable, x, g, dy, dtype) -> dict:
    y = ours(x, g)
    dx, dg = torch.autograd.grad(y, (x, g), dy)
    x64 = x.detach().double().requires_grad_()
    g64 = g.detach().double().requires_grad_()
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * g64
    rdx, rdg = torch.autograd.grad(ref, (x64, g64), dy.double())
    results = (
        bu.check_close(y.detach(), ref.detach(), dtype, what="y"),
        bu.check_close(dx, rdx, dtype, what="dx"),
        bu.check_close(dg, rdg, dtype, what="dgamma"),
    )
    return {
        "Check": "PASS" if all(results) else "FAIL",
        "Y SNR (dB)": results[0].snr_db,
        "DX SNR (dB)": results[1].snr_db,
        "DGamma SNR (dB)": results[2].snr_db,
        "Note": "; ".join(r.message for r in results if not r),
    }


def time_fwd_bwd(fn: Callable, sets, args) -> tuple[float, float]:
    """Forward with autograd recording (as in training); backward = autograd.grad of the op."""
    fwd = bu.time_cuda(lambda x, g, dy: fn(x, g), rotate=sets, warmup=args.warmup, iters=args.iters)
    bwd_sets = [(fn(x, g), x, g, dy) for x, g, dy in sets]
    bwd = bu.time_cuda(
        lambda y, x, g, dy: torch.autograd.grad(y, (x, g), dy, retain_graph=True),
        rotate=bwd_sets, warmup=args.warmup, iters=args.iters,
    )
    return fwd, bwd


def run_case(row: dict, case, dtype, impls: dict, copy_gbps: float, args) -> None:
    nan = float("nan")
    t, h = case.tokens, case.hidden
    es = torch.empty((), dtype=dtype).element_size()
    notes = []
    x, g, dy = make_inputs(t, h, dtype)
    try:
        row.update(check_case(impls["ours"], x, g, dy, dtype))
        if row["Note"]:
            notes.append(row["Note"])
    except Exception as e:  # noqa: BLE001 -- one bad case must not end the run
        traceback.print_exc()
        row["Check"] = "ERROR"
        notes.append(f"check: {type(e).__name__}: {e}"[:400])
    n_sets = bu.num_rotating_sets(3 * t * h * es, memory_budget_bytes=int(args.mem_budget_gb * 2**30))
    sets = [(x, g, dy)] + [make_inputs(t, h, dtype) for _ in range(n_sets - 1)]
    row["Rotating Sets"] = n_sets
    times = {}
    for name, fn in impls.items():
        if name == "ours" and row["Check"] != "PASS":
            times[name] = (nan, nan)
            continue
        try:
            times[name] = time_fwd_bwd(fn, sets, args)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            times[name] = (nan, nan)
            notes.append(f"{name}: {type(e).__name__}: {e}"[:300])
    del sets, x, g, dy
    fb, bb = fwd_bytes(t, h, es), bwd_bytes(t, h, es)
    fwd, bwd = times["ours"]
    row.update(
        {
            "Forward Time (ms)": fwd,
            "Forward GB/s": gbps(fb, fwd),
            "Forward BW Fraction": gbps(fb, fwd) / copy_gbps,
            "Backward Time (ms)": bwd,
            "Backward GB/s": gbps(bb, bwd),
            "Backward BW Fraction": gbps(bb, bwd) / copy_gbps,
            "Eager Forward GB/s": gbps(fb, times["eager"][0]),
            "Eager Backward GB/s": gbps(bb, times["eager"][1]),
            "Compiled Forward GB/s": gbps(fb, times.get("compiled", (nan, nan))[0]),
            "Compiled Backward GB/s": gbps(bb, times.get("compiled", (nan, nan))[1]),
            "Note": " | ".join(notes),
        }
    )
    base = "Compiled" if "compiled" in impls else "Eager"
    for d in ("Forward", "Backward"):
        o, b = row[f"{d} GB/s"], row[f"{base} {d} GB/s"]
        row[f"{d} Ratio"] = o / b if math.isfinite(o) and math.isfinite(b) and b > 0 else nan


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_rmsnorm: no CUDA device", file=sys.stderr)
        return 2
    import primus_turbo.pytorch as turbo  # lazily: the module imports without a GPU

    torch.manual_seed(args.seed)
    dtype = bu.DTYPES[args.dtype]
    cases = cfg.gen_norm_test_cases(args.tokens, args.models)
    gpu_name = torch.cuda.get_device_name()
    gpu = bu.gpu_short_name(gpu_name)
    out_dir = bu.results_dir_for(args.output_dir, gpu)
    tag = args.tag if args.tag is not None else ("" if args.default_set else ("quick" if args.quick else "subset"))
    suffix = ("" if args.dtype == "bf16" else f"_{args.dtype}") + (f"_{tag}" if tag else "")
    csv_path = out_dir / f"rmsnorm_{args.dtype}{'_' + tag if tag else ''}.csv"
    copy_gbps = bu.measure_copy_bandwidth()
    print(f"[bench_rmsnorm] {len(cases)} cases on {gpu_name}; copy bandwidth {copy_gbps:.0f} GB/s")

    impls = {"ours": lambda x, g: turbo.ops.rmsnorm(x, g, EPS), "eager": torch_rmsnorm}
    if not args.no_compile_baseline:
        impls["compiled"] = torch.compile(torch_rmsnorm, dynamic=False)
    rows = []
    for i, case in enumerate(cases, 1):
        row = {"TestID": i, "GPU": gpu, "Case": case.name, "Tokens": case.tokens, "Hidden": case.hidden, "dtype": args.dtype}
        run_case(row, case, dtype, impls, copy_gbps, args)
        rows.append(row)
        print(
            f"[{i:>3}/{len(cases)}] {case.name:<32} T={case.tokens:<6} H={case.hidden:<6} {row['Check']:<5} "
            f"fwd {row['Forward GB/s']:.0f} GB/s ({row['Forward BW Fraction']:.2f}) "
            f"bwd {row['Backward GB/s']:.0f} GB/s ({row['Backward BW Fraction']:.2f}) | "
            f"compiled {row['Compiled Forward GB/s']:.0f}/{row['Compiled Backward GB/s']:.0f} "
            f"eager {row['Eager Forward GB/s']:.0f}/{row['Eager Backward GB/s']:.0f}",
            flush=True,
        )
        bu.write_csv(csv_path, rows, COLUMNS)
        torch.cuda.empty_cache()

    print()
    print(bu.format_table(rows, [c for c, _ in TABLE_COLUMNS], [h for _, h in TABLE_COLUMNS]))
    passed = [r.get("Check") == "PASS" for r in rows]
    base = "Compiled" if "compiled" in impls else "Eager"
    for d, name in (("Forward", "rmsnorm_fwd"), ("Backward", "rmsnorm_bwd")):
        entry = bu.summary_entry(
            ours=[r[f"{d} GB/s"] for r in rows],
            baseline_values=[r[f"{base} {d} GB/s"] for r in rows],
            passed=passed,
            metric=METRIC,
            baseline=BASELINE_NAME if base == "Compiled" else "torch eager",
            gpu=gpu_name,
            dtype=args.dtype,
            eager_geomean=bu.geomean(r[f"Eager {d} GB/s"] for r, p in zip(rows, passed) if p),
            bandwidth_fraction_geomean=bu.geomean(r[f"{d} BW Fraction"] for r, p in zip(rows, passed) if p),
            copy_gbps=copy_gbps,
            tokens=list(args.tokens),
            torch=torch.__version__,
            csv=csv_path.name,
        )
        if not args.no_summary:
            bu.update_summary(args.output_dir, gpu, name + suffix, entry)
        print(
            f"[bench_rmsnorm] {name}: {entry['passed']}/{entry['cases']} passed; geomean {entry['ours_geomean']:.0f} GB/s "
            f"({entry['bandwidth_fraction_geomean']:.2f} of copy) vs {entry['baseline']} {entry['baseline_geomean']:.0f} GB/s: "
            f"ratio {entry['ratio_geomean']:.3f} (min {entry['ratio_min']:.3f})"
        )
    print(f"[bench_rmsnorm] results: {csv_path}")
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
