"""FP8 GEMM benchmark on the dense model shapes (a [M, K] activations, b [N, K] weights), per granularity:

  gemm_fp8_<granularity>_gemm_only  the FP8 GEMM alone on pre-quantized operands (E4M3, bf16 out),
                                    TFLOPS vs torch._scaled_mm with the same scales
  gemm_fp8_<granularity>_e2e        bf16 in -> bf16 out training step of turbo.ops.gemm_fp8
                                    (quantization included, forward + dgrad + wgrad), combined
                                    TFLOPS (6MNK / time) vs torch.matmul in bf16

    python benchmark/ops/bench_gemm_fp8.py                  # default models, MBS 1 2 4
    python benchmark/ops/bench_gemm_fp8.py --quick          # one model, MBS 1 (~3-4 min on an H100)
    python benchmark/ops/bench_gemm_fp8.py --granularity blockwise --kind gemm_only
    python benchmark/ops/bench_gemm_fp8.py --granularity mx_blockwise fp4 --quick   # MX / FP4 (~1-2 min)

MX_BLOCKWISE (gemm_fp8_mx_blockwise_*) and FP4 (gemm_fp4_e2e, turbo.ops.gemm_fp4 with its default
recipe) are emulated on Hopper (per-32 E8M0 scales restated as 1x128 blocks, FP4 expanded to
E4M3); their GEMM-only baseline is torch.matmul in bf16 (torch._scaled_mm has no MX on sm_90), and
the GEMM-only time includes the restatement of both operands. FP4's gate is 10 dB.

Correctness is checked before timing (GEMM-only: SNR >= 40 dB against the float64 product of the
dequantized operands; e2e: forward, dgrad and wgrad >= 25 dB against float64 products of the bf16
inputs); a FAIL voids that row's timing. Baselines run in the same process on the same inputs.
Writes <output-dir>/<gpu>/gemm_fp8_<granularity>_<kind>[_quick].csv/.png and summary entries.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from pathlib import Path

import torch

if __package__:
    from . import bench_utils as bu
    from . import config as cfg
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_utils as bu  # type: ignore[no-redef]
    import config as cfg  # type: ignore[no-redef]

GRANULARITIES = ("tensorwise", "rowwise", "blockwise", "mx_blockwise", "fp4")
KINDS = ("gemm_only", "e2e")
COLUMNS = ["TestID", "GPU", "Case", "MBS", "M", "N", "K", "Granularity", "Check", "SNR (dB)", "Ours ms",
           "Ours TFLOPS", "Baseline", "Baseline ms", "Baseline TFLOPS", "Ratio", "Torch FP8 ms", "Torch FP8 TFLOPS",
           "Note"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--granularity", nargs="+", choices=GRANULARITIES, default=list(GRANULARITIES))
    p.add_argument("--kind", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--models", nargs="+", default=None)
    p.add_argument("--mbs", nargs="+", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="one model (Llama-3.1-8B), MBS 1")
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--no-summary", action="store_true")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--profile", action="store_true", help="print a kernel-time breakdown of one e2e step per granularity")
    p.add_argument("--backend", default=None, type=str.upper, help="force the FP8 GEMM backend (CUBLASLT, CUTLASS)")
    args = p.parse_args(argv)
    args.default_set = args.models is None and args.mbs is None and not args.quick
    if args.quick:
        args.models, args.mbs = args.models or ["Llama-3.1-8B"], args.mbs or [1]
    args.mbs = args.mbs or list(cfg.MICRO_BATCH_SIZES)
    return args


def _config(gran: str):
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity

    if gran == "fp4":
        from primus_turbo.pytorch.core.low_precision import Float4QuantConfig

        return Float4QuantConfig()
    g = ScalingGranularity[gran.upper()]
    if gran == "mx_blockwise":
        from primus_turbo.pytorch.core.low_precision import ScaleDtype

        return Float8QuantConfig(format=Format.E4M3, granularity=g, block_size=32, scale_dtype=ScaleDtype.E8M0)
    return Float8QuantConfig(format=Format.E4M3, granularity=g, block_size=128 if gran == "blockwise" else None)


def _gemm(gran):
    """The op a granularity's e2e entry times."""
    import primus_turbo.pytorch as turbo

    return turbo.ops.gemm_fp4 if gran == "fp4" else turbo.ops.gemm_fp8


