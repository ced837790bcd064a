"""Where an op's host time goes: µs per call at each layer of the path from Python to the kernels
(public op, autograd.Function, the native op alone, inference form), next to torch primitives of
known cost (an empty tensor, a small launch, torch.matmul), then the CPU-side profile of the
native op alone (events per call and self µs per call: allocations, launches, stream queries).

    python3 -P tools/host_cost_probe.py [--ops gemm_fp8_rowwise,gemm_fp4] [--iters 3000] [--no-profile]
    py-spy record --native -f raw -o stacks.txt -- python3 -P tools/host_cost_probe.py \
        --spin "gemm_fp8_rowwise/native infer" --seconds 5     # one layer in a loop, for a sampler

Tiny inputs (as benchmark/ops/bench_host_overhead.py), so the host is what is timed.
"""

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark" / "ops"))
import bench_utils as bu  # noqa: E402


def _layers(turbo):
    """name -> {layer: callable}; every callable runs one forward (or a forward+backward: 'step')."""
    from primus_turbo.pytorch.core.low_precision import Float4QuantConfig, Float8QuantConfig, ScalingGranularity

    # The modules (turbo.ops re-exports the functions under the same names).
    f4 = importlib.import_module("primus_turbo.pytorch.ops.gemm_fp4")
    f8 = importlib.import_module("primus_turbo.pytorch.ops.gemm_fp8")

    G = ScalingGranularity
    bf16, e4m3 = torch.bfloat16, torch.float8_e4m3fn
    a = torch.randn(256, 256, device="cuda", dtype=bf16, requires_grad=True)
    b = torch.randn(256, 256, device="cuda", dtype=bf16, requires_grad=True)
    g = torch.randn(256, 256, device="cuda", dtype=bf16)
    ad, bd = a.detach(), b.detach()
    out = {}
    for name, gran in (("tensorwise", G.TENSORWISE), ("rowwise", G.ROWWISE), ("blockwise", G.BLOCKWISE)):
        cfg = Float8QuantConfig(granularity=gran, block_size=128 if gran == G.BLOCKWISE else None)
        code = f8._NATIVE_GRANULARITY[gran]
        native_fwd = f8._native_fwd
        out[f"gemm_fp8_{name}"] = {
            "op train fwd": (lambda cfg: lambda: turbo.ops.gemm_fp8(a, b, trans_b=True, config=cfg))(cfg),
            "Function.apply": (lambda cfg: lambda: f8.NativeGemmFp8Function.apply(
                a, b, False, True, bf16, cfg.format, cfg.granularity, None))(cfg),
            "native fwd (for bwd)": (
                lambda code: lambda: native_fwd(ad, bd, False, True, bf16, e4m3, code, True)
            )(code),
            "native infer": (lambda code: lambda: f8._native_infer(ad, bd, False, True, bf16, e4m3, code))(code),
            "native train (C++ autograd)": (lambda code: lambda: f8._native_train(
                a, b, False, True, bf16, e4m3, e4m3, code))(code),
            "op step": (lambda cfg: lambda: torch.autograd.grad(
                turbo.ops.gemm_fp8(a, b, trans_b=True, config=cfg), (a, b), g))(cfg),
        }
    fp4 = Float4QuantConfig()
    out["gemm_fp4"] = {
        "op train fwd": lambda: turbo.ops.gemm_fp4(a, b, trans_b=True, config=fp4),
        "native fwd (for bwd)": lambda: f4._native_fwd(ad, bd, False, True, bf16, False, False, True, True),
        "native infer": lambda: f4._native_fwd(ad, bd, False, True, bf16, False, False, False, False),
        "op step": lambda: torch.autograd.grad(turbo.ops.gemm_fp4(a, b, trans_b=True, config=fp4), (a, b), g),
    }
    groups = 4
    ga = torch.randn(groups * 64, 256, device="cuda", dtype=bf16, requires_grad=True)
    gb = torch.randn(groups, 256, 256, device="cuda", dtype=bf16, requires_grad=True)
    lens = torch.full((groups,), 64, device="cuda", dtype=torch.int64)
    block = Float8QuantConfig(granularity=G.BLOCKWISE, block_size=128)
    gf8 = importlib.import_module("primus_turbo.pytorch.ops.grouped_gemm_fp8")
    offs = torch.arange(0, groups * 64 + 1, 64, device="cuda", dtype=torch.int64)
    out["grouped_gemm_fp8_blockwise"] = {
        "op train fwd": lambda: turbo.ops.grouped_gemm_fp8(ga, gb, lens, trans_b=True, config=block),
        "Function.apply": lambda: gf8.NativeGroupedGemmFp8Function.apply(
            ga, gb, lens, None, True, bf16, block.format, G.BLOCKWISE, 0),
        "native fwd (for bwd)": lambda: gf8._fwd_op(ga.detach(), gb.detach(), lens, None, True, bf16, e4m3,
                                                    f8._NATIVE_GRANULARITY[G.BLOCKWISE], 0, True),
        "native fwd, offsets given": lambda: gf8._fwd_op(ga.detach(), gb.detach(), lens, offs, True, bf16, e4m3,
                                                         f8._NATIVE_GRANULARITY[G.BLOCKWISE], 0, True),
        "op step": lambda: torch.autograd.grad(
            turbo.ops.grouped_gemm_fp8(ga, gb, lens, trans_b=True, config=block), (ga, gb),
            torch.ones(groups * 64, 256, device="cuda", dtype=bf16)),
    }
    # Other ops as the host-overhead benchmark calls them (its no-grad forward and its fwd+bwd).
    import bench_host_overhead as bho

    cases = bho._cases(turbo)
    for name in ("gemm", "rmsnorm", "layernorm", "moe_permute", "token_permute", "flash_attn", "grouped_gemm_fp4"):
        fwd, _, step, _ = cases[name]
        out[name] = {"op fwd (no grad)": (lambda f: lambda: _no_grad(f))(fwd), "op step": step}
    return out


