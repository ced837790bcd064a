"""Where the host time of a short op goes: gemm / gemm_fp8 / quantize / swiglu timed layer by
layer on tiny inputs (256 x 256), each as host µs per call over 2000 calls, over 100 calls (the
launch queue never fills) and as device-event µs per call: when the three agree the op is
host-bound. Needs a GPU.

    python3 -P tools/host_cost_probe.py
"""
import importlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.ops import quantization as QZ

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmark.ops.bench_utils import host_us_per_call  # noqa: E402

G = importlib.import_module("primus_turbo.pytorch.ops.gemm")  # the package re-exports the functions
G8 = importlib.import_module("primus_turbo.pytorch.ops.gemm_fp8")


def t(fn, n=2000):
    return host_us_per_call(fn, iters=n, warmup=50)


def t3(fn):
    """Host µs per call over 2000 calls, over 100 calls (launch queue never full), device µs per call."""
    long = t(fn, 2000)
    short = t(fn, 100)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(200):
        fn()
    end.record()
    end.synchronize()
    return f"{long:7.1f} {short:7.1f} gpu {start.elapsed_time(end) * 1e3 / 200:7.1f}"


def main() -> None:
    dev, bf, e4 = "cuda", torch.bfloat16, torch.float8_e4m3fn
    an = torch.randn(256, 256, device=dev, dtype=bf)
    bn = torch.randn(256, 256, device=dev, dtype=bf)
    qa, sa = QZ._quantize_op(an, e4, 1, 0, True, False, False, 0, 0)[:2]  # rowwise along K
    qb, sb = QZ._quantize_op(bn, e4, 1, 0, True, False, False, 0, 0)[:2]
    qt, st = QZ._quantize_op(an, e4, 0, 0, True, False, False, 0, 0)[:2]  # tensorwise
    one = torch.ones((), device=dev)
    xg = torch.randn(256, 2048, device=dev, dtype=bf)
    for name, fn in (
        ("torch.matmul", lambda: torch.matmul(an, bn.t())),
        ("gemm native", lambda: G._gemm_call(an, bn, False, True, bf)),
        ("gemm_fp8 native fwd row", lambda: G8._native_fwd(an, bn, False, True, bf, e4, 1, False)),
        ("gemm_fp8 native fwd tensor", lambda: G8._native_fwd(an, bn, False, True, bf, e4, 0, False)),
        ("_quantize_op row", lambda: QZ._quantize_op(an, e4, 1, 0, True, False, False, 0, 0)),
        ("_quantize_op tensor", lambda: QZ._quantize_op(an, e4, 0, 0, True, False, False, 0, 0)),
        ("_fp8_mm_op row", lambda: G8._fp8_mm_op(qa, sa.reshape(-1), 1, qb, sb.reshape(-1), 1, bf)),
        ("_fp8_mm_op tensor", lambda: G8._fp8_mm_op(qt, st.reshape(()), 0, qt, st.reshape(()), 0, bf)),
        ("torch._scaled_mm tensor", lambda: torch._scaled_mm(qt, qt.t(), one, one, out_dtype=bf)),
        ("turbo.swiglu", lambda: turbo.ops.swiglu(xg)),
        ("torch silu*mul", lambda: F.silu(xg[:, :1024]) * xg[:, 1024:]),
    ):
        print(f"{name:32s} {t3(fn)} us", flush=True)


def c_api_layers() -> None:
    """The same pieces one layer down: C API calls through ctypes with descriptors built once (a
    ctypes call costs ~1 µs), so what remains is the library's own host time per call."""
    import ctypes

    from primus_turbo._core.lib import lib
    from primus_turbo.pytorch.core.tensor_bridge import current_stream_handle, to_pt

    dev, bf, e4 = "cuda", torch.bfloat16, torch.float8_e4m3fn
    x = torch.randn(256, 256, device=dev, dtype=bf)
    q = torch.empty(256, 256, device=dev, dtype=e4)
    qc = torch.empty(256, 256, device=dev, dtype=e4)
    s = torch.empty(256, 1, device=dev)
    sc = torch.empty(256, 1, device=dev)
    out = torch.empty(256, 256, device=dev, dtype=bf)
    ws = torch.empty(lib.pt_gemm_workspace_bytes(), dtype=torch.uint8, device=dev)
    qws = torch.empty(lib.pt_quantize_workspace_bytes(256, 256, 1), dtype=torch.uint8, device=dev)
    st = current_stream_handle(x.device)
    px, pq, pqc, ps, psc, pout = (to_pt(t) for t in (x, q, qc, s, sc, out))
    ps1 = to_pt(s.reshape(256))
    nul = ctypes.c_void_p()
    calls = {
        "C pt_quantize row only": lambda: lib.pt_quantize(px, pq, ps, None, None, 1, 0, 1, 0, 0, None, 0, st),
        "C pt_quantize row+col": lambda: lib.pt_quantize(px, pq, ps, pqc, psc, 1, 0, 1, 0, 0, qws.data_ptr(),
                                                         qws.numel(), st),
        "C pt_gemm_fp8 row cublaslt": lambda: lib.pt_gemm_fp8(pq, ps1, 1, pqc, ps1, 1, pout, 0.0, 1, 0,
                                                              ws.data_ptr(), ws.numel(), st),
        "C pt_gemm bf16 cublaslt": lambda: lib.pt_gemm(px, px, pout, 0, 1, 1.0, 0.0, 1, 0, ws.data_ptr(),
                                                       ws.numel(), st),
        "torch.empty fp8 256x256": lambda: torch.empty(256, 256, device=dev, dtype=e4),
        "torch _scaled_mm rowwise": lambda: torch._scaled_mm(q, qc.t(), s, s.reshape(1, 256), out_dtype=bf),
    }
    del nul
    for name, fn in calls.items():
        print(f"{name:32s} {t3(fn)} us", flush=True)
    for fb in (False, True):
        fn = lambda: G8._native_fwd(x, x, False, True, bf, e4, 1, fb)  # noqa: E731
        print(f"{'native fwd row for_backward=' + str(fb):32s} {t3(fn)} us", flush=True)
    fwd = G8._native_fwd(x, x, False, True, bf, e4, 1, True)
    fn = lambda: G8._native_bwd(x, *fwd[1:], False, True, e4, 1, bf, bf, True, True, None)  # noqa: E731
    print(f"{'native bwd row':32s} {t3(fn)} us", flush=True)


if __name__ == "__main__":
    main()
    c_api_layers()
