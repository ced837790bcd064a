"""Kernel-time breakdown of the MoE grouped GEMMs: where a forward (and a training step) of
turbo.ops.grouped_gemm / grouped_gemm_fp8 / grouped_gemm_fp4 spends its device time, next to
torch._grouped_mm, from torch.profiler (CUDA activity only; 5 calls after 3 warm-ups).

    python benchmark/ops/profile_grouped_gemm.py                       # DeepSeek-V3 gate_up, EP 32
    python benchmark/ops/profile_grouped_gemm.py --groups 8 --tokens 2048 --n 4096 --k 7168 --step

Prints, per variant, the wall time per call (CUDA events), the summed kernel time per call and
the kernels sorted by time, so that a slow variant shows whether its GEMM kernel or the work
around it (quantization, scale layout, packing) is to blame.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--tokens", type=int, default=2048, help="tokens per expert (balanced)")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=7168)
    p.add_argument("--step", action="store_true", help="also a forward + backward step")
    p.add_argument("--top", type=int, default=8, help="kernels listed per variant")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_grouped_gemm: needs a CUDA device", file=sys.stderr)
        return 1

    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity

    g, t, n, k = args.groups, args.tokens, args.n, args.k
    torch.manual_seed(0)
    x = torch.randn(g * t, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5).requires_grad_()
    lens = torch.full((g,), t, dtype=torch.int64, device="cuda")
    offs = torch.arange(0, g * t + 1, t, dtype=torch.int32, device="cuda")[1:]
    dy = torch.randn(g * t, n, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * g * t * n * k

    variants = {
        "torch._grouped_mm bf16": lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs),
        "grouped_gemm bf16": lambda: turbo.ops.grouped_gemm(x, w, lens, trans_b=True),
    }
    for gran in (ScalingGranularity.TENSORWISE, ScalingGranularity.ROWWISE, ScalingGranularity.BLOCKWISE):
        cfg = Float8QuantConfig(granularity=gran, block_size=128 if gran == ScalingGranularity.BLOCKWISE else None)
        variants[f"grouped_gemm_fp8 {gran.name.lower()}"] = lambda cfg=cfg: turbo.ops.grouped_gemm_fp8(
            x, w, lens, config=cfg
        )
    variants["grouped_gemm_fp4"] = lambda: turbo.ops.grouped_gemm_fp4(x, w, lens)

    for name, fn in variants.items():
        runs = [("forward", fn, 1.0)]
        if args.step:
            runs.append(("step", lambda fn=fn: torch.autograd.backward(fn(), dy), 3.0))
        for what, call, mult in runs:
            try:
                for _ in range(3):
                    call()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(5):
                    call()
                end.record()
                end.synchronize()
                wall = start.elapsed_time(end) / 5
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        call()
                    torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 -- report and go on with the next variant
                print(f"\n== {name} {what}: {type(e).__name__}: {e}")
                continue
            events = [e for e in prof.key_averages() if e.device_time_total > 0]
            events.sort(key=lambda e: e.device_time_total, reverse=True)
            kernel_ms = sum(e.device_time_total for e in events) / 5 / 1000
            print(f"\n== {name} {what}: G={g} T/E={t} N={n} K={k}: {wall:.3f} ms per call "
                  f"({mult * flops / wall / 1e9:.0f} TFLOPS), kernels {kernel_ms:.3f} ms per call")
            for e in events[: args.top]:
                print(f"   {e.device_time_total / 5 / 1000:8.3f} ms  x{e.count // 5:<3} {e.key[:110]}")
            x.grad = w.grad = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
