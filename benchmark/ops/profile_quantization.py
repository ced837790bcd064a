"""Runs each FP8 quantizer the training GEMMs use a few times on one tall activation, so a kernel
profiler (Nsight Compute) can be pointed at exactly those kernels:

    ncu --kernel-name regex:'quantize|amax' --launch-skip 6 --launch-count 6 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \\
        --section WarpStateStats python benchmark/ops/profile_quantization.py

Without a profiler it prints each variant's device time per call (CUDA events) and its fraction
of the copy bandwidth measured in the same process, like bench_quantization.py but for one shape.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmark.ops.bench_utils import measure_copy_bandwidth  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=int, default=65536)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--calls", type=int, default=3, help="calls per variant (the first warms up)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_quantization: needs a CUDA device", file=sys.stderr)
        return 1

    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.core.low_precision import ScalingGranularity as G
    from primus_turbo.pytorch.ops import quantization as QZ

    x = torch.randn(args.m, args.k, device="cuda", dtype=torch.bfloat16)
    e4m3 = torch.float8_e4m3fn
    variants = {
        "rowwise (row only)": lambda: turbo.ops.quantize_fp8(x, e4m3, G.ROWWISE, axis=-1),
        "blockwise 1x128 (row only)": lambda: turbo.ops.quantize_fp8(x, e4m3, G.BLOCKWISE, block_size=128, axis=-1),
        "blockwise with_trans": lambda: turbo.ops.quantize_fp8_with_trans(x, e4m3, G.BLOCKWISE, block_size=128),
        # What the native blockwise GEMM path runs: both copies, the column one transposed.
        "blockwise row+col^T": lambda: QZ._quantize_op(x, e4m3, 2, 128, True, True, True, QZ._FLAG_MN_MAJOR, 0),
        "rowwise with_trans": lambda: turbo.ops.quantize_fp8_with_trans(x, e4m3, G.ROWWISE),
        "tensorwise with_trans": lambda: turbo.ops.quantize_fp8_with_trans(x, e4m3, G.TENSORWISE),
    }
    copy_gbps = measure_copy_bandwidth()
    for name, fn in variants.items():
        for _ in range(args.calls):
            out = fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.calls):
            out = fn()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / args.calls
        nbytes = x.numel() * x.element_size() + sum(t.numel() * t.element_size() for t in out)
        gbps = nbytes / ms / 1e6
        print(f"{name:28s} {ms * 1e3:8.1f} us  {gbps:6.0f} GB/s  ({gbps / copy_gbps:.2f} of copy {copy_gbps:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
