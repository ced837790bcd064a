"""The shared engine of the memory-bound operator benchmarks (bench_rmsnorm, bench_layernorm,
bench_swiglu): ours against torch eager and torch.compile of the same math, forward and backward.

Per case:
  1. correctness first: every output and gradient against float64 references of the same inputs
     under the gates of shared/ACCURACY.md (a FAIL or ERROR voids our timings);
  2. timing, forward (with autograd recording, as in training) and backward (autograd.grad of
     the outputs), by default replayed from a CUDA graph of 20 calls (``bu.time_cuda_graph``:
     device time; without it a ~40 us op measures the host's Python overhead), inputs rotated so
     that L2 cannot serve repeats. ``--no-graph`` times plain calls with CUDA events.

Ops with an FP8 output (Fp8FwdBench: rmsnorm_fp8, swiglu_fp8, ...) are timed forward only, against
our unfused chain (the op, then turbo.ops.quantize_fp8) and torch.compile of the same math; their
summary entry is <op>_fwd with ratio_geomean against the unfused chain and ratio_vs_compiled_*.

Memory bound, so the metric is effective bandwidth: the bytes the op must move, each counted
once, over the median time; and that as a fraction of the device-to-device copy bandwidth
measured in the same run. Writes <output-dir>/<gpu>/<op>_<dtype>[_<tag>].csv and the summary.json
entries <op>_fwd / <op>_bwd (suffixed with _<dtype> unless bf16, and the tag).
"""

from __future__ import annotations

import argparse
import math
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

if __package__:
    from . import bench_utils as bu
else:  # the bench scripts put this directory on sys.path
    import bench_utils as bu  # type: ignore[no-redef]

METRIC = "effective GB/s"


@dataclass
class Inputs:
    args: tuple  # fn(*args)
    wrt: tuple  # leaf tensors the backward differentiates
    douts: tuple  # one gradient per output


