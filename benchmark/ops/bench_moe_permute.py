"""MoE token permutation benchmark, forward and backward, against torch eager and torch.compile of
the same indexing math, on DeepSeek-V3 (256 experts, top-8, hidden 7168), Qwen3-30B-A3B (128,
top-8, 2048) and Mixtral-8x7B (8, top-2, 4096) at 4096-16384 tokens:

- turbo.ops.moe_permute / moe_unpermute (top-k expert indices, top-k probabilities carried):
  summary entries moe_permute_fwd/_bwd and moe_unpermute_fwd/_bwd;
- turbo.ops.token_permute / token_unpermute (routing mask, merging probabilities): entries
  token_permute_fwd/_bwd and token_unpermute_fwd/_bwd.

    python benchmark/ops/bench_moe_permute.py                  # both families, torch.compile baseline
    python benchmark/ops/bench_moe_permute.py --quick          # moe_* only, 4096 tokens, eager baseline (< 60 s)
    python benchmark/ops/bench_moe_permute.py --ops moe --pad-multiple 128

Per case (random top-k routing, num_out_tokens = tokens * topk (+ experts * (pad - 1)), so no
host synchronization):
  1. correctness first: permuted rows and probabilities bitwise equal to the indexing reference,
     the merge against float64 under the gates; a FAIL voids our timings;
  2. timing (CUDA events, median of >= 50 calls, inputs rotated past L2).

Effective bandwidth counts the token rows each op must move once (permute: T*H read, T*k*H
written; unpermute: T*k*H read, T*H written; backward likewise, the merge's backward also reading
the forward input), as GB/s and as a fraction of the device copy bandwidth measured in the same
run. The torch baselines get the permutation indices for the unpermute precomputed (an argsort
for the permute).
"""

from __future__ import annotations

import argparse
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
TOKENS = (4096, 8192, 16384)
MODELS = ("DeepSeek-V3", "Qwen3-30B-A3B", "Mixtral-8x7B")
OPS = ("permute", "unpermute")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--models", nargs="+", default=None)
    p.add_argument("--tokens", nargs="+", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="moe_* ops, the three models at 4096 tokens, eager baseline")
    p.add_argument("--ops", choices=("all", "moe", "token"), default=None, help="op family (default: all; quick: moe)")
    p.add_argument("--pad-multiple", type=int, default=0, help="moe_permute's pad_multiple")
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--tag", default=None)
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS)
    p.add_argument("--no-compile-baseline", action="store_true")
    p.add_argument("--no-summary", action="store_true")
    args = p.parse_args(argv)
    args.default_set = args.models is None and args.tokens is None and not args.quick
    if args.quick:
        args.tokens = args.tokens or [4096]
        args.ops = args.ops or "moe"
        args.no_compile_baseline = True
    args.ops = args.ops or "all"
    args.models = args.models or list(MODELS)
    args.tokens = args.tokens or list(TOKENS)
    return args


def routing(t, e, k, device="cuda"):
    idx = torch.rand(t, e, device=device).argsort(dim=1)[:, :k]
    mask = torch.zeros(t, e, dtype=torch.bool, device=device).scatter_(1, idx, True)
    return mask, torch.rand(t, e, device=device) * mask


def torch_permute(x, probs, mask, num_out: int):
    """Expert-major order of the routed (token, expert) pairs by a stable sort, then a gather."""
    t = mask.shape[0]
    order = torch.argsort((~mask.t().reshape(-1)).to(torch.int8), stable=True)[:num_out]
    t_idx, e_idx = order % t, order // t
    return x[t_idx], probs[t_idx, e_idx]


def torch_unpermute(y, probs, t_idx, e_idx, num_tokens: int):
    w = probs[t_idx, e_idx].unsqueeze(1)
    return (
        torch.zeros(num_tokens, y.shape[1], dtype=torch.float32, device=y.device)
        .index_add_(0, t_idx, y.float() * w)
        .to(y.dtype)
    )


gbps = mb.gbps


# ---- shared by both op families --------------------------------------------------------------------


