"""Host (CPU) time per call of turbo.ops.gemm against torch.matmul, on a shape so small that the
GPU is never the bottleneck: what a short GEMM pays for the Python and C++ layers in front of the
kernel. `--profile` prints the top functions under cProfile.

    python benchmark/ops/bench_host_overhead.py [--backend CUBLASLT|CUTLASS] [--autotune] [--profile]
"""

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_utils as bu  # noqa: E402


def per_call_us(fn, iters: int) -> float:
    return bu.host_us_per_call(fn, iters, warmup=20)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", default=None)
    p.add_argument("--autotune", action="store_true")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--iters", type=int, default=2000)
    args = p.parse_args()

    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.core.backend import BackendType, GlobalBackendManager

    if args.backend:
        GlobalBackendManager.set_gemm_backend(BackendType.from_name(args.backend))
    if args.autotune:
        GlobalBackendManager.set_auto_tune(True)
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)

    def ours_fwd():
        turbo.ops.gemm(a, b, trans_b=True)

    def torch_fwd():
        torch.matmul(a, b.t())

    def ours_step():
        torch.autograd.grad(turbo.ops.gemm(a, b, trans_b=True), (a, b), g)

    def torch_step():
        torch.autograd.grad(torch.matmul(a, b.t()), (a, b), g)

    with torch.no_grad():
        print(f"forward (no grad)   ours {per_call_us(ours_fwd, args.iters):7.1f} us   torch {per_call_us(torch_fwd, args.iters):7.1f} us")
    print(f"forward (autograd)  ours {per_call_us(ours_fwd, args.iters):7.1f} us   torch {per_call_us(torch_fwd, args.iters):7.1f} us")
    print(f"forward + backward  ours {per_call_us(ours_step, args.iters // 4):7.1f} us   torch {per_call_us(torch_step, args.iters // 4):7.1f} us")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            ours_step()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