def _gate(gran):
    return 10.0 if gran == "fp4" else 25.0


# ---- GEMM only -----------------------------------------------------------------------------


def _quantized(m, n, k, gran):
    """E4M3 operands quantized along K, with their dequantized float64 product."""
    from primus_turbo.pytorch.ops import _fp8_quant

    g = _config(gran).granularity
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).mul_(k**-0.5)
    qa, sa, _, _ = _fp8_quant.quantize_with_trans(a, torch.float8_e4m3fn, g, 128, False)
    qb, sb, _, _ = _fp8_quant.quantize_with_trans(b, torch.float8_e4m3fn, g, 128, gran == "blockwise")
    return qa, sa, qb, sb


def _dequant(q, s, br, bc):
    r, c = q.shape
    s = s.double()
    if s.dim() == 0:
        return q.double() * s
    full = s.repeat_interleave(br if s.shape[0] != r else 1, 0)[:r]
    full = full.repeat_interleave(bc if s.shape[1] != 1 else c, 1)[:, :c]
    return q.double() * full


def _scaled_mm_variants(qa, sa, qb, sb, gran):
    """torch._scaled_mm calls for our scales, in the layouts torch documents for each granularity."""
    mm = lambda x, y: (lambda: torch._scaled_mm(qa, qb.t(), x, y, out_dtype=torch.bfloat16))
    if gran == "tensorwise":
        return [mm(sa, sb)]
    if gran == "rowwise":
        return [mm(sa.reshape(-1, 1), sb.reshape(1, -1))]
    sa_outer = sa.t().contiguous().t()  # 1x128 scales must be outer-dim-major
    return [mm(sa_outer, sb.t()), mm(sa_outer, sb.t().contiguous()), mm(sa_outer, sb)]


def _mx_quantized(m, n, k):
    import primus_turbo.pytorch as turbo

    g = _config("mx_blockwise").granularity
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).mul_(k**-0.5)
    qa, sa = turbo.ops.quantize_fp8(a, torch.float8_e4m3fn, g, block_size=32, axis=-1)
    qb, sb = turbo.ops.quantize_fp8(b, torch.float8_e4m3fn, g, block_size=32, axis=-1)
    return qa, sa, qb, sb


def mx_gemm_only_case(row, m, n, k, gran, args):
    """MX E4M3 operands (quantize_fp8 along K) through gemm_fp8's pre-quantized path: the
    restatement to 1x128 blocks and the block-scaled GEMM, vs torch.matmul bf16."""
    import primus_turbo.pytorch as turbo

    config = _config(gran)
    g = config.granularity
    qa, sa, qb, sb = _mx_quantized(m, n, k)
    ours = lambda qa, sa, qb, sb: turbo.ops.gemm_fp8((qa, sa), (qb, sb), trans_b=True, out_dtype=torch.bfloat16,
                                                     config=config)
    out = ours(qa, sa, qb, sb)
    deq = lambda q, s: turbo.ops.dequantize_fp8(q, torch.bfloat16, g, block_size=32, axis=-1, scale_inv=s)
    da, db = deq(qa, sa), deq(qb, sb)
    row["SNR (dB)"] = snr = bu.snr_db(out, da.double() @ db.double().t())
    row["Check"] = "PASS" if snr >= 40.0 and torch.isfinite(out).all() else "FAIL"
    n_sets = bu.num_rotating_sets(qa.numel() + qb.numel(), memory_budget_bytes=8 << 30)
    sets = [(qa, sa, qb, sb)] + [_mx_quantized(m, n, k) for _ in range(n_sets - 1)]
    if row["Check"] == "PASS":
        row["Ours ms"] = bu.time_cuda(ours, rotate=sets, warmup=args.warmup, iters=args.iters)
    bsets = [(deq(*x[:2]), deq(*x[2:])) for x in sets]
    row["Baseline"] = "torch.matmul bf16"
    row["Baseline ms"] = bu.time_cuda(lambda x, y: torch.matmul(x, y.t()), rotate=bsets, warmup=args.warmup,
                                      iters=args.iters)
    row["Note"] = "emulated: restatement of both operands included"
    return 2.0 * m * n * k


