"""Warms the JIT cache with the normalization, gated-activation, MoE routing, MoE permutation and transpose modules that the GPU
tests and the quick benchmarks use, compiling in parallel (one nvcc per worker). Needs no GPU.

    python3 -P tools/precompile_elementwise.py [-j JOBS]
"""

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from primus_turbo._core.lib import check, lib

F32, F16, BF16 = 0, 1, 2
DTYPES = (BF16, F16, F32)
RMS, RES, LN = 0, 1, 2

# (kind, dtype, param dtype, hidden): prepare() picks the module a contiguous, aligned tensor of
# that hidden size uses; an odd hidden stands for the scalar module that unaligned pointers use.
MODEL_HIDDEN = (2048, 2880, 3584, 4096, 5120, 6144, 7168, 8192, 16384)
JOBS = set()
for dt in DTYPES:
    for h in (1, 127, 128, 1000, 4096, 4097, 7168, 16384):
        JOBS.add((RMS, dt, dt, h))
    for h in (1, 127, 1024, 4096, 4097, 16384):
        JOBS.add((RES, dt, dt, h))
    for h in (1, 127, 128, 1024, 4096, 4097, 7168, 16384, 20000):
        JOBS.add((LN, dt, dt, h))
for dt in (BF16, F16):
    for h in (127, 1024, 4096, 5000):
        JOBS.update({(RMS, dt, F32, h), (LN, dt, F32, h)})
JOBS.update({(RMS, BF16, BF16, 65536), (LN, BF16, BF16, 65536), (RES, BF16, F32, 4096), (RES, BF16, BF16, 2048)})
for kind in (RMS, RES, LN):
    for h in MODEL_HIDDEN:
        JOBS.add((kind, BF16, BF16, h))
GATED = [(act, dt, cols) for act in (0, 1) for dt in DTYPES for cols in (128, 127)]
# MoE routing: one module per logits dtype, and (-1) the helpers' module.
ROUTING = [("moe_routing", dt) for dt in (-1,) + DTYPES]
# MoE permutation (token_permute and moe_permute share them): (dtype, vectorized).
MOE_PERMUTE = [("moe_permute", dt, vec) for dt in DTYPES for vec in (1, 0)]

# FP8-output fusions: ("fp8norm", residual, dtype, param dtype, hidden, granularity, fp8 dtype) and
# ("fp8gated", act, dtype, cols, granularity, fp8 dtype); granularity 1 rowwise, 2 1x128 blocks.
E4M3, E5M2 = 3, 4
FP8 = set()
for dt in DTYPES:
    for g in (1, 2):
        for h in (128, 1000, 1024, 4096, 5120, 7168, 8192, 16384):
            FP8.add(("fp8norm", 0, dt, dt, h, g, E4M3))
        for act in (0, 1):
            FP8.add(("fp8gated", act, dt, 128, g, E4M3))
        for h in MODEL_HIDDEN:
            FP8.add(("fp8norm", 0, BF16, BF16, h, g, E4M3))
for g in (1, 2):
    for h in (128, 1000, 4096):
        FP8.add(("fp8norm", 1, BF16, BF16, h, g, E4M3))
    for h in (1000, 4096, 16384):
        FP8.add(("fp8norm", 0, BF16, F32, h, g, E5M2))
    for dt in DTYPES:
        for act in (0, 1):
            FP8.add(("fp8gated", act, dt, 128, g, E5M2))


# Batched transpose (grouped FP8 / FP4 weights): one module per element size.
TRANSPOSE = [("transpose", size) for size in (1, 2, 4)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()

    def build(job):
        try:
            if job[0] == "moe_routing":
                check(lib.pt_moe_routing_prepare(job[1]))
            elif job[0] == "fp8norm":
                check(lib.pt_rmsnorm_fp8_prepare(*job[1:]))
            elif job[0] == "fp8gated":
                check(lib.pt_gated_act_fp8_prepare(*job[1:]))
            elif len(job) == 4:
                check(lib.pt_norm_prepare(*job))
            elif job[0] == "transpose":
                check(lib.pt_transpose_prepare(job[1]))
            elif job[0] == "moe_permute":
                check(lib.pt_moe_permute_prepare(*job[1:]))
            else:
                check(lib.pt_gated_act_prepare(*job))
            return None
        except Exception as e:  # noqa: BLE001 -- report every failure
            return f"{job}: {e}"

    t0 = time.time()
    jobs = sorted(JOBS) + GATED + ROUTING + MOE_PERMUTE + sorted(FP8) + TRANSPOSE
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        errors = [e for e in pool.map(build, jobs) if e]
    print(f"precompile_elementwise: {len(jobs)} requests in {time.time() - t0:.0f}s, {len(errors)} errors")
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