def time_ops(row, impls, inputs, bytes_fwd, bytes_bwd, args, notes) -> None:
    """Times each implementation's (permute, unpermute) pair, forward and backward, into the row's
    "<impl> <op> fwd|bwd GB/s" columns, then the BW fractions and ratios (see add_ratios).

    impls: name -> (permute fn, unpermute fn), called without arguments; inputs(name, op): the
    tensors whose gradients the backward computes; bytes_fwd / bytes_bwd: op -> bytes moved.
    """
    nan = float("nan")
    for name, (pf, uf) in impls.items():
        for op, fn in (("permute", pf), ("unpermute", uf)):
            if name == "ours" and row["Check"] != "PASS":
                row[f"{name} {op} fwd GB/s"] = row[f"{name} {op} bwd GB/s"] = nan
                continue
            try:
                fwd = bu.time_cuda(fn, iters=args.iters)
                res = fn()
                outs = tuple(
                    o for o in (res if isinstance(res, tuple) else (res,))
                    if isinstance(o, torch.Tensor) and o.requires_grad
                )
                grads = tuple(torch.randn_like(o) for o in outs)
                bwd = bu.time_cuda(
                    lambda outs=outs, grads=grads, inputs=inputs(name, op): torch.autograd.grad(
                        outs, inputs, grads, retain_graph=True, allow_unused=True
                    ),
                    iters=args.iters,
                )
            except Exception as ex:  # noqa: BLE001
                traceback.print_exc()
                fwd = bwd = nan
                notes.append(f"{name} {op}: {type(ex).__name__}: {ex}"[:200])
            row[f"{name} {op} fwd GB/s"] = gbps(bytes_fwd[op], fwd)
            row[f"{name} {op} bwd GB/s"] = gbps(bytes_bwd[op], bwd)


def record_check(row, notes, rows_ok: bool, res) -> None:
    """row["Check"] from the bitwise check of the permuted rows and the gated check ``res`` of the
    merge (a bu.CheckResult); the failures go to the notes."""
    row["Check"] = "PASS" if rows_ok and res else "FAIL"
    if not rows_ok:
        notes.append("permuted rows differ from the indexing reference")
    if not res:
        notes.append(res.message)


def record_error(row, notes, ex: Exception) -> None:
    """An exception in the correctness check is an ERROR row, not the end of the run."""
    traceback.print_exc()
    row["Check"] = "ERROR"
    notes.append(f"{type(ex).__name__}: {ex}"[:300])


def add_ratios(row, base: str, copy_gbps: float) -> None:
    """Per op and direction: ours as a fraction of the copy bandwidth, and ours / the baseline."""
    for op in OPS:
        for d in ("fwd", "bwd"):
            o = row[f"ours {op} {d} GB/s"]
            row[f"{op} {d} BW Fraction"] = o / copy_gbps
            row[f"{op} {d} Ratio"] = mb.ratio(o, row.get(f"{base} {op} {d} GB/s", float("nan")))


def run_cases(shapes, tokens, run_case, label, csv_path) -> list:
    """run_case(h, e, k, names, t) per shape and token count; prints each row (prefixed with
    label(row)) and rewrites the CSV after each."""
    rows = []
    for (h, e, k), names in shapes.items():
        for t in tokens:
            row = run_case(h, e, k, names, t)
            rows.append(row)
            print(
                f"{label(row)} T={t:<6} {row['Check']:<5} "
                + " ".join(
                    f"{op}-{d} {row[f'ours {op} {d} GB/s']:.0f} ({row[f'{op} {d} BW Fraction']:.2f}, x{row[f'{op} {d} Ratio']:.2f})"
                    for op in OPS
                    for d in ("fwd", "bwd")
                ),
                flush=True,
            )
            bu.write_csv(csv_path, rows, list(rows[0].keys()))
            torch.cuda.empty_cache()
    return rows


def write_summaries(rows, args, base, gpu, gpu_name, copy_gbps, csv_path, entry_name, **extra) -> list:
    """The summary entries entry_name(op, direction) of a family (``extra`` after the token counts);
    returns which cases passed."""
    passed = [r["Check"] == "PASS" for r in rows]
    for op in OPS:
        for d in ("fwd", "bwd"):
            entry = bu.summary_entry(
                ours=[r[f"ours {op} {d} GB/s"] for r in rows],
                baseline_values=[r.get(f"{base} {op} {d} GB/s", float("nan")) for r in rows],
                passed=passed,
                metric=METRIC,
                baseline="torch.compile" if base == "compiled" else "torch eager",
                gpu=gpu_name,
                dtype=args.dtype,
                bandwidth_fraction=mb.passed_geomean(rows, passed, f"{op} {d} BW Fraction"),
                eager_geomean=mb.passed_geomean(rows, passed, f"eager {op} {d} GB/s"),
                copy_gbps=copy_gbps,
                tokens=list(args.tokens),
                **extra,
                torch=torch.__version__,
                csv=csv_path.name,
            )
            name = entry_name(op, d)
            mb.publish(args, gpu, name, entry)
            print(
                f"[bench_moe_permute] {name}: {entry['passed']}/{entry['cases']} passed; {entry['ours_geomean']:.0f} GB/s "
                f"({entry['bandwidth_fraction']:.2f} of copy); vs {entry['baseline']} ratio {entry['ratio_geomean']:.3f}"
            )
    return passed