def gemm_only_case(row, m, n, k, gran, args):
    if gran == "mx_blockwise":
        return mx_gemm_only_case(row, m, n, k, gran, args)
    from primus_turbo.pytorch.ops.gemm_fp8 import ROW, TENSOR, BLOCK_1x128, BLOCK_128x128, fp8_mm

    act, wgt = {"tensorwise": (TENSOR, TENSOR), "rowwise": (ROW, ROW), "blockwise": (BLOCK_1x128, BLOCK_128x128)}[gran]
    qa, sa, qb, sb = _quantized(m, n, k, gran)
    ours = lambda qa, sa, qb, sb: fp8_mm(qa, sa, act, qb, sb, wgt, torch.bfloat16)
    out = ours(qa, sa, qb, sb)
    ba, bb = (128, 128) if gran == "blockwise" else (1, 1)
    ref = _dequant(qa, sa, 1, 128) @ _dequant(qb, sb, ba, bb).t()
    row["SNR (dB)"] = snr = bu.snr_db(out, ref)
    del ref
    row["Check"] = "PASS" if snr >= 40.0 and torch.isfinite(out).all() else "FAIL"
    n_sets = bu.num_rotating_sets(qa.numel() + qb.numel(), memory_budget_bytes=8 << 30)
    sets = [(qa, sa, qb, sb)] + [_quantized(m, n, k, gran) for _ in range(n_sets - 1)]
    if row["Check"] == "PASS":
        row["Ours ms"] = bu.time_cuda(ours, rotate=sets, warmup=args.warmup, iters=args.iters)
    notes = []
    for i, call in enumerate(_scaled_mm_variants(qa, sa, qb, sb, gran)):
        try:
            base = call()
            if bu.snr_db(base, out.float()) < 30.0:
                notes.append(f"_scaled_mm variant {i} disagrees")
                continue
        except Exception as e:  # noqa: BLE001 -- torch may not support this scaling here
            notes.append(f"_scaled_mm variant {i}: {type(e).__name__}: {str(e)[:120]}")
            continue
        variants = lambda qa, sa, qb, sb, i=i: _scaled_mm_variants(qa, sa, qb, sb, gran)[i]()
        row["Baseline ms"] = bu.time_cuda(variants, rotate=sets, warmup=args.warmup, iters=args.iters)
        notes = []
        break
    row["Baseline"] = "torch._scaled_mm"
    row["Note"] = "; ".join(notes)
    return 2.0 * m * n * k


# ---- end to end ----------------------------------------------------------------------------


def _torch_quantize(x, gran):
    """torch eager E4M3 quantization along the last dim: (q, scale_inv) as torch._scaled_mm takes
    them (0-dim for tensorwise, [rows, 1] for rowwise)."""
    fmax = torch.finfo(torch.float8_e4m3fn).max
    xf = x.float()
    amax = xf.abs().amax() if gran == "tensorwise" else xf.abs().amax(dim=-1, keepdim=True)
    scale = fmax / amax.clamp(min=1e-12)
    return (xf * scale).clamp(-fmax, fmax).to(torch.float8_e4m3fn), scale.reciprocal()


def _torch_fp8_mm(x, y, gran):
    """x [R, C] @ y [S, C]^T in FP8 with torch's own quantization and torch._scaled_mm."""
    qx, sx = _torch_quantize(x, gran)
    qy, sy = _torch_quantize(y, gran)
    return torch._scaled_mm(qx, qy.t(), sx, sy if gran == "tensorwise" else sy.reshape(1, -1), out_dtype=torch.bfloat16)


def torch_fp8_step(a, b, g, gran):
    """The training step the way users stitch it today (tensorwise / rowwise): quantize with torch
    ops, then torch._scaled_mm for the forward, dgrad and wgrad."""
    out = _torch_fp8_mm(a, b, gran)
    da = _torch_fp8_mm(g, b.t().contiguous(), gran)
    db = _torch_fp8_mm(g.t().contiguous(), a.t().contiguous(), gran)
    return out, da, db


