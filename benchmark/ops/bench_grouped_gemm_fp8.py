"""FP8 grouped GEMM (MoE experts) benchmark: turbo.ops.grouped_gemm_fp8 end to end (quantization
included) against bf16 torch._grouped_mm, and the pre-quantized ROWWISE forward against
torch._scaled_grouped_mm, on the MoE shape table (config.gen_grouped_gemm_test_cases). With --fp4,
turbo.ops.grouped_gemm_fp4 (MXFP4, emulated on the FP8 kernel) instead, same cases and baseline.

    python benchmark/ops/bench_grouped_gemm_fp8.py --quick                    # < 2 min after compiles
    python benchmark/ops/bench_grouped_gemm_fp8.py --granularity blockwise --models DeepSeek-V3 --ep 8
    python benchmark/ops/bench_grouped_gemm_fp8.py --quick --fp8-wgrad        # the experimental FP8 wgrad
    python benchmark/ops/bench_grouped_gemm_fp8.py --quick --fp4              # grouped_gemm_fp4 (MXFP4)

Per case (x [T, K], w [G, N, K] used as x_g @ w_g^T, like GroupedLinear; grad [T, N]) and per
granularity (TENSORWISE, ROWWISE, BLOCKWISE; --format, default HYBRID):
  1. correctness first: forward, dgrad and wgrad against per-group float32 references of the bf16
     inputs under the FP8 gates of shared/ACCURACY.md (E4M3 25 dB, E5M2/HYBRID 20 dB); a FAIL or
     ERROR voids our timings (NaN);
  2. timing (CUDA events, median of >= 50 calls): forward (quantization + GEMM), the training step
     (forward + dgrad + wgrad through autograd), against bf16 torch._grouped_mm forward and its
     forward + two backward GEMMs. For ROWWISE also the GEMM alone on pre-quantized operands, ours
     vs torch._scaled_grouped_mm (same quantized inputs).
Writes <output-dir>/<gpu>/grouped_gemm_fp8_<granularity>[_<tag>].csv and the summary.json entries
grouped_gemm_fp8_<granularity>[_<tag>] (training-step TFLOPS vs bf16 torch._grouped_mm). The module
builds (one nvcc per kernel point) happen before timing, in parallel. Exits 1 if a case failed.

--fp4: one pass, turbo.ops.grouped_gemm_fp4 with its default Float4QuantConfig (the FP4 training
recipe; MXFP4 forward and dgrad emulated through E4M3, bf16 wgrad), gate: grouped FP4 >= 8 dB;
<output-dir>/<gpu>/grouped_gemm_fp4[_<tag>].csv and the summary.json entry grouped_gemm_fp4[_<tag>]
(same metric and baseline; --granularity, --format and --fp8-wgrad do not apply).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

if __package__:
    from . import bench_utils as bu
    from . import grouped_common as gc
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_utils as bu  # type: ignore[no-redef]
    import grouped_common as gc  # type: ignore[no-redef]

METRIC = "training step TFLOPS (fwd + dgrad + wgrad, quantization included)"
BASELINE_NAME = "torch._grouped_mm (bf16)"
QUICK_MODELS = ("DeepSeek-V3", "Qwen3-30B-A3B", "Mixtral-8x7B")
QUICK_TOKENS = (2048,)
GRANULARITIES = ("tensorwise", "rowwise", "blockwise")

COLUMNS = [
    "TestID",
    "GPU",
    "Granularity",
    "Format",
    "Case",
    "EP",
    "G",
    "Tokens/Expert",
    "Balanced",
    "M",
    "N",
    "K",
    "Check",
    "Forward Time (ms)",
    "Forward TFLOPS",
    "Step Time (ms)",
    "Step TFLOPS",
    "Baseline Forward TFLOPS",
    "Baseline Step TFLOPS",
    "Forward Ratio",
    "Step Ratio",
    "GEMM-only TFLOPS",
    "Scaled Baseline TFLOPS",
    "Scaled Ratio",
    "Out SNR (dB)",
    "DGrad SNR (dB)",
    "WGrad SNR (dB)",
    "Note",
]
TABLE_COLUMNS = [
    ("Granularity", "Gran"),
    ("Case", "Case"),
    ("EP", "EP"),
    ("Tokens/Expert", "Tok/E"),
    ("Balanced", "Bal"),
    ("Check", "Check"),
    ("Forward TFLOPS", "Fwd"),
    ("Step TFLOPS", "Step"),
    ("Baseline Step TFLOPS", "bf16 step"),
    ("Step Ratio", "Ratio"),
    ("Scaled Ratio", "vs scaled_mm"),
]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--granularity", nargs="+", choices=GRANULARITIES, default=list(GRANULARITIES))
    p.add_argument("--format", choices=("e4m3", "e5m2", "hybrid"), default="hybrid")
    p.add_argument("--fp8-wgrad", action="store_true", help="the experimental FP8 wgrad (default: bf16 wgrad)")
    p.add_argument("--fp4", action="store_true", help="turbo.ops.grouped_gemm_fp4 (MXFP4, emulated) instead")
    p.add_argument("--fast-accum", action="store_true",
                   help="Float8QuantConfig(fast_accum=True): the ROWWISE forward on the row-scaled kernel's fast mode")
    p.add_argument("--models", nargs="+", default=None)
    p.add_argument("--ep", nargs="+", type=int, default=None)
    p.add_argument("--tokens", nargs="+", type=int, default=None, help="average tokens per expert")
    p.add_argument(
        "--quick", action="store_true", help=f"{', '.join(QUICK_MODELS)} at their largest EP, {list(QUICK_TOKENS)}"
    )
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--tag", default=None)
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS)
    p.add_argument("--time-budget", type=float, default=None)
    p.add_argument("--no-summary", action="store_true")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    args.default_set = not args.quick and args.models is None and args.ep is None and args.tokens is None
    return args


def select_cases(args) -> list:
    return gc.select_cases(args, QUICK_MODELS, QUICK_TOKENS, balanced_only=True)


FAST_ACCUM = False  # --fast-accum: Float8QuantConfig(fast_accum=True)


def quant_config(granularity: str, fmt: str):
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity

    g = ScalingGranularity[granularity.upper()]
    return Float8QuantConfig(
        format=Format[fmt.upper()], granularity=g, block_size=128 if g == ScalingGranularity.BLOCKWISE else None,
        fast_accum=FAST_ACCUM,
    )


def gate_for(fmt: str):
    if fmt == FP4_NAME:
        return bu.FP4_GROUPED_GEMM_GATE
    return bu.FP8_E4M3_GATE if fmt == "e4m3" else bu.FP8_E5M2_OR_HYBRID_GATE


FP4_NAME = "mxfp4"  # the --fp4 pass's Granularity / Format column value


def grouped_op(granularity: str, fmt: str):
    """(x, w, lens) -> out for the op under test."""
    import primus_turbo.pytorch as turbo

    if granularity == FP4_NAME:
        from primus_turbo.pytorch.core.low_precision import Float4QuantConfig

        c4 = Float4QuantConfig()
        return lambda x, w, lens: turbo.ops.grouped_gemm_fp4(x, w, lens, config=c4)
    c8 = quant_config(granularity, fmt)
    return lambda x, w, lens: turbo.ops.grouped_gemm_fp8(x, w, lens, config=c8)


def warm_modules(granularities, fmt: str, fp8_wgrad: bool) -> None:
    """Builds every kernel point the runs can pick (both configs), in parallel."""
    from primus_turbo._core.lib import check, lib

    e4, e5, bf16 = 3, 4, 2
    fp4 = fmt == FP4_NAME
    if fp4:  # the emulation's E4M3 x E4M3 kernel with per-row (1x128) B scales
        granularities, fmt = [], "e4m3"
    fwd = e5 if fmt == "e5m2" else e4
    grad = e4 if fmt == "e4m3" else e5
    # TENSORWISE states its scale per 128x128 block; ROWWISE runs the row-scaled kernel (b_scale_rows 0),
    # and with --fast-accum both forwards take its fast form (128x256 tiles on large problems).
    rows = {"tensorwise": 128, "rowwise": 0, "blockwise": 128}
    jobs = {(a, fwd, bf16, rows[g], c) for g in granularities for a in (fwd, grad) for c in (0, 1)}
    if fp4:
        jobs |= {(e4, e4, bf16, 1, c) for c in (0, 1)}
    row_scaled = {"rowwise", "tensorwise"} & set(granularities)
    fast = {(fwd, fwd, bf16, c) for c in (0, 1, 2)} if FAST_ACCUM and row_scaled else set()
    wjobs = {(grad, fwd, bf16, c) for c in (0, 1)} if fp8_wgrad else set()
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(lib.pt_grouped_gemm_fp8_prepare, *j) for j in sorted(jobs)]
        futures += [pool.submit(lib.pt_grouped_gemm_fp8_wgrad_prepare, *j) for j in sorted(wjobs)]
        futures += [pool.submit(lib.pt_grouped_gemm_fp8_fast_prepare, *j) for j in sorted(fast)]
        for f in futures:
            check(f.result())
    jobs |= wjobs | fast
    print(f"[bench_grouped_gemm_fp8] {len(jobs)} kernel modules ready in {time.monotonic() - t0:.0f} s", flush=True)


def make_inputs(case, seed: int):
    return gc.make_inputs(case, torch.bfloat16, seed)


def run_case(row: dict, case, granularity: str, args) -> None:
    import primus_turbo.pytorch as turbo

    nan = float("nan")
    lens_cpu, x, w, grad = make_inputs(case, args.seed + row["TestID"])
    lens = lens_cpu.cuda()
    offs32 = torch.cumsum(lens_cpu, 0).to(torch.int32).cuda()
    fmt = FP4_NAME if granularity == FP4_NAME else args.format
    op = grouped_op(granularity, fmt)
    xr, wr = x.detach().requires_grad_(True), w.detach().requires_grad_(True)

    ours_fwd = lambda: op(x, w, lens)

    def ours_step():
        out = op(xr, wr, lens)
        return torch.autograd.grad(out, (xr, wr), grad)

    base_fwd = lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs32)
    base_step = lambda: (
        base_fwd(),
        torch._grouped_mm(grad, w, offs=offs32),
        torch._grouped_mm(grad.t(), x, offs=offs32),
    )

    flops = case.fwd_flops
    notes = []
    try:
        out = op(xr, wr, lens)
        dx, dw = torch.autograd.grad(out, (xr, wr), grad)
        refs = gc.references(lens_cpu, x, w, grad)
        ok, snrs, failures = gc.check_outputs((out, dx, dw), refs, gate=gate_for(fmt))
        notes += failures
        del refs, out, dx, dw
    except Exception as e:  # noqa: BLE001  (an error is a failed case, not a crashed benchmark)
        traceback.print_exc()
        ok, snrs = False, [nan] * 3
        notes.append(f"ERROR {type(e).__name__}: {e}")
    row["Check"] = "PASS" if ok else "FAIL"
    row["Out SNR (dB)"], row["DGrad SNR (dB)"], row["WGrad SNR (dB)"] = snrs

    t_f, t_s = gc.time_pair(ours_fwd, ours_step, ok, args.iters)
    b_f, b_s = gc.time_pair(base_fwd, base_step, True, args.iters)
    row["Forward Time (ms)"], row["Step Time (ms)"] = t_f, t_s
    row["Forward TFLOPS"], row["Step TFLOPS"] = bu.tflops(flops, t_f), bu.tflops(3 * flops, t_s)
    row["Baseline Forward TFLOPS"], row["Baseline Step TFLOPS"] = bu.tflops(flops, b_f), bu.tflops(3 * flops, b_s)
    row["Forward Ratio"] = row["Forward TFLOPS"] / row["Baseline Forward TFLOPS"]
    row["Step Ratio"] = row["Step TFLOPS"] / row["Baseline Step TFLOPS"]

    row["GEMM-only TFLOPS"] = row["Scaled Baseline TFLOPS"] = row["Scaled Ratio"] = nan
    if granularity == "rowwise" and ok:
        # The GEMM alone on the same pre-quantized E4M3 operands: ours vs torch._scaled_grouped_mm.
        e4 = torch.float8_e4m3fn
        qcfg = quant_config(granularity, args.format)
        g, n, k = w.shape
        qa, sa = turbo.ops.quantize_fp8(x, e4, qcfg.granularity, axis=-1)
        qb, sb = turbo.ops.quantize_fp8(w.reshape(g * n, k), e4, qcfg.granularity, axis=-1)
        qb, sb = qb.view(g, n, k), sb.view(g, n, 1)
        ours_q = lambda: turbo.ops.grouped_gemm_fp8((qa, sa), (qb, sb), lens, out_dtype=torch.bfloat16, config=qcfg)
        t_q = bu.time_cuda(ours_q, iters=args.iters)
        row["GEMM-only TFLOPS"] = bu.tflops(flops, t_q)
        try:
            sa1, sb1 = sa.reshape(-1).contiguous(), sb.reshape(g, n).contiguous()
            scaled = lambda: torch._scaled_grouped_mm(
                qa, qb.transpose(-2, -1), sa1, sb1, offs=offs32, out_dtype=torch.bfloat16
            )
            res = bu.check_close(scaled(), ours_q().float(), gate=bu.FP8_E4M3_GATE, what="scaled_grouped_mm")
            if not res.passed:
                notes.append("torch._scaled_grouped_mm disagrees: " + res.message)
            t_sc = bu.time_cuda(scaled, iters=args.iters)
            row["Scaled Baseline TFLOPS"] = bu.tflops(flops, t_sc)
            row["Scaled Ratio"] = row["GEMM-only TFLOPS"] / row["Scaled Baseline TFLOPS"]
        except Exception as e:  # noqa: BLE001  (not every torch build has it for sm_90)
            notes.append(f"torch._scaled_grouped_mm unavailable: {type(e).__name__}: {e}"[:300])
    row["Note"] = " | ".join(notes)


def main(argv: Sequence[str] | None = None) -> int:
    global FAST_ACCUM
    args = parse_args(argv)
    FAST_ACCUM = args.fast_accum
    if not torch.cuda.is_available():
        print("bench_grouped_gemm_fp8: no CUDA device", file=sys.stderr)
        return 2
    import primus_turbo.pytorch as turbo  # noqa: F401  (registers the ops)

    torch.backends.cuda.matmul.allow_tf32 = False
    cases = select_cases(args)
    gpu_name = torch.cuda.get_device_name()
    gpu = bu.gpu_short_name(gpu_name)
    out_dir = bu.results_dir_for(args.output_dir, gpu)
    tag = gc.run_tag(args)
    if args.fp4:
        args.granularity, args.format, args.fp8_wgrad = [FP4_NAME], FP4_NAME, False
    print(f"[bench_grouped_gemm_fp8] {len(cases)} cases x {args.granularity} ({args.format}) on {gpu_name}", flush=True)
    warm_modules(args.granularity, args.format, args.fp8_wgrad)
    if args.fp8_wgrad:
        sys.modules["primus_turbo.pytorch.ops.grouped_gemm_fp8"].FP8_WGRAD = True

    all_ok = True
    start = time.monotonic()
    for granularity in args.granularity:
        stem = f"grouped_gemm_fp8_{granularity}{'_fp8wgrad' if args.fp8_wgrad else ''}{'_' + tag if tag else ''}"
        if granularity == FP4_NAME:
            stem = f"grouped_gemm_fp4{'_' + tag if tag else ''}"
        csv_path = out_dir / f"{stem}.csv"
        rows = []
        for i, case in enumerate(cases, 1):
            if gc.budget_reached(args, start):
                print(f"[bench_grouped_gemm_fp8] time budget reached ({granularity}: {i - 1} cases)", flush=True)
                break
            row = {
                "TestID": i,
                "GPU": gpu,
                "Granularity": granularity,
                "Format": args.format,
                **gc.case_fields(case),
            }
            run_case(row, case, granularity, args)
            rows.append(row)
            print(
                f"[{granularity:<10} {i:>3}/{len(cases)}] {case.name:<28} EP={case.EP:<2} G={case.G:<3} "
                f"T/E={case.tokens_per_expert:<5} {row['Check']:<4} fwd {row['Forward TFLOPS']:.0f} step "
                f"{row['Step TFLOPS']:.0f} TFLOPS | bf16 step {row['Baseline Step TFLOPS']:.0f} | ratio "
                f"{row['Step Ratio']:.3f} | vs scaled_mm {row['Scaled Ratio']:.3f}",
                flush=True,
            )
            gc.write_rows(csv_path, rows, COLUMNS)
        gc.print_table(rows, TABLE_COLUMNS)
        passed = [r.get("Check") == "PASS" for r in rows]
        all_ok = all_ok and all(passed)
        extra = {}
        if granularity == "rowwise":
            extra["gemm_only_vs_scaled_grouped_mm_geomean"] = gc.passed_geomean(rows, passed, "Scaled Ratio")
        entry = bu.summary_entry(
            ours=[r["Step TFLOPS"] for r in rows],
            baseline_values=[r["Baseline Step TFLOPS"] for r in rows],
            passed=passed,
            metric=METRIC,
            baseline=BASELINE_NAME,
            gpu=gpu_name,
            dtype="fp4-mxfp4 (emulated via e4m3)" if granularity == FP4_NAME else f"fp8-{args.format}",
            granularity="mx_blockwise" if granularity == FP4_NAME else granularity,
            wgrad="fp8" if args.fp8_wgrad else "bf16",
            case_set=gc.case_set(args),
            cases_planned=len(cases),
            forward_ratio_geomean=gc.passed_geomean(rows, passed, "Forward Ratio"),
            torch=torch.__version__,
            csv=csv_path.name,
            **extra,
        )
        if not args.no_summary:
            bu.update_summary(args.output_dir, gpu, stem, entry)
        print(
            f"[bench_grouped_gemm_fp8] {stem}: {entry['passed']}/{entry['cases']} passed; step geomean "
            f"{entry['ours_geomean']:.0f} TFLOPS vs {BASELINE_NAME} {entry['baseline_geomean']:.0f}: ratio "
            f"{entry['ratio_geomean']:.3f} (fwd {entry['forward_ratio_geomean']:.3f})"
        )
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