def _no_grad(fn):
    with torch.no_grad():
        return fn()


def _primitives():
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    return {
        "torch.empty 256x256": lambda: torch.empty(256, 256, device="cuda", dtype=torch.bfloat16),
        "torch.add (one launch)": lambda: torch.add(x, y),
        "torch.matmul no grad": lambda: torch.matmul(x, y.t()),
        "torch.cuda.current_stream": lambda: torch.cuda.current_stream(),
    }


def _profile(fn, calls: int = 200, top: int = 18) -> None:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    print(f"      {'event':44s} {'per call':>8s} {'self us/call':>12s}")
    for e in rows:
        print(f"      {e.key[:44]:44s} {e.count / calls:8.2f} {e.self_cpu_time_total / calls:12.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ops", default=None)
    p.add_argument("--iters", type=int, default=3000)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--spin", default=None, help="OP/LAYER: call only this layer, for --seconds, then exit")
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args()
    import primus_turbo.pytorch as turbo

    if args.spin:
        op, layer = args.spin.split("/", 1)
        fn = _layers(turbo)[op][layer]
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        calls, end = 0, time.perf_counter() + args.seconds
        while time.perf_counter() < end:
            for _ in range(100):
                fn()
            torch.cuda.synchronize()
            calls += 100
        print(f"{args.spin}: {calls} calls in {args.seconds} s")
        return

    print("torch primitives, host us per call:")
    for name, fn in _primitives().items():
        print(f"  {name:32s} {bu.host_us_per_call(fn, args.iters, warmup=50):8.2f}")
    layers = _layers(turbo)
    names = args.ops.split(",") if args.ops else list(layers)
    for name in names:
        print(f"\n{name}: host us per call")
        for layer, fn in layers[name].items():
            iters = args.iters // 4 if "step" in layer else args.iters
            try:
                best = min(bu.host_us_per_call(fn, iters // 3, warmup=30) for _ in range(3))
                print(f"  {layer:32s} {best:8.2f}")
            except Exception as e:  # a layer that cannot run here is reported, not fatal
                print(f"  {layer:32s} ERROR {type(e).__name__}: {str(e)[:150]}")
        if args.no_profile:
            continue
        for layer in ("native fwd (for bwd)", "op fwd (no grad)", "op step"):
            if layer in layers[name]:
                print(f"  profile of '{layer}':")
                try:
                    _profile(layers[name][layer])
                except Exception as e:
                    print(f"    ERROR {type(e).__name__}: {str(e)[:150]}")


if __name__ == "__main__":
    main()
