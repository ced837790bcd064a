"""Forward FP8 GEMM time with and without Float8QuantConfig(fast_accum=True), per shape, in one
process: the dense end-to-end model's forward projections by default (M tokens x N outputs x K
inputs, Llama-3.1-8B at 8192 tokens). Quantization included, as a Float8Linear forward runs it.

    python tools/fast_accum_probe.py [--granularity tensorwise rowwise] [--shapes 8192x6144x4096 ...]
"""

import argparse

import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity

DEFAULT_SHAPES = ["8192x6144x4096", "8192x4096x4096", "8192x28672x4096", "8192x4096x14336"]


def time_ms(fn, iters: int = 50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--granularity", nargs="+", default=["tensorwise", "rowwise"], choices=["tensorwise", "rowwise"])
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="MxNxK")
    args = p.parse_args()
    print(f"{'granularity':12s} {'M x N x K':>20s} {'full ms':>9s} {'fast ms':>9s} {'speedup':>8s} {'SNR dB':>7s}")
    for g in args.granularity:
        gran = getattr(ScalingGranularity, g.upper())
        for shape in args.shapes:
            m, n, k = map(int, shape.split("x"))
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
            outs, times = [], []
            for fast in (False, True):
                cfg = Float8QuantConfig(format=Format.HYBRID, granularity=gran, fast_accum=fast)
                with torch.no_grad():
                    outs.append(turbo.ops.gemm_fp8(a, w, trans_b=True, config=cfg).float())
                    times.append(time_ms(lambda: turbo.ops.gemm_fp8(a, w, trans_b=True, config=cfg)))
            err = (outs[1] - outs[0]).double().pow(2).mean()
            snr = 10 * torch.log10(outs[0].double().pow(2).mean() / err).item() if err > 0 else float("inf")
            print(f"{g:12s} {shape:>20s} {times[0]:9.3f} {times[1]:9.3f} {times[0] / times[1]:7.3f}x {snr:7.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