# ---- token_permute / token_unpermute -------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_moe_permute: no CUDA device", file=sys.stderr)
        return 2
    import primus_turbo.pytorch as turbo

    torch.manual_seed(1234)
    dtype = bu.DTYPES[args.dtype]
    es = torch.empty((), dtype=dtype).element_size()
    shapes = {}
    for name in args.models:
        m = cfg.MOE_MODELS[name]
        shapes.setdefault((m.hidden, m.num_experts, m.topk), []).append(name)
    gpu_name = torch.cuda.get_device_name()
    gpu = bu.gpu_short_name(gpu_name)
    out_dir = bu.results_dir_for(args.output_dir, gpu)
    _, suffix, csv_path = mb.result_names(args, out_dir, "moe_permute")
    copy_gbps = bu.measure_copy_bandwidth()
    print(f"[bench_moe_permute] {len(shapes) * len(args.tokens)} cases on {gpu_name}; copy {copy_gbps:.0f} GB/s")

    compiled_p = torch.compile(torch_permute, dynamic=False) if not args.no_compile_baseline else None
    compiled_u = torch.compile(torch_unpermute, dynamic=False) if not args.no_compile_baseline else None

    def run_case(h, e, k, names, t):
        n = t * k
        row = {"GPU": gpu, "Case": "/".join(names[:2]), "Tokens": t, "Hidden": h, "Experts": e, "TopK": k}
        x = torch.randn(t, h, device="cuda", dtype=dtype, requires_grad=True)
        mask, probs = routing(t, e, k)
        probs.requires_grad_()
        y = torch.randn(n, h, device="cuda", dtype=dtype, requires_grad=True)
        notes = []
        try:
            out, pprobs, rmap = turbo.ops.token_permute(x, probs, mask, num_out_tokens=n)
            ro, rp = torch_permute(x.detach(), probs.detach(), mask, n)
            ok_p = torch.equal(out, ro) and torch.equal(pprobs, rp)
            e_idx, t_idx = mask.t().nonzero(as_tuple=True)
            merged = turbo.ops.token_unpermute(y, rmap, probs)
            ref = torch.zeros(t, h, dtype=torch.float64, device="cuda").index_add_(
                0, t_idx, y.detach().double() * probs.detach()[t_idx, e_idx, None].double()
            )
            record_check(row, notes, ok_p, bu.check_close(merged.detach(), ref, dtype, what="merged"))
            del ref
        except Exception as ex:  # noqa: BLE001
            record_error(row, notes, ex)
        impls = {
            "ours": (
                lambda: turbo.ops.token_permute(x, probs, mask, num_out_tokens=n),
                lambda: turbo.ops.token_unpermute(y, rmap, probs),
            ),
            "eager": (
                lambda: torch_permute(x, probs, mask, n),
                lambda: torch_unpermute(y, probs, t_idx, e_idx, t),
            ),
        }
        if compiled_p is not None:
            impls["compiled"] = (
                lambda: compiled_p(x, probs, mask, n),
                lambda: compiled_u(y, probs, t_idx, e_idx, t),
            )
        bytes_fwd = {"permute": (t + n) * h * es, "unpermute": (n + t) * h * es}
        bytes_bwd = {"permute": (n + t) * h * es, "unpermute": (t + 2 * n) * h * es}
        inputs = {"permute": (x, probs), "unpermute": (y, probs)}
        time_ops(row, impls, lambda name, op: inputs[op], bytes_fwd, bytes_bwd, args, notes)
        add_ratios(row, base, copy_gbps)
        row["Note"] = " | ".join(notes)
        return row

    base = "compiled" if compiled_p is not None else "eager"
    rows = []
    if args.ops in ("all", "token"):
        rows = run_cases(shapes, args.tokens, run_case, lambda row: f"{row['Case']:<28}", csv_path)

    status = 0
    if args.ops in ("all", "moe"):
        status |= run_moe(args, shapes, dtype, es, gpu, gpu_name, out_dir, suffix, copy_gbps)
    if not rows:
        return status
    passed = write_summaries(
        rows, args, base, gpu, gpu_name, copy_gbps, csv_path, lambda op, d: f"token_{op}_{d}{suffix}"
    )
    return status | (0 if all(passed) else 1)


# ---- moe_permute / moe_unpermute ----------------------------------------------------------------


def topk_routing(t, e, k, device="cuda"):
    idx = torch.rand(t, e, device=device).argsort(dim=1)[:, :k].contiguous()
    return idx, torch.rand(t, k, device=device)


