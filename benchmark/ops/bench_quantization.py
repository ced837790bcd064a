"""Quantization benchmark: turbo.ops FP8 / FP4 quantizers against torch eager of the same math, on
the GEMM operands of model layers (config.gen_quant_test_cases: activations [tokens, K] and
weights [N, K]).

    python benchmark/ops/bench_quantization.py
    python benchmark/ops/bench_quantization.py --dtype bf16 --models Llama-3.1-8B --tokens 4096 8192

Ops (FP8 = E4M3): quantize_fp8 tensorwise, rowwise (axis -1), blockwise (1x128 for activations,
128x128 for weights), mx_blockwise (1x32, E8M0), quantize_fp8_with_trans blockwise (row-wise and
transposed column-wise from one read), quantize_fp4 (MXFP4 along the last dim).

Per case and op: correctness first (ours against the eager result: every FP8 value within one
unit in the last place and >= 99.9% bitwise equal, FP4 codes and all scales equal); a FAIL voids
our timing. Then device timing: calls replayed from a CUDA graph (``--no-graph``: plain calls with
CUDA events, host overhead included), cycling through rotating inputs (L2 cannot serve repeats). Memory bound:
the metric is effective bandwidth, bytes read + written counted once (x, q, scales) over the
median time, also as a fraction of the device-to-device copy bandwidth measured in this run.
Writes <output-dir>/<gpu>/quantization_<dtype>[_<tag>].csv and summary.json entries
quantize_fp8_<granularity>, quantize_fp8_with_trans_blockwise, quantize_fp4.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import torch

if __package__:
    from . import bench_utils as bu
    from . import config as cfg
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_utils as bu  # type: ignore[no-redef]
    import config as cfg  # type: ignore[no-redef]

METRIC = "effective GB/s"
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
OPS = ("with_trans_blockwise", "blockwise", "mx_blockwise", "tensorwise", "rowwise", "fp4")
ENTRY = {
    "tensorwise": "quantize_fp8_tensorwise",
    "rowwise": "quantize_fp8_rowwise",
    "blockwise": "quantize_fp8_blockwise",
    "mx_blockwise": "quantize_fp8_mx_blockwise",
    "with_trans_blockwise": "quantize_fp8_with_trans_blockwise",
    "fp4": "quantize_fp4",
}
COLUMNS = ["TestID", "GPU", "Case", "Kind", "M", "K", "dtype", "Op", "Check", "Time (ms)", "GB/s", "BW Fraction",
           "Eager Time (ms)", "Eager GB/s", "Ratio", "Rotating Sets", "Note"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--models", nargs="+", default=None, help=f"default: {list(cfg.QUANT_MODELS)}")
    p.add_argument("--tokens", nargs="+", type=int, default=None, help=f"default: {list(cfg.QUANT_TOKENS)}")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--tag", default=None)
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--mem-budget-gb", type=float, default=4.0)
    p.add_argument("--no-graph", action="store_true", help="time plain calls (host overhead included)")
    p.add_argument("--no-summary", action="store_true")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    args.default_set = args.models is None and args.tokens is None and args.ops == list(OPS)
    args.tokens = args.tokens or list(cfg.QUANT_TOKENS)
    return args


# ---- torch eager of the same math (the baseline, and the reference ours is checked against) ----------


def _fp32_scale(amax):
    # A true division (a Python scalar / tensor is reciprocal-then-multiply in torch: two roundings).
    mult = torch.full_like(amax, FP8_MAX) / amax.clamp(min=1e-30)
    return mult, mult.reciprocal()


def _mx_scale(amax, fmax):
    # The E8M0 exponent ceil(log2(amax / fmax)), the quotient rounded to float32 as the kernels do.
    m, exp = torch.frexp(amax.float() / torch.full_like(amax, fmax, dtype=torch.float32))
    e = torch.where(m == 0.5, exp - 1, exp)
    e = torch.where(amax > 0, e, torch.full_like(e, -127)).clamp(-127, 127)
    return torch.exp2(-e.float()), (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def _cast(v):
    return v.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def eager_tensorwise(x):
    mult, inv = _fp32_scale(x.abs().amax().float())
    return _cast(x.float() * mult), inv


def eager_rowwise(x):
    mult, inv = _fp32_scale(x.abs().amax(-1, keepdim=True).float())
    return _cast(x.float() * mult), inv


def eager_block_1d(x, b=128):
    m, k = x.shape
    xb = x.float().view(m, k // b, b)
    mult, inv = _fp32_scale(xb.abs().amax(-1, keepdim=True))
    return _cast(xb * mult).view(m, k), inv.view(m, k // b)


def eager_block_2d(x, b=128):
    m, k = x.shape
    xb = x.float().view(m // b, b, k // b, b)
    mult, inv = _fp32_scale(xb.abs().amax((1, 3), keepdim=True))
    return _cast(xb * mult).view(m, k), inv.view(m // b, k // b)


def eager_mx(x):
    m, k = x.shape
    xb = x.float().view(m, k // 32, 32)
    mult, s = _mx_scale(xb.abs().amax(-1, keepdim=True), FP8_MAX)
    return _cast(xb * mult).view(m, k), s.view(m, k // 32)


def eager_with_trans(x, two_d):
    """Row copy and column copy: 2-D blocks transposed (as quantize_fp8_with_trans stores them),
    1-D blocks quantized along M in place ([M, K], scales [M/B, K])."""
    if two_d:
        q, s = eager_block_2d(x)
        qt, st = eager_block_2d(x.t().contiguous())
        return q, s, qt, st
    q, s = eager_block_1d(x)
    qt, st = eager_block_1d(x.t().contiguous())
    return q, s, qt.t().contiguous(), st.t().contiguous()


def eager_fp4(x):
    m, k = x.shape
    xb = x.float().view(m, k // 32, 32)
    mult, s = _mx_scale(xb.abs().amax(-1, keepdim=True), 6.0)
    a = (xb * mult).view(m, k)
    mag = a.abs()
    c = ((mag > 0.25).to(torch.uint8) + (mag >= 0.75) + (mag > 1.25) + (mag >= 1.75) + (mag > 2.5) + (mag >= 3.5)
         + (mag > 5.0))
    c = c + 8 * torch.signbit(a).to(torch.uint8)
    c = c.view(m, k // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).contiguous(), s.view(m, k // 32)


# ---- ours --------------------------------------------------------------------------------------------


def ours_fn(op: str, kind: str):
    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.core.low_precision import ScalingGranularity as G
    from primus_turbo.pytorch.core.low_precision import ScalingRecipe

    two_d = ScalingRecipe(use_2d_block=True) if kind == "weight" else None
    q = turbo.ops.quantize_fp8
    return {
        "tensorwise": lambda x: q(x, FP8, G.TENSORWISE),
        "rowwise": lambda x: q(x, FP8, G.ROWWISE, axis=-1),
        "blockwise": lambda x: q(x, FP8, G.BLOCKWISE, block_size=128, axis=-1, scaling_recipe=two_d),
        "mx_blockwise": lambda x: q(x, FP8, G.MX_BLOCKWISE, block_size=32, axis=-1),
        "with_trans_blockwise": lambda x: turbo.ops.quantize_fp8_with_trans(x, FP8, G.BLOCKWISE, block_size=128,
                                                                            scaling_recipe=two_d),
        "fp4": lambda x: turbo.ops.quantize_fp4(x, axis=-1),
    }[op]


def eager_fn(op: str, kind: str):
    return {
        "tensorwise": eager_tensorwise,
        "rowwise": eager_rowwise,
        "blockwise": eager_block_2d if kind == "weight" else eager_block_1d,
        "mx_blockwise": eager_mx,
        "with_trans_blockwise": lambda x: eager_with_trans(x, kind == "weight"),
        "fp4": eager_fp4,
    }[op]


def moved_bytes(outs, x) -> int:
    """x read once, every output written once (absent outputs are empty)."""
    return bu.tensor_bytes(x) + sum(t.numel() * t.element_size() for t in outs)


def compare(ours, ref) -> str:
    """'' when equal under the benchmark's rule, else what differs."""
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a.shape != b.shape and a.numel() == b.numel():
            a = a.reshape(b.shape)
        if a.shape != b.shape:
            return f"output {i}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        if a.dtype == FP8:
            da, db = a.double(), b.double()
            _, e = torch.frexp(db.abs())
            ulp = torch.exp2((torch.clamp(e - 1, min=-6) - 3).double())
            if ((da - db).abs() > ulp).any() or not torch.isfinite(da).all():
                return f"output {i}: FP8 values beyond one ulp"
            eq = (a.view(torch.uint8) == b.view(torch.uint8)).double().mean().item()
            if eq < 0.999:
                return f"output {i}: only {eq:.4%} bitwise equal"
        elif not torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                             b.view(torch.uint8) if b.element_size() == 1 else b.to(a.dtype)):
            return f"output {i}: differs"
    return ""


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9 if ms and math.isfinite(ms) and ms > 0 else float("nan")


