"""RoPE benchmark: turbo.ops.rope (q and k in one kernel) against torch eager and torch.compile of
the same math, forward and backward, on the attention head configurations of the model tables
(config.gen_rope_test_cases).

    python benchmark/ops/bench_rope.py --dtype bf16
    python benchmark/ops/bench_rope.py --quick

Per case (q [B, 4096, Hq, D], k [B, 4096, Hk, D], layout bshd, half-rotated, float32 cos/sin
table of the first rotary_dim features, positions = the sequence index):
  1. correctness first: q_out, k_out, dq, dk against float64 references (the backward against
     torch autograd of the reference) under the gates of shared/ACCURACY.md; a FAIL voids our timings;
  2. timing: calls replayed from a CUDA graph (device time; --no-graph: plain calls with CUDA
     events, host overhead included), inputs rotated so that L2 cannot serve repeats.

The metric is effective bandwidth: q and k read once and q_out and k_out written once (the same
for the backward's gradients), over the median time, and that as a fraction of the measured
device-to-device copy bandwidth. Writes <output-dir>/<gpu>/rope_<dtype>[_<tag>].csv and the
summary.json entries rope_fwd and rope_bwd (suffixed with _<dtype> unless bf16, and the tag).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
from pathlib import Path

import torch

if __package__:
    from . import bench_utils as bu
    from . import config as cfg
    from . import membound as mb
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_utils as bu  # type: ignore[no-redef]
    import config as cfg  # type: ignore[no-redef]
    import membound as mb  # type: ignore[no-redef]

METRIC = "effective GB/s"
THETA = 500000.0
# Quick: the GQA head shape of Llama-3.1-8B, MLA's partial rotation, GPT-OSS's narrow heads.
QUICK_SHAPES = {(32, 8, 128), (128, 128, 192), (64, 8, 64)}

COLUMNS = [
    "TestID",
    "GPU",
    "Case",
    "Tokens",
    "HeadsQ",
    "HeadsK",
    "HeadDim",
    "RotaryDim",
    "dtype",
    "Check",
    "Forward Time (ms)",
    "Forward GB/s",
    "Forward BW Fraction",
    "Backward Time (ms)",
    "Backward GB/s",
    "Backward BW Fraction",
    "Eager Forward GB/s",
    "Eager Backward GB/s",
    "Compiled Forward GB/s",
    "Compiled Backward GB/s",
    "Forward Ratio",
    "Backward Ratio",
    "Min SNR (dB)",
    "Rotating Sets",
    "Note",
]
TABLE = [
    ("Case", "Case"),
    ("Tokens", "Tokens"),
    ("Check", "Check"),
    ("Forward GB/s", "Fwd GB/s"),
    ("Forward BW Fraction", "Fwd frac"),
    ("Backward GB/s", "Bwd GB/s"),
    ("Backward BW Fraction", "Bwd frac"),
    ("Compiled Forward GB/s", "Comp Fwd"),
    ("Compiled Backward GB/s", "Comp Bwd"),
    ("Eager Forward GB/s", "Eager Fwd"),
    ("Forward Ratio", "Fwd ratio"),
    ("Backward Ratio", "Bwd ratio"),
]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--tokens", nargs="+", type=int, default=None, help=f"default: {list(cfg.ROPE_TOKENS)}")
    p.add_argument("--quick", action="store_true", help="three head shapes at 16384 tokens")
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--tag", default=None)
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--mem-budget-gb", type=float, default=8.0)
    p.add_argument("--no-compile-baseline", action="store_true")
    p.add_argument("--no-graph", action="store_true", help="time plain calls (host overhead included)")
    p.add_argument("--no-summary", action="store_true")
    args = p.parse_args(argv)
    args.default_set = args.tokens is None and not args.quick
    if args.quick:
        args.tokens = args.tokens or [16384]
    args.tokens = args.tokens or list(cfg.ROPE_TOKENS)
    return args


def torch_rope(q, k, cos, sin):
    """The same math in plain torch: float32 rotation of the first rotary_dim features."""
    half = cos.shape[1]
    c, s = cos[: q.shape[1], None, :], sin[: q.shape[1], None, :]

    def rot(x):
        xf = x.float()
        x1, x2, rest = xf[..., :half], xf[..., half : 2 * half], xf[..., 2 * half :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, rest), dim=-1).to(x.dtype)

    return rot(q), rot(k)


def reference(x, cos, sin):
    half = cos.shape[1]
    c, s = cos.double()[: x.shape[1], None, :], sin.double()[: x.shape[1], None, :]
    x = x.double()
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, rest), dim=-1)


def inverse(g, cos, sin):
    return reference(g, cos, -sin)  # the rotation is orthogonal: its gradient rotates back


gbps = mb.gbps


def check_case(turbo, q, k, dq, dk, cos, sin, dtype) -> dict:
    qr, kr = q.detach().requires_grad_(), k.detach().requires_grad_()
    qo, ko = turbo.ops.rope(qr, kr, cos, sin)
    gq, gk = torch.autograd.grad((qo, ko), (qr, kr), (dq, dk))
    results = []
    for b in range(q.shape[0]):  # per sequence: the float64 reference stays within memory
        one = slice(b, b + 1)
        for name, out, ref in (
            ("q_out", qo[one], reference(q[one], cos, sin)),
            ("k_out", ko[one], reference(k[one], cos, sin)),
            ("dq", gq[one], inverse(dq[one], cos, sin)),
            ("dk", gk[one], inverse(dk[one], cos, sin)),
        ):
            results.append(bu.check_close(out.detach(), ref, dtype, what=f"{name}[{b}]"))
            del ref
    bad = [r for r in results if not r]
    return {
        "Check": "FAIL" if bad else "PASS",
        "Min SNR (dB)": min(r.snr_db for r in results),
        "Note": "; ".join(r.message for r in bad[:3]),
    }


def time_fwd_bwd(fn, sets, cos, sin, args) -> tuple[float, float]:
    """Median ms of the forward and of the backward (autograd.grad of both outputs) over the sets,
    replayed from a CUDA graph (device time) unless --no-graph. The backward's forwards run on the
    stream the graph is captured on (autograd replays a backward on its forward's stream)."""
    fwd = mb.time_on(lambda q, k, dq, dk, fn=fn: fn(q, k, cos, sin), sets, args)
    stream = None if args.no_graph else torch.cuda.Stream()
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        bsets = [(fn(q, k, cos, sin), q, k, dq, dk) for q, k, dq, dk in sets]
    bwd = mb.time_on(
        lambda o, q, k, dq, dk: torch.autograd.grad(o, (q, k), (dq, dk), retain_graph=True), bsets, args, stream=stream
    )
    del bsets
    return fwd, bwd


def run_case(row, case, dtype, impls, copy_gbps, args, turbo) -> None:
    nan = float("nan")
    t, s = case.tokens, min(case.tokens, cfg.ROPE_SEQLEN)
    b = t // s
    es = torch.empty((), dtype=dtype).element_size()
    cos, sin = turbo.ops.rope_cos_sin(s, case.rotary_dim, THETA, device="cuda")

    def make():
        q = torch.randn(b, s, case.heads_q, case.head_dim, device="cuda", dtype=dtype)
        k = torch.randn(b, s, case.heads_k, case.head_dim, device="cuda", dtype=dtype)
        return q, k, torch.randn_like(q), torch.randn_like(k)

    nbytes = 2 * t * (case.heads_q + case.heads_k) * case.head_dim * es
    first = make()
    notes = []
    try:
        row.update(check_case(turbo, *first, cos, sin, dtype))
    except Exception as e:  # noqa: BLE001 -- one bad case must not end the run
        traceback.print_exc()
        row.update({"Check": "ERROR", "Note": f"{type(e).__name__}: {e}"[:300]})
    if row.get("Note"):
        notes.append(row["Note"])
    n_sets = bu.num_rotating_sets(nbytes, 2 * nbytes, memory_budget_bytes=int(args.mem_budget_gb * 2**30))
    sets = [first] + [make() for _ in range(n_sets - 1)]
    sets = [(q.requires_grad_(), k.requires_grad_(), dq, dk) for q, k, dq, dk in sets]
    row["Rotating Sets"] = n_sets
    times = mb.time_impls(impls, row, notes, (nan, nan), time_fwd_bwd, sets, cos, sin, args)
    fwd, bwd = times["ours"]
    row.update(
        {
            "Forward Time (ms)": fwd,
            "Forward GB/s": gbps(nbytes, fwd),
            "Forward BW Fraction": gbps(nbytes, fwd) / copy_gbps,
            "Backward Time (ms)": bwd,
            "Backward GB/s": gbps(nbytes, bwd),
            "Backward BW Fraction": gbps(nbytes, bwd) / copy_gbps,
            "Eager Forward GB/s": gbps(nbytes, times["eager"][0]),
            "Eager Backward GB/s": gbps(nbytes, times["eager"][1]),
            "Compiled Forward GB/s": gbps(nbytes, times.get("compiled", (nan, nan))[0]),
            "Compiled Backward GB/s": gbps(nbytes, times.get("compiled", (nan, nan))[1]),
            "Note": " | ".join(notes),
        }
    )
    base = "Compiled" if "compiled" in impls else "Eager"
    for d in ("Forward", "Backward"):
        row[f"{d} Ratio"] = mb.ratio(row[f"{d} GB/s"], row[f"{base} {d} GB/s"])


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_rope: no CUDA device", file=sys.stderr)
        return 2
    import primus_turbo.pytorch as turbo

    torch.manual_seed(1234)
    dtype = bu.DTYPES[args.dtype]
    cases = cfg.gen_rope_test_cases(args.tokens)
    if args.quick:
        cases = [c for c in cases if (c.heads_q, c.heads_k, c.head_dim) in QUICK_SHAPES]
    gpu_name = torch.cuda.get_device_name()
    gpu = bu.gpu_short_name(gpu_name)
    out_dir = bu.results_dir_for(args.output_dir, gpu)
    _, suffix, csv_path = mb.result_names(args, out_dir, "rope")
    copy_gbps = bu.measure_copy_bandwidth()
    print(f"[bench_rope] {len(cases)} cases on {gpu_name}; copy bandwidth {copy_gbps:.0f} GB/s", flush=True)

    impls = {"ours": lambda q, k, c, s: turbo.ops.rope(q, k, c, s), "eager": torch_rope}
    if not args.no_compile_baseline:
        impls["compiled"] = torch.compile(torch_rope, dynamic=False)
    rows = []
    for i, case in enumerate(cases, 1):
        row = {
            "TestID": i,
            "GPU": gpu,
            "Case": case.name,
            "Tokens": case.tokens,
            "HeadsQ": case.heads_q,
            "HeadsK": case.heads_k,
            "HeadDim": case.head_dim,
            "RotaryDim": case.rotary_dim,
            "dtype": args.dtype,
        }
        run_case(row, case, dtype, impls, copy_gbps, args, turbo)
        rows.append(row)
        print(
            f"[{i:>3}/{len(cases)}] {case.name:<20} T={case.tokens:<6} {row['Check']:<5} "
            f"fwd {row['Forward GB/s']:.0f} GB/s ({row['Forward BW Fraction']:.2f}) "
            f"bwd {row['Backward GB/s']:.0f} GB/s ({row['Backward BW Fraction']:.2f}) | "
            f"compiled {row['Compiled Forward GB/s']:.0f}/{row['Compiled Backward GB/s']:.0f} "
            f"eager {row['Eager Forward GB/s']:.0f}/{row['Eager Backward GB/s']:.0f}",
            flush=True,
        )
        bu.write_csv(csv_path, rows, COLUMNS)
        torch.cuda.empty_cache()

    print()
    print(bu.format_table(rows, [c for c, _ in TABLE], [h for _, h in TABLE]))
    passed = [r.get("Check") == "PASS" for r in rows]
    base = "Compiled" if "compiled" in impls else "Eager"
    for d, name in (("Forward", "rope_fwd"), ("Backward", "rope_bwd")):
        entry = mb.fwd_bwd_entry(
            rows, passed, d, base, gpu_name, args, copy_gbps, csv_path,
            timing="eager calls" if args.no_graph else "CUDA graph replay (device time)",
        )
        mb.publish(args, gpu, name + suffix, entry)
        print(
            f"[bench_rope] {name}: {entry['passed']}/{entry['cases']} passed; geomean {entry['ours_geomean']:.0f} GB/s "
            f"({entry['bandwidth_fraction']:.2f} of copy) vs {entry['baseline']} {entry['baseline_geomean']:.0f} GB/s: "
            f"ratio {entry['ratio_geomean']:.3f} (min {entry['ratio_min']:.3f})"
        )
    print(f"[bench_rope] results: {csv_path}")
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