def torch_moe_permute(x, idx, probs):
    """Expert-major, token-ordered rows of the (token, k) pairs by one argsort, then a gather."""
    t, k = idx.shape
    key = idx.reshape(-1) * t + torch.arange(t, device=idx.device).repeat_interleave(k)
    order = torch.argsort(key)
    return x[order // k], probs.reshape(-1)[order]


def torch_moe_unpermute(y, pprobs, order, t: int, k: int):
    out = torch.zeros(t, y.shape[1], dtype=torch.float32, device=y.device).index_add_(0, order // k, y.float())
    up = torch.zeros(t * k, dtype=pprobs.dtype, device=y.device).index_copy(0, order, pprobs)
    return out.to(y.dtype), up.view(t, k)


def run_moe(args, shapes, dtype, es, gpu, gpu_name, out_dir, suffix, copy_gbps) -> int:
    import primus_turbo.pytorch as turbo

    pad = args.pad_multiple
    _, _, csv_path = mb.result_names(args, out_dir, "moe_index_permute")
    compiled_p = torch.compile(torch_moe_permute, dynamic=False) if not args.no_compile_baseline else None
    compiled_u = torch.compile(torch_moe_unpermute, dynamic=False) if not args.no_compile_baseline else None
    base = "compiled" if compiled_p is not None else "eager"

    def run_case(h, e, k, names, t):
        row = {"GPU": gpu, "Case": "/".join(names[:2]), "Tokens": t, "Hidden": h, "Experts": e, "TopK": k, "Pad": pad}
        cap = t * k + e * max(pad - 1, 0)
        x = torch.randn(t, h, device="cuda", dtype=dtype, requires_grad=True)
        idx, probs = topk_routing(t, e, k)
        probs.requires_grad_()
        kw = dict(num_local_experts=e, num_topk=k, pad_multiple=pad, num_permuted_tokens=cap)
        notes = []
        key = idx.reshape(-1) * t + torch.arange(t, device="cuda").repeat_interleave(k)
        order = torch.argsort(key)
        y = torch.randn(cap, h, device="cuda", dtype=dtype, requires_grad=True)
        pp_in = torch.rand(cap, device="cuda", requires_grad=True)
        y_ref = torch.randn(t * k, h, device="cuda", dtype=dtype, requires_grad=True)
        pp_ref = torch.rand(t * k, device="cuda", requires_grad=True)
        try:
            out, rmap, _, _, nd, _, pprobs = turbo.ops.moe_permute(x, idx, probs=probs, **kw)
            ro, rp = torch_moe_permute(x.detach(), idx, probs.detach())
            routes = rmap[:t, :k].long() - 1  # every token has k distinct experts: k rows each
            cols = rmap[:t, e : e + k].long()
            ok_p = torch.equal(out[routes], x.detach()[:, None, :].expand(t, k, h)) and torch.equal(
                pprobs[routes], probs.detach().gather(1, cols)
            )
            if pad == 0:
                ok_p = ok_p and torch.equal(out, ro) and torch.equal(pprobs, rp)
            back, _ = turbo.ops.moe_unpermute(y, rmap, nd, restore_shape=x.shape, num_local_experts=e, pad_multiple=pad)
            ref = y.detach().double()[routes].sum(1)
            record_check(row, notes, ok_p, bu.check_close(back.detach(), ref, dtype, what="unpermuted"))
            del ref
        except Exception as ex:  # noqa: BLE001
            record_error(row, notes, ex)
            rmap = nd = None
        impls = {
            "ours": (
                lambda: turbo.ops.moe_permute(x, idx, probs=probs, **kw),
                lambda: turbo.ops.moe_unpermute(
                    y, rmap, nd, restore_shape=x.shape, num_local_experts=e, permuted_probs=pp_in,
                    probs_topk_stride=k, pad_multiple=pad,
                ),
            ),
            "eager": (
                lambda: torch_moe_permute(x, idx, probs),
                lambda: torch_moe_unpermute(y_ref, pp_ref, order, t, k),
            ),
        }
        if compiled_p is not None:
            impls["compiled"] = (
                lambda: compiled_p(x, idx, probs),
                lambda: compiled_u(y_ref, pp_ref, order, t, k),
            )
        moved = (t + t * k) * h * es
        inputs = {
            ("ours", "unpermute"): (y, pp_in),
            "permute": (x, probs),
            "unpermute": (y_ref, pp_ref),
        }
        time_ops(
            row, impls, lambda name, op: inputs.get((name, op), inputs[op]),
            {"permute": moved, "unpermute": moved}, {"permute": moved, "unpermute": moved}, args, notes,
        )
        add_ratios(row, base, copy_gbps)
        row["Note"] = " | ".join(notes)
        return row

    rows = run_cases(shapes, args.tokens, run_case, lambda row: f"moe {row['Case']:<24}", csv_path)
    if not rows:
        return 0
    passed = write_summaries(
        rows, args, base, gpu, gpu_name, copy_gbps, csv_path,
        lambda op, d: f"moe_{op}_{d}{suffix}" + (f"_pad{pad}" if pad else ""), pad_multiple=pad,
    )
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