def e2e_case(row, m, n, k, gran, args):
    config = _config(gran)
    gemm = _gemm(gran)

    def make():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16).requires_grad_()
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).mul_(k**-0.5).requires_grad_()
        return a, b, torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

    def ours(a, b, g):
        out = gemm(a, b, trans_b=True, config=config)
        return torch.autograd.grad(out, (a, b), g)

    def baseline(a, b, g):
        out = torch.matmul(a, b.t())
        return torch.autograd.grad(out, (a, b), g)

    a, b, g = make()
    out = gemm(a, b, trans_b=True, config=config)
    da, db = torch.autograd.grad(out, (a, b), g)
    a64, b64, g64 = a.detach().double(), b.detach().double(), g.double()
    snrs = [bu.snr_db(out, a64 @ b64.t()), bu.snr_db(da, g64 @ b64), bu.snr_db(db, g64.t() @ a64)]
    del out, da, db, a64, b64, g64
    row["SNR (dB)"] = min(snrs)
    row["Check"] = "PASS" if min(snrs) >= _gate(gran) else "FAIL"
    row["Note"] = "fwd/dgrad/wgrad SNR " + "/".join(f"{s:.1f}" for s in snrs)
    traffic = 2 * (m * k + n * k + m * n)
    n_sets = bu.num_rotating_sets(traffic, 3 * traffic, memory_budget_bytes=8 << 30)
    sets = [(a, b, g)] + [make() for _ in range(n_sets - 1)]
    if row["Check"] == "PASS":
        row["Ours ms"] = bu.time_cuda(ours, rotate=sets, warmup=args.warmup, iters=args.iters)
    row["Baseline"] = "torch.matmul bf16"
    row["Baseline ms"] = bu.time_cuda(baseline, rotate=sets, warmup=args.warmup, iters=args.iters)
    if gran in ("tensorwise", "rowwise"):  # torch's own quantize + _scaled_mm, reported beside
        try:
            step = lambda a, b, g: torch_fp8_step(a.detach(), b.detach(), g, gran)
            row["Torch FP8 ms"] = bu.time_cuda(step, rotate=sets, warmup=args.warmup, iters=args.iters)
        except Exception as e:  # noqa: BLE001 -- a missing baseline must not void our row
            row["Note"] += f" | torch FP8 step: {type(e).__name__}: {str(e)[:120]}"
    return 6.0 * m * n * k


# ---- driver --------------------------------------------------------------------------------