@dataclass
class OpBench:
    name: str  # CSV and summary name: "rmsnorm", "swiglu_probs", ...
    make: Callable[[Any, torch.dtype], Inputs]  # (case, dtype) -> fresh random inputs
    ours: Callable[..., Any]
    torch_math: Callable[..., Any]  # the same math in plain torch (eager; compiled for the baseline)
    reference: Callable[[Inputs], tuple]  # float64 (outputs..., gradients...) in wrt order
    fwd_bytes: Callable[[Any, int], int]  # (case, element size) -> bytes the forward must move
    bwd_bytes: Callable[[Any, int], int]
    names: Sequence[str] = ()  # of outputs then gradients, for the notes


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--models", nargs="+", default=None, help="models whose sizes to run (default: all)")
    p.add_argument("--tokens", nargs="+", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="smoke test: a few model sizes at 8192 tokens")
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--tag", default=None, help="suffix of the file and summary-entry names")
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--mem-budget-gb", type=float, default=8.0)
    p.add_argument("--no-compile-baseline", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--no-graph", action="store_true", help="time plain calls (host overhead included)")
    p.add_argument("--no-summary", action="store_true")
    p.add_argument("--seed", type=int, default=1234)


def turbo():
    """primus_turbo.pytorch, imported on first use (the scripts import without a GPU)."""
    import primus_turbo.pytorch as pt

    return pt


def _tuple(v) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9 if ms and math.isfinite(ms) and ms > 0 else float("nan")


def ratio(ours: float, base: float) -> float:
    """ours / base when both are finite and base > 0, else NaN."""
    return ours / base if math.isfinite(ours) and math.isfinite(base) and base > 0 else float("nan")


def result_names(args, out_dir, stem: str):
    """(tag, summary-entry suffix, CSV path) of a run: the tag is --tag, else "" for the default
    set, "quick" or "subset"; the suffix adds _<dtype> unless bf16; the CSV is <stem>_<dtype>[_<tag>]."""
    tag = args.tag if args.tag is not None else ("" if args.default_set else ("quick" if args.quick else "subset"))
    suffix = ("" if args.dtype == "bf16" else f"_{args.dtype}") + (f"_{tag}" if tag else "")
    return tag, suffix, out_dir / f"{stem}_{args.dtype}{'_' + tag if tag else ''}.csv"


def publish(args, gpu: str, name: str, entry: dict) -> None:
    """Sets the summary.json entry unless --no-summary."""
    if not args.no_summary:
        bu.update_summary(args.output_dir, gpu, name, entry)


def passed_geomean(rows, passed, column: str) -> float:
    """Geomean of ``column`` over the cases that passed."""
    return bu.geomean(r[column] for r, p in zip(rows, passed) if p)


def fwd_bwd_entry(rows, passed, d: str, base: str, gpu_name: str, args, copy_gbps: float, csv_path, **extra) -> dict:
    """The summary entry of direction ``d`` ("Forward" / "Backward") of a run whose rows hold
    "<d> GB/s", "<base> <d> GB/s" (base "Compiled" or "Eager"), "Eager <d> GB/s" and "<d> BW
    Fraction"; ``extra`` fields come after copy_gbps."""
    return bu.summary_entry(
        ours=[r[f"{d} GB/s"] for r in rows],
        baseline_values=[r[f"{base} {d} GB/s"] for r in rows],
        passed=passed,
        metric=METRIC,
        baseline="torch.compile" if base == "Compiled" else "torch eager",
        gpu=gpu_name,
        dtype=args.dtype,
        eager_geomean=passed_geomean(rows, passed, f"Eager {d} GB/s"),
        bandwidth_fraction=passed_geomean(rows, passed, f"{d} BW Fraction"),
        copy_gbps=copy_gbps,
        **extra,
        tokens=list(args.tokens),
        torch=torch.__version__,
        csv=csv_path.name,
    )


def _setup(args, name: str):
    """(dtype, element size, GPU name, short GPU name, summary suffix, CSV path) of a run of op ``name``."""
    dtype = bu.DTYPES[args.dtype]
    gpu_name = torch.cuda.get_device_name()
    gpu = bu.gpu_short_name(gpu_name)
    _, suffix, csv_path = result_names(args, bu.results_dir_for(args.output_dir, gpu), name)
    return dtype, torch.empty((), dtype=dtype).element_size(), gpu_name, gpu, suffix, csv_path


def _new_row(i: int, gpu: str, case, describe, args) -> dict:
    return {"TestID": i, "GPU": gpu, **describe(case), "dtype": args.dtype, "Timing": "eager" if args.no_graph else "graph"}


def _checked(row: dict, notes: list, check: Callable[..., tuple[str, str]], *check_args) -> None:
    """row["Check"] from check(*check_args) -> (status, note); an exception is an ERROR, not the end of the run."""
    try:
        row["Check"], note = check(*check_args)
        if note:
            notes.append(note)
    except Exception as e:  # noqa: BLE001 -- one bad case must not end the run
        traceback.print_exc()
        row["Check"] = "ERROR"
        notes.append(f"check: {type(e).__name__}: {e}"[:400])


def _rotating_sets(first, make: Callable[[], Any], nbytes: int, args) -> list:
    """``first`` plus enough fresh input sets that L2 cannot serve repeats (within --mem-budget-gb)."""
    n_sets = bu.num_rotating_sets(nbytes, memory_budget_bytes=int(args.mem_budget_gb * 2**30))
    return [first] + [make() for _ in range(n_sets - 1)]


def time_impls(impls: dict, row: dict, notes: list, failed, timer: Callable[..., Any], *timer_args) -> dict:
    """timer(fn, *timer_args) per implementation; ``failed`` for ours when its check did not pass, or on an error."""
    times = {}
    for name, fn in impls.items():
        if name == "ours" and row["Check"] != "PASS":
            times[name] = failed
            continue
        try:
            times[name] = timer(fn, *timer_args)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            times[name] = failed
            notes.append(f"{name}: {type(e).__name__}: {e}"[:300])
    return times


def _write_rows(csv_path, rows) -> None:
    """The CSV with the rows' own columns, Note last; then frees the case's memory."""
    columns = list(rows[0].keys())
    bu.write_csv(csv_path, rows, columns[: columns.index("Note")] + columns[columns.index("Note") + 1 :] + ["Note"])
    torch.cuda.empty_cache()


def _check(op: OpBench, inp: Inputs, dtype) -> tuple[str, str]:
    outs = _tuple(op.ours(*inp.args))
    grads = torch.autograd.grad(outs, inp.wrt, inp.douts)
    refs = op.reference(inp)
    got = [o.detach() for o in outs] + list(grads)
    names = list(op.names) or [f"t{i}" for i in range(len(got))]
    results = [bu.check_close(g, r, dtype, what=n) for g, r, n in zip(got, refs, names)]
    ok = len(got) == len(refs) and all(results)
    return ("PASS" if ok else "FAIL"), "; ".join(r.message for r in results if not r)


def time_on(fn, sets, args, stream=None) -> float:
    """Median ms per call of fn over the rotating sets: replayed from a CUDA graph (device time),
    or plain calls with CUDA events under --no-graph."""
    if args.no_graph:
        return bu.time_cuda(fn, rotate=sets, warmup=args.warmup, iters=args.iters)
    return bu.time_cuda_graph(fn, rotate=sets, stream=stream)



def _time_fwd_bwd(fn, sets: list[Inputs], args) -> tuple[float, float]:
    fwd = time_on(lambda inp: fn(*inp.args), [(s,) for s in sets], args)
    stream = None if args.no_graph else torch.cuda.Stream()
    with torch.cuda.stream(stream) if stream is not None else _null():
        bwd_sets = [(_tuple(fn(*s.args)), s) for s in sets]
    bwd = time_on(
        lambda outs, s: torch.autograd.grad(outs, s.wrt, s.douts, retain_graph=True), bwd_sets, args, stream=stream
    )
    return fwd, bwd


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def run(op: OpBench, cases: Sequence[Any], args, describe: Callable[[Any], dict], label: str) -> bool:
    """Benchmarks one op over the cases; writes its CSV and summary entries. True if all passed."""
    nan = float("nan")
    dtype, es, gpu_name, gpu, suffix, csv_path = _setup(args, op.name)
    copy_gbps = args.copy_gbps
    impls = {"ours": op.ours, "eager": op.torch_math}
    if not args.no_compile_baseline:
        impls["compiled"] = torch.compile(op.torch_math, dynamic=False)
    base = "Compiled" if "compiled" in impls else "Eager"
    rows = []
    for i, case in enumerate(cases, 1):
        row = _new_row(i, gpu, case, describe, args)
        notes = []
        inp = op.make(case, dtype)
        _checked(row, notes, _check, op, inp, dtype)
        sets = _rotating_sets(inp, lambda: op.make(case, dtype), op.fwd_bytes(case, es), args)
        times = time_impls(impls, row, notes, (nan, nan), _time_fwd_bwd, sets, args)
        del sets, inp
        for d, nbytes, k in (("Forward", op.fwd_bytes(case, es), 0), ("Backward", op.bwd_bytes(case, es), 1)):
            ours = gbps(nbytes, times["ours"][k])
            row[f"{d} Time (ms)"] = times["ours"][k]
            row[f"{d} GB/s"] = ours
            row[f"{d} BW Fraction"] = ours / copy_gbps
            row[f"Eager {d} GB/s"] = gbps(nbytes, times["eager"][k])
            row[f"Compiled {d} GB/s"] = gbps(nbytes, times.get("compiled", (nan, nan))[k])
            row[f"{d} Ratio"] = ratio(ours, row[f"{base} {d} GB/s"])
        row["Note"] = " | ".join(notes)
        rows.append(row)
        print(
            f"[{op.name}] [{i:>3}/{len(cases)}] {label.format(**row):<44} {row['Check']:<5} "
            f"fwd {row['Forward GB/s']:.0f} GB/s ({row['Forward BW Fraction']:.2f}) "
            f"bwd {row['Backward GB/s']:.0f} GB/s ({row['Backward BW Fraction']:.2f}) | "
            f"compiled {row['Compiled Forward GB/s']:.0f}/{row['Compiled Backward GB/s']:.0f} "
            f"eager {row['Eager Forward GB/s']:.0f}/{row['Eager Backward GB/s']:.0f}",
            flush=True,
        )
        _write_rows(csv_path, rows)

    passed = [r.get("Check") == "PASS" for r in rows]
    for d, direction in (("Forward", "fwd"), ("Backward", "bwd")):
        entry = fwd_bwd_entry(
            rows, passed, d, base, gpu_name, args, copy_gbps, csv_path,
            timing="eager calls" if args.no_graph else "CUDA graph replay (device time)",
        )
        name = f"{op.name}_{direction}{suffix}"
        publish(args, gpu, name, entry)
        print(
            f"[{op.name}] {name}: {entry['passed']}/{entry['cases']} passed; geomean {entry['ours_geomean']:.0f} GB/s "
            f"({entry['bandwidth_fraction']:.2f} of copy {copy_gbps:.0f}) vs {entry['baseline']} "
            f"{entry['baseline_geomean']:.0f} GB/s: ratio {entry['ratio_geomean']:.3f} (min {entry['ratio_min']:.3f})",
            flush=True,
        )
    print(f"[{op.name}] results: {csv_path}")
    return all(passed)


# ---- forward-only ops with an FP8 output (rmsnorm_fp8, swiglu_fp8, ...) --------------------------


@dataclass
class Fp8FwdBench:
    """An op that writes its output quantized to FP8 (q, scale_inv) in the same pass, timed
    forward only against (a) our unfused chain (the op, then turbo.ops.quantize_fp8) and (b)
    torch.compile of the same math. Correctness: q and scale_inv bit-identical to the unfused
    chain, and the dequantized output within the FP8 gate (SNR >= 25 dB E4M3) of float64."""

    name: str  # summary name: rmsnorm_fp8, swiglu_fp8_1x128, ...
    make: Callable[[Any, torch.dtype], tuple]  # (case, dtype) -> args (no grad)
    ours: Callable[..., Any]  # -> (q, scale_inv)
    unfused: Callable[..., Any]  # our op, then quantize_fp8 -> (q, scale_inv)
    torch_math: Callable[..., Any]  # plain torch, compiled for the baseline -> (q, scale_inv)
    reference: Callable[..., torch.Tensor]  # float64 output of the op (before quantization)
    dequantize: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (q, scale_inv) -> float64
    fwd_bytes: Callable[[Any, int], int]  # (case, element size) -> bytes the fused forward moves
    min_snr: float = 25.0


E4M3_MAX = 448.0


def fp8_config(block: int):
    """Float8QuantConfig E4M3: rowwise (block 0) or 1x128 blocks."""
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity

    if block == 0:
        return Float8QuantConfig(granularity=ScalingGranularity.ROWWISE)
    return Float8QuantConfig(granularity=ScalingGranularity.BLOCKWISE, block_size=block)


def quantize_fp8_unfused(y: torch.Tensor, block: int):
    """Our quantizer on a finished output: the second half of the unfused chain."""
    from primus_turbo.pytorch.core.low_precision import ScalingGranularity

    g = ScalingGranularity.ROWWISE if block == 0 else ScalingGranularity.BLOCKWISE
    return turbo().ops.quantize_fp8(y, torch.float8_e4m3fn, g, block_size=block or None, axis=-1)


def torch_quantize_fp8(y: torch.Tensor, block: int):
    """The quantization in plain torch (the torch.compile baseline): E4M3, scale = 448 / amax of
    the row (block 0) or of each 128 elements, applied to the output rounded to its dtype."""
    yf = y.float()
    rows, cols = yf.shape
    if block == 0:
        scale = E4M3_MAX / yf.abs().amax(-1, keepdim=True).clamp_min(1e-30)
        return (yf * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale.reciprocal()
    nb = -(-cols // block)
    yp = torch.nn.functional.pad(yf, (0, nb * block - cols)).view(rows, nb, block)
    scale = E4M3_MAX / yp.abs().amax(-1).clamp_min(1e-30)
    q = (yp * scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(rows, nb * block)[:, :cols], scale.reciprocal()


def fp8_dequantize(q: torch.Tensor, s: torch.Tensor, block: int) -> torch.Tensor:
    if block == 0:
        return q.double() * s.double().reshape(-1, 1)
    return q.double() * s.double().repeat_interleave(block, dim=1)[:, : q.shape[1]]


def fp8_bytes(rows: int, cols: int, block: int) -> int:
    """Bytes of the FP8 output: q and its float32 scales."""
    return rows * cols + 4 * rows * (1 if block == 0 else -(-cols // block))


def _check_fp8(op: Fp8FwdBench, args_: tuple) -> tuple[str, str]:
    q, s = op.ours(*args_)
    q_ref, s_ref = op.unfused(*args_)
    notes = []
    if not torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)):
        diff = (q.view(torch.uint8) != q_ref.view(torch.uint8)).sum().item()
        notes.append(f"q differs from the unfused chain in {diff} elements")
    if not torch.equal(s, s_ref):
        notes.append("scale_inv differs from the unfused chain")
    snr = bu.snr_db(op.dequantize(q, s), op.reference(*args_))
    if not snr >= op.min_snr:
        notes.append(f"dequantized SNR {snr:.1f} dB < {op.min_snr} dB")
    return ("PASS" if not notes else "FAIL"), "; ".join(notes)


def run_fp8_fwd(op: Fp8FwdBench, cases: Sequence[Any], args, describe: Callable[[Any], dict], label: str) -> bool:
    """Benchmarks one FP8-output op (forward); writes its CSV and the summary entry <name>_fwd,
    whose ratio is against our unfused chain and which also records torch.compile's numbers."""
    nan = float("nan")
    dtype, es, gpu_name, gpu, suffix, csv_path = _setup(args, op.name)
    impls = {"ours": op.ours, "unfused": op.unfused}
    if not args.no_compile_baseline:
        impls["compiled"] = torch.compile(op.torch_math, dynamic=False)
    rows = []
    for i, case in enumerate(cases, 1):
        row = _new_row(i, gpu, case, describe, args)
        notes = []
        args_ = op.make(case, dtype)
        _checked(row, notes, _check_fp8, op, args_)
        nbytes = op.fwd_bytes(case, es)
        sets = _rotating_sets(args_, lambda: op.make(case, dtype), nbytes, args)
        times = time_impls(impls, row, notes, nan, time_on, sets, args)
        del sets, args_
        ours = gbps(nbytes, times["ours"])
        row["Forward Time (ms)"] = times["ours"]
        row["Forward GB/s"] = ours
        row["Forward BW Fraction"] = ours / args.copy_gbps
        # The same byte count for every implementation: the time ratio is the speedup.
        row["Unfused Forward GB/s"] = gbps(nbytes, times["unfused"])
        row["Compiled Forward GB/s"] = gbps(nbytes, times.get("compiled", nan))
        for b in ("Unfused", "Compiled"):
            row[f"Ratio vs {b}"] = ratio(ours, row[f"{b} Forward GB/s"])
        row["Note"] = " | ".join(notes)
        rows.append(row)
        print(
            f"[{op.name}] [{i:>3}/{len(cases)}] {label.format(**row):<44} {row['Check']:<5} "
            f"fwd {ours:.0f} GB/s ({row['Forward BW Fraction']:.2f}) | unfused {row['Unfused Forward GB/s']:.0f} "
            f"(x{row['Ratio vs Unfused']:.2f}) compiled {row['Compiled Forward GB/s']:.0f} "
            f"(x{row['Ratio vs Compiled']:.2f})",
            flush=True,
        )
        _write_rows(csv_path, rows)

    passed = [r.get("Check") == "PASS" for r in rows]
    compiled = [r["Compiled Forward GB/s"] for r in rows]
    vs_compiled = bu.summary_entry(ours=[r["Forward GB/s"] for r in rows], baseline_values=compiled, passed=passed,
                                   metric=METRIC, baseline="torch.compile", gpu=gpu_name)
    entry = bu.summary_entry(
        ours=[r["Forward GB/s"] for r in rows],
        baseline_values=[r["Unfused Forward GB/s"] for r in rows],
        passed=passed,
        metric=METRIC,
        baseline="ours unfused (op, then quantize_fp8)",
        gpu=gpu_name,
        dtype=args.dtype,
        bandwidth_fraction=passed_geomean(rows, passed, "Forward BW Fraction"),
        copy_gbps=args.copy_gbps,
        compiled_geomean=vs_compiled["baseline_geomean"],
        ratio_vs_compiled_geomean=vs_compiled["ratio_geomean"],
        ratio_vs_compiled_min=vs_compiled["ratio_min"],
        timing="eager calls" if args.no_graph else "CUDA graph replay (device time)",
        tokens=list(args.tokens),
        torch=torch.__version__,
        csv=csv_path.name,
    )
    name = f"{op.name}_fwd{suffix}"
    publish(args, gpu, name, entry)
    print(
        f"[{op.name}] {name}: {entry['passed']}/{entry['cases']} passed; geomean {entry['ours_geomean']:.0f} GB/s "
        f"({entry['bandwidth_fraction']:.2f} of copy {args.copy_gbps:.0f}); vs unfused x{entry['ratio_geomean']:.3f} "
        f"(min {entry['ratio_min']:.3f}); vs torch.compile x{entry['ratio_vs_compiled_geomean']:.3f}",
        flush=True,
    )
    print(f"[{op.name}] results: {csv_path}")
    return all(passed)


def main(ops: dict[str, OpBench], parser: argparse.ArgumentParser, cases_fn, describe, label, argv=None) -> int:
    """Parses the common arguments (plus ``--ops``), measures copy bandwidth once, runs each op."""
    parser.add_argument("--ops", nargs="+", choices=list(ops), default=list(ops))
    add_common_args(parser)
    args = parser.parse_args(argv)
    if args.iters < bu.MIN_TIMED_ITERS:
        parser.error(f"--iters must be >= {bu.MIN_TIMED_ITERS}")
    args.default_set = args.models is None and args.tokens is None and not args.quick
    if not torch.cuda.is_available():
        print(f"{parser.prog}: no CUDA device")
        return 2
    torch.manual_seed(args.seed)
    cases = cases_fn(args)
    args.copy_gbps = bu.measure_copy_bandwidth()
    print(f"[{parser.prog}] {len(cases)} cases x {len(args.ops)} ops on {torch.cuda.get_device_name()}; "
          f"copy bandwidth {args.copy_gbps:.0f} GB/s")
    ok = True
    for name in args.ops:
        runner = run_fp8_fwd if isinstance(ops[name], Fp8FwdBench) else run
        ok = runner(ops[name], cases, args, describe, label) and ok
    return 0 if ok else 1
