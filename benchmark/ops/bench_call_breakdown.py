"""Where a short GEMM call's host time goes: each layer of turbo.ops.gemm timed alone on a tiny
problem (the GPU is never the bottleneck), next to torch.matmul. A diagnostic for the call path.

    python benchmark/ops/bench_call_breakdown.py [--backend CUBLASLT|CUTLASS]
"""

import argparse
import ctypes
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_utils as bu  # noqa: E402


def per_call_us(fn, iters: int) -> float:
    return bu.host_us_per_call(fn, iters, warmup=50)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", default="CUBLASLT")
    p.add_argument("--iters", type=int, default=5000)
    args = p.parse_args()

    import primus_turbo.pytorch as turbo
    from primus_turbo._core.lib import lib
    from primus_turbo.pytorch.core.backend import BackendType, GlobalBackendManager
    from primus_turbo.pytorch.core.tensor_bridge import current_stream_handle, workspace

    gemm_mod = sys.modules["primus_turbo.pytorch.ops.gemm"]
    GlobalBackendManager.set_gemm_backend(BackendType.from_name(args.backend))
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    dev = a.device
    with torch.no_grad():
        turbo.ops.gemm(a, b, trans_b=True)
    key = gemm_mod._plan_key(a, b.t(), out, False, False, 0.0)
    gemm_mod._run_gemm(a, b.t(), out, False, False, 0.0)
    plan = gemm_mod._plans[key]
    ws = workspace(dev)
    stream = current_stream_handle(dev)
    pylib = ctypes.PyDLL(lib._name)  # same library, calls keep the GIL
    for name in ("pt_gemm_plan_run", "pt_gemm_plan_needs_workspace"):
        getattr(pylib, name).restype = getattr(lib, name).restype
        getattr(pylib, name).argtypes = getattr(lib, name).argtypes
    h, pa, pb, po, pw, nw = plan.handle, a.data_ptr(), b.data_ptr(), out.data_ptr(), ws.data_ptr(), ws.numel()

    from primus_turbo.pytorch.core.tensor_bridge import device_guard
    from primus_turbo.pytorch.ops._checks import matrix_operand

    def guarded(fn):
        with device_guard(dev):
            fn()

    bt = b.t()
    print(f"plan hit: {key in gemm_mod._plans}; plans: {len(gemm_mod._plans)}")
    rows = [
        ("ctypes trivial call (GIL released)", lambda: lib.pt_gemm_plan_needs_workspace(h)),
        ("ctypes trivial call (GIL kept)", lambda: pylib.pt_gemm_plan_needs_workspace(h)),
        ("plan run only (GIL released)", lambda: lib.pt_gemm_plan_run(h, pa, pb, po, pw, nw, stream)),
        ("plan run only (GIL kept)", lambda: pylib.pt_gemm_plan_run(h, pa, pb, po, pw, nw, stream)),
        ("torch.empty 256x256", lambda: torch.empty((256, 256), dtype=torch.bfloat16, device=dev)),
        ("torch.empty workspace", lambda: workspace(dev)),
        ("current stream handle", lambda: current_stream_handle(dev)),
        ("plan key", lambda: gemm_mod._plan_key(a, b.t(), out, False, False, 0.0)),
        ("plan lookup", lambda: gemm_mod._plans.get(key)),
        ("device guard", lambda: guarded(lambda: None)),
        ("matrix_operand x2", lambda: (matrix_operand(a, False), matrix_operand(bt, False))),
        ("plan.run", lambda: plan.run(a, bt, out, dev)),
        ("_run_gemm (plan hit)", lambda: gemm_mod._run_gemm(a, b.t(), out, False, False, 0.0)),
        ("turbo.ops.gemm no grad", lambda: turbo.ops.gemm(a, b, trans_b=True)),
        ("torch.matmul", lambda: torch.matmul(a, b.t())),
    ]
    with torch.no_grad():
        for name, fn in rows:
            print(f"{name:40s} {per_call_us(fn, args.iters):8.2f} us", flush=True)


if __name__ == "__main__":
    main()