def run_case(case, op, dtype, copy_gbps, args) -> dict:
    nan = float("nan")
    row = {"Case": case.name, "Kind": case.kind, "M": case.m, "K": case.k, "dtype": args.dtype, "Op": op}
    notes = []
    x = torch.randn(case.m, case.k, device="cuda", dtype=dtype)
    ours, eager = ours_fn(op, case.kind), eager_fn(op, case.kind)
    try:
        outs = ours(x)
        ref = eager(x)
        msg = compare(outs, ref)
        row["Check"] = "FAIL" if msg else "PASS"
        if msg:
            notes.append(msg)
        nbytes = moved_bytes(outs, x)
        del outs, ref
    except Exception as e:  # noqa: BLE001 -- one bad case must not end the run
        traceback.print_exc()
        row["Check"] = "ERROR"
        notes.append(f"{type(e).__name__}: {e}"[:300])
        nbytes = 0
    n_sets = bu.num_rotating_sets(bu.tensor_bytes(x), memory_budget_bytes=int(args.mem_budget_gb * 2**30))
    sets = [(x,)] + [(torch.randn_like(x),) for _ in range(n_sets - 1)]
    row["Rotating Sets"] = n_sets
    t_ours = t_eager = nan
    def timed(fn):
        if args.no_graph:
            return bu.time_cuda(fn, rotate=sets, warmup=args.warmup, iters=args.iters)
        return bu.time_cuda_graph(fn, rotate=sets, warmup=args.warmup)

    if row["Check"] == "PASS":
        t_ours = timed(ours)
    try:
        t_eager = timed(eager)
    except Exception as e:  # noqa: BLE001 (e.g. out of memory on the largest weights)
        notes.append(f"eager: {type(e).__name__}"[:200])
    sets = x = None  # free the rotating copies before the next case
    row.update({
        "Time (ms)": t_ours,
        "GB/s": gbps(nbytes, t_ours),
        "BW Fraction": gbps(nbytes, t_ours) / copy_gbps,
        "Eager Time (ms)": t_eager,
        "Eager GB/s": gbps(nbytes, t_eager),
        "Note": " | ".join(notes),
    })
    row["Ratio"] = t_eager / t_ours if math.isfinite(t_ours) and math.isfinite(t_eager) else nan
    return row


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_quantization: no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    dtype = bu.DTYPES[args.dtype]
    cases = cfg.gen_quant_test_cases(args.tokens, args.models)
    gpu_name = torch.cuda.get_device_name()
    gpu = bu.gpu_short_name(gpu_name)
    out_dir = bu.results_dir_for(args.output_dir, gpu)
    tag = args.tag if args.tag is not None else ("" if args.default_set else "subset")
    suffix = ("" if args.dtype == "bf16" else f"_{args.dtype}") + (f"_{tag}" if tag else "")
    csv_path = out_dir / f"quantization_{args.dtype}{'_' + tag if tag else ''}.csv"
    copy_gbps = bu.measure_copy_bandwidth()
    print(f"[bench_quantization] {len(cases)} cases x {len(args.ops)} ops on {gpu_name}; copy {copy_gbps:.0f} GB/s")
    rows = []
    all_ok = True
    # Op by op, so that each op's summary entry is written as soon as its cases are done.
    for op in args.ops:
        for case in cases:
            row = {"TestID": len(rows) + 1, "GPU": gpu, **run_case(case, op, dtype, copy_gbps, args)}
            rows.append(row)
            print(f"[{row['TestID']:>3}] {case.name:<28} {case.m:>6}x{case.k:<6} {op:<21} {row['Check']:<5} "
                  f"{row['GB/s']:7.0f} GB/s ({row['BW Fraction']:.2f})  eager {row['Eager GB/s']:6.0f}  "
                  f"x{row['Ratio']:.1f} {row['Note']}", flush=True)
            bu.write_csv(csv_path, rows, COLUMNS)
            torch.cuda.empty_cache()
        rs = [r for r in rows if r["Op"] == op]
        passed = [r["Check"] == "PASS" for r in rs]
        all_ok &= all(passed)
        entry = bu.summary_entry(
            ours=[r["GB/s"] for r in rs],
            baseline_values=[r["Eager GB/s"] for r in rs],
            passed=passed,
            metric=METRIC,
            baseline="torch eager",
            gpu=gpu_name,
            dtype=args.dtype,
            bandwidth_fraction=bu.geomean(r["BW Fraction"] for r, p in zip(rs, passed) if p),
            bandwidth_fraction_min=min((r["BW Fraction"] for r, p in zip(rs, passed) if p), default=float("nan")),
            copy_gbps=copy_gbps,
            tokens=list(args.tokens),
            torch=torch.__version__,
            csv=csv_path.name,
        )
        if not args.no_summary:
            bu.update_summary(args.output_dir, gpu, ENTRY[op] + suffix, entry)
        print(f"[bench_quantization] {ENTRY[op]}: {entry['passed']}/{entry['cases']} passed; {entry['ours_geomean']:.0f} GB/s "
              f"({entry['bandwidth_fraction']:.2f} of copy) vs eager {entry['baseline_geomean']:.0f}: "
              f"x{entry['ratio_geomean']:.2f} (min x{entry['ratio_min']:.2f})", flush=True)
    print(f"[bench_quantization] results: {csv_path}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