def run_entry(kind, gran, cases, args, gpu_name, out_dir, stem):
    case_fn = gemm_only_case if kind == "gemm_only" else e2e_case
    rows = []
    csv_path = out_dir / f"{stem}.csv"
    for i, c in enumerate(cases, start=1):
        row = {"TestID": i, "GPU": gpu_name, "Case": c.name, "MBS": c.MBS, "M": c.M, "N": c.N, "K": c.K,
               "Granularity": gran}
        rows.append(row)
        t0 = time.perf_counter()
        torch.manual_seed(args.seed + i)
        try:
            flops = case_fn(row, c.M, c.N, c.K, gran, args)
            row["Ours TFLOPS"] = bu.tflops(flops, row.get("Ours ms", float("nan")))
            row["Baseline TFLOPS"] = bu.tflops(flops, row.get("Baseline ms", float("nan")))
            if "Torch FP8 ms" in row:
                row["Torch FP8 TFLOPS"] = bu.tflops(flops, row["Torch FP8 ms"])
            o, b = row["Ours TFLOPS"], row["Baseline TFLOPS"]
            row["Ratio"] = o / b if math.isfinite(o) and math.isfinite(b) and b > 0 else float("nan")
        except Exception as e:  # noqa: BLE001 -- one bad case must not end the run
            traceback.print_exc()
            row["Check"] = "ERROR"
            row["Note"] = f"{type(e).__name__}: {e}"[:300]
        torch.cuda.empty_cache()
        print(f"[{stem}] {i}/{len(cases)} {c.name} M={c.M} N={c.N} K={c.K} {row.get('Check')} "
              f"ours {row.get('Ours TFLOPS', float('nan')):.0f} vs {row.get('Baseline', '')} "
              f"{row.get('Baseline TFLOPS', float('nan')):.0f} TFLOPS ({time.perf_counter() - t0:.1f}s) "
              f"{row.get('Note', '')}", flush=True)
        bu.write_csv(csv_path, rows, COLUMNS)
    nan = float("nan")
    passed = [r.get("Check") == "PASS" for r in rows]
    metric = "FP8 GEMM TFLOPS (2MNK / time)" if kind == "gemm_only" else "combined fwd+bwd TFLOPS (6MNK / time)"
    baseline = rows[0].get("Baseline", "") if rows else ""
    entry = bu.summary_entry(
        ours=[r.get("Ours TFLOPS", nan) for r in rows],
        baseline_values=[r.get("Baseline TFLOPS", nan) for r in rows],
        passed=passed, metric=metric, baseline=baseline, gpu=gpu_name, granularity=gran,
        format="E2M1" if gran == "fp4" else "E4M3",
        backend=args.backend or "default", models=cfg.resolve_dense_models(args.models), mbs=list(args.mbs),
        torch=torch.__version__, csv=csv_path.name,
    )
    torch_fp8 = [r["Torch FP8 TFLOPS"] for r, p in zip(rows, passed) if p and "Torch FP8 TFLOPS" in r]
    if torch_fp8:
        entry["torch_fp8_step_geomean"] = bu.geomean(torch_fp8)
    bu.plot_comparison(out_dir / f"{stem}.png", [f"{r['Case']} x{r['MBS']}" for r in rows],
                       [r.get("Ours TFLOPS", nan) for r in rows], [r.get("Baseline TFLOPS", nan) for r in rows],
                       metric=metric, title=f"{stem} on {gpu_name}",
                       ours_label="Primus-Turbo gemm_fp4" if gran == "fp4" else "Primus-Turbo gemm_fp8",
                       baseline_label=baseline, failed=[not p for p in passed])
    if not args.no_summary:
        bu.update_summary(args.output_dir, bu.gpu_short_name(gpu_name), stem, entry)
    print(f"[{stem}] {entry['passed']}/{entry['cases']} passed; geomean ours {entry['ours_geomean']:.1f} vs "
          f"{baseline} {entry['baseline_geomean']:.1f}: ratio {entry['ratio_geomean']:.3f} (min {entry['ratio_min']:.3f})")
    return all(passed)


def profile_e2e(m, n, k, gran) -> None:
    """Where one bf16-in/bf16-out training step's GPU time goes (quantization vs GEMMs vs glue)."""
    config = _config(gran)
    gemm = _gemm(gran)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    step = lambda: torch.autograd.grad(gemm(a, b, trans_b=True, config=config), (a, b), g)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(f"[profile] {gran} e2e step M={m} N={n} K={k} (5 steps)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.backend:
        from primus_turbo.pytorch.core.backend import BackendType, GlobalBackendManager, PrecisionType

        GlobalBackendManager.set_gemm_backend(BackendType[args.backend], precision=PrecisionType.FP8)
    if not torch.cuda.is_available():
        print("bench_gemm_fp8: no CUDA device", file=sys.stderr)
        return 2
    gpu_name = torch.cuda.get_device_name()
    out_dir = bu.results_dir_for(args.output_dir, bu.gpu_short_name(gpu_name))
    cases = cfg.gen_gemm_test_cases(args.models, args.mbs)
    suffix = "_quick" if args.quick else ("" if args.default_set else "_subset")
    print(f"[bench_gemm_fp8] {gpu_name}; torch {torch.__version__}; {len(cases)} cases; commit {bu.git_commit()}")
    if args.profile:
        for gran in args.granularity:
            profile_e2e(8192, 4096, 4096, gran)
        return 0
    if args.backend:
        suffix += f"_{args.backend.lower()}"
    ok = True
    for gran in args.granularity:
        for kind in args.kind:
            if gran == "fp4" and kind != "e2e":
                continue  # FP4: the training step only (gemm_fp4_e2e)
            stem = f"gemm_fp4_{kind}{suffix}" if gran == "fp4" else f"gemm_fp8_{gran}_{kind}{suffix}"
            ok &= run_entry(kind, gran, cases, args, gpu_name, out_dir, stem)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
