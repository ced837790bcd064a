"""Optimizer step benchmark: turbo.optim.FusedAdamW against torch.optim.AdamW (its default foreach
implementation and ``fused=True``) on the parameters of the end-to-end benchmark's decoder stacks
(benchmark/e2e/model.py: Llama-3.1-8B dims and Qwen3-30B-A3B dims, 4 layers, bf16 parameters and
moments, as the training-step benchmark keeps them).

    python benchmark/ops/bench_optimizer.py
    python benchmark/ops/bench_optimizer.py --models Llama-3.1-8B --layers 2

Per model:
  1. correctness first: one step of ours from random parameters, gradients and moments against a
     float64 evaluation of AdamW's update from the same stored values; every value must be within
     one rounding of its dtype (a FAIL voids our timing);
  2. timing: the median of CUDA-event-timed steps (host included: one step is one native call per
     group), each implementation on its own copy of the state, one at a time.

The metric is effective bandwidth: the parameter, both moments read and written, the gradient read
(7 x 2 bytes a bf16 parameter), over the median step time, and that as a fraction of the measured
copy bandwidth (the FP8 copy's extra byte a parameter not counted). ``turbo+amax`` also reduces
max |param| per tensor (what a TENSORWISE FP8 layer's weight quantization takes); ``turbo+fp8_blocks``
also writes every parameter's E4M3 copy in 128 x 128 blocks (what a BLOCKWISE FP8 layer reads), and
the transposed copy the dgrad reads (2-D weights; each expert's for the expert stacks). Writes <output-dir>/<gpu>/optimizer[_<tag>].csv and the summary.json
entries optim_adamw (against torch's fused=True) and optim_adamw_vs_foreach.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "e2e"))
import bench_utils as bu  # noqa: E402
import config as cfg  # noqa: E402
from model import Stack  # noqa: E402

HYPER = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
COLUMNS = ["gpu", "date", "commit", "model", "layers", "tensors", "params_m", "impl", "check", "ms", "gb_s",
           "bw_fraction", "speedup_vs_torch_fused", "speedup_vs_torch_foreach"]


def _params(model_name: str, layers: int):
    m = {**cfg.DENSE_MODELS, **cfg.MOE_MODELS}[model_name]
    arch = "dense" if model_name in cfg.DENSE_MODELS else "moe"
    with torch.device("cuda"):
        stack = Stack(m, layers, arch).to(dtype=torch.bfloat16)
    params = [p for p in stack.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    return params


def _check(params) -> tuple[bool, str]:
    """One step of ours from random moments against the float64 update (first 8 tensors)."""
    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.optim.fused_adamw import adamw_reference

    sub = [torch.nn.Parameter(p.detach()[: 256].clone()) for p in params[:8]]
    opt = turbo.optim.FusedAdamW(sub, **HYPER)
    worst = 0.0
    for p in sub:
        p.grad = torch.randn_like(p)
        opt.state[p].update(step=torch.tensor(4.0), exp_avg=torch.randn_like(p) * 0.1,
                            exp_avg_sq=torch.rand_like(p) * 0.01)
    before = [(p.detach().double(), p.grad.double(), opt.state[p]["exp_avg"].double(),
               opt.state[p]["exp_avg_sq"].double()) for p in sub]
    opt.step()
    b1, b2 = HYPER["betas"]
    for p, (p64, g64, m64, v64) in zip(sub, before):
        adamw_reference(p64, g64, m64, v64, 5, HYPER["lr"], b1, b2, HYPER["eps"], HYPER["weight_decay"])
        for got, want in ((p.detach(), p64), (opt.state[p]["exp_avg"], m64), (opt.state[p]["exp_avg_sq"], v64)):
            # Relative to the value, with a floor 2^-14 of the tensor's largest: a moment that
            # cancels to near zero carries float32's rounding of its terms, not of itself.
            rel = ((got.double() - want).abs() / (want.abs() + 2.0**-14 * want.abs().max())).max().item()
            worst = max(worst, rel)
    ok = worst <= 2.0**-7  # one bf16 rounding
    return ok, f"max relative error {worst:.2e} (bf16 rounding 7.8e-03)"


def _time(impl: str, params, iters: int) -> float:
    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.optim.fused_adamw import _block_scale_shape, _transposed_target

    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for c, p in zip(copies, params):
        c.grad = p.grad
    if impl == "torch_foreach":
        opt = torch.optim.AdamW(copies, foreach=True, **HYPER)
    elif impl == "torch_fused":
        opt = torch.optim.AdamW(copies, fused=True, **HYPER)
    else:
        opt = turbo.optim.FusedAdamW(copies, **HYPER)
    step = opt.step
    if impl == "turbo+amax":  # the same step reporting max |param| per tensor
        opt.step()  # creates the state
        st = [opt.state[p] for p in copies]
        ms_, vs_ = [s["exp_avg"] for s in st], [s["exp_avg_sq"] for s in st]
        amax = torch.empty(len(copies), device="cuda")
        gs = [p.grad for p in copies]

        def step(ps=copies):
            torch.ops.primus_turbo.fused_adamw_(ps, gs, ms_, vs_, amax, HYPER["lr"], *HYPER["betas"],
                                                HYPER["eps"], HYPER["weight_decay"], 2)
    elif impl == "turbo+fp8_blocks":  # every param also written as an E4M3 copy in 128 x 128 blocks
        opt.step()
        st = [opt.state[p] for p in copies]
        ms_, vs_ = [s["exp_avg"] for s in st], [s["exp_avg_sq"] for s in st]
        gs = [p.grad for p in copies]
        qs = [torch.empty_like(p, dtype=torch.float8_e4m3fn) for p in copies]
        scales = [p.new_empty(_block_scale_shape(p), dtype=torch.float32) for p in copies]

        # And the transposed copy the optimizer writes for the dgrad (2-D weights, expert stacks).
        qts = [_transposed_target(p, torch.float8_e4m3fn) for p in copies]

        def step(ps=copies):
            torch.ops.primus_turbo.fused_adamw_fp8_blocks_(ps, gs, ms_, vs_, qs, scales, qts, HYPER["lr"],
                                                           *HYPER["betas"], HYPER["eps"], HYPER["weight_decay"], 2)
    return bu.time_cuda(step, warmup=3, iters=iters)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["Llama-3.1-8B", "Qwen3-30B-A3B"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--iters", type=int, default=bu.MIN_TIMED_ITERS)
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--tag", default=None)
    p.add_argument("--no-summary", action="store_true")
    args = p.parse_args()
    torch.manual_seed(1234)
    gpu = bu.gpu_short_name()
    copy_gbs = bu.measure_copy_bandwidth()
    print(f"[optimizer] copy bandwidth {copy_gbs:.0f} GB/s")
    rows = []
    for name in args.models:
        params = _params(name, args.layers)
        n = sum(p.numel() for p in params)
        nbytes = 7 * 2 * n  # bf16: param, exp_avg, exp_avg_sq read and written, grad read
        ok, note = _check(params)
        print(f"[optimizer] {name} x{args.layers}: {len(params)} tensors, {n / 1e6:.0f} M params; check "
              f"{'PASS' if ok else 'FAIL'} ({note})")
        times = {}
        for impl in ("torch_foreach", "torch_fused", "turbo", "turbo+amax", "turbo+fp8_blocks"):
            times[impl] = _time(impl, params, args.iters)
            torch.cuda.empty_cache()  # the copies of one implementation go before the next
        for impl, ms in times.items():
            ours = impl.startswith("turbo")
            row = {**bu.run_stamp(gpu), "model": name, "layers": args.layers, "tensors": len(params),
                   "params_m": n / 1e6, "impl": impl, "check": ("PASS" if ok else "FAIL") if ours else "",
                   "ms": ms, "gb_s": nbytes / (ms * 1e-3) / 1e9}
            row["bw_fraction"] = row["gb_s"] / copy_gbs
            row["speedup_vs_torch_fused"] = times["torch_fused"] / ms
            row["speedup_vs_torch_foreach"] = times["torch_foreach"] / ms
            rows.append(row)
            print(f"  {impl:14s} {ms:8.3f} ms  {row['gb_s']:7.0f} GB/s ({row['bw_fraction']:.2f} of copy)  "
                  f"x{row['speedup_vs_torch_fused']:.2f} vs torch fused, x{row['speedup_vs_torch_foreach']:.2f} "
                  "vs foreach")
        del params
        torch.cuda.empty_cache()
    out = bu.results_dir_for(args.output_dir, gpu) / f"optimizer{'_' + args.tag if args.tag else ''}.csv"
    bu.write_csv(out, rows, COLUMNS)
    print(f"[optimizer] wrote {out}")
    if not args.no_summary:
        ours = [r for r in rows if r["impl"] == "turbo"]
        passed = [r["check"] == "PASS" for r in ours]
        suffix = f"_{args.tag}" if args.tag else ""
        for base, entry in (("torch_fused", "optim_adamw"), ("torch_foreach", "optim_adamw_vs_foreach")):
            gbs = {(r["model"]): r["gb_s"] for r in rows if r["impl"] == base}
            bu.update_summary(args.output_dir, gpu, entry + suffix, bu.summary_entry(
                [r["gb_s"] for r in ours], [gbs[r["model"]] for r in ours], passed, "effective GB/s",
                f"torch.optim.AdamW({'fused' if base == 'torch_fused' else 'foreach'}=True)", gpu))
    return 0 if all(r["check"] != "FAIL" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
