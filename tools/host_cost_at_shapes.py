"""Host (CPU) µs of one call issued onto an idle GPU, at the end-to-end models' shapes: what the
training step's host pays per op when its kernels are long (bench_host_overhead.py times tiny
inputs, where the host is the whole call). Each sample: synchronize, then time the call alone, so
the launch queue is empty and no wait on the GPU is counted; the median of --reps samples.

    python3 -P tools/host_cost_at_shapes.py [--reps 40] [--ops gemm,gemm_fp8_blockwise]
    py-spy record --native -r 1000 -f raw -o stacks.txt -- \
        python3 -P tools/host_cost_at_shapes.py --spin gemm_fp8_tensorwise/0 --seconds 5
        # one case (ours; "/0t" for torch's) in the same synchronize-then-call loop, for a sampler
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def host_us(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t0)
        del out
    torch.cuda.synchronize()
    return statistics.median(samples) * 1e6


def cases(turbo):
    """name -> list of (shape label, ours, torch's nearest); callables run one forward (training:
    inputs that need gradients) or, with a '_step' name, a forward and backward."""
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity as G

    bf16 = torch.bfloat16

    def t(*shape, grad=True):
        return torch.randn(*shape, device="cuda", dtype=bf16, requires_grad=grad)

    out = {}
    # (M, K, N): the MoE model's QKV projection, the dense model's, and a tiny one for scale.
    dense = [(8192, 2048, 5120), (8192, 4096, 6144), (256, 256, 256)]
    tensors = {s: (t(s[0], s[1]), t(s[2], s[1])) for s in dense}
    out["gemm"] = [(f"{m}x{k}x{n}", (lambda a, b: lambda: turbo.ops.gemm(a, b, trans_b=True))(*tensors[(m, k, n)]),
                    (lambda a, b: lambda: torch.matmul(a, b.t()))(*tensors[(m, k, n)])) for m, k, n in dense]
    for gname, gran in (("tensorwise", G.TENSORWISE), ("blockwise", G.BLOCKWISE)):
        cfg = Float8QuantConfig(granularity=gran, block_size=128 if gran == G.BLOCKWISE else None)
        out[f"gemm_fp8_{gname}"] = [
            (f"{m}x{k}x{n}",
             (lambda a, b, cfg: lambda: turbo.ops.gemm_fp8(a, b, trans_b=True, config=cfg))(*tensors[(m, k, n)], cfg),
             (lambda a, b: lambda: torch.matmul(a, b.t()))(*tensors[(m, k, n)]))
            for m, k, n in dense
        ]
    # The MoE experts: 128 experts, 65536 routed rows (512 an expert), gate_up [G, 1536, 2048].
    groups, rows, k, n = 128, 65536, 2048, 1536
    x, w = t(rows, k), t(groups, n, k)
    lens = torch.full((groups,), rows // groups, dtype=torch.int64, device="cuda")
    offs = lens.cumsum(0).to(torch.int32)
    block = Float8QuantConfig(granularity=G.BLOCKWISE, block_size=128)
    grouped_torch = lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)  # noqa: E731
    out["grouped_gemm"] = [("128x512x2048x1536", lambda: turbo.ops.grouped_gemm(x, w, lens, trans_b=True), grouped_torch)]
    out["grouped_gemm_fp8_blockwise"] = [
        ("128x512x2048x1536", lambda: turbo.ops.grouped_gemm_fp8(x, w, lens, trans_b=True, config=block), grouped_torch)
    ]
    q, kv = t(4, 2048, 32, 128), t(4, 2048, 4, 128)
    vv = t(4, 2048, 4, 128)
    out["flash_attn"] = [(
        "4x2048 32/4x128 causal",
        lambda: turbo.ops.flash_attn_func(q, kv, vv, causal=True),
        lambda: F.scaled_dot_product_attention(q.transpose(1, 2), kv.transpose(1, 2), vv.transpose(1, 2),
                                               is_causal=True, enable_gqa=True),
    )]
    h, g = t(8192, 2048), t(2048)
    out["rmsnorm"] = [("8192x2048", lambda: turbo.ops.rmsnorm(h, g, 1e-5), lambda: F.rms_norm(h, (2048,), g, 1e-5))]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--ops", default=None, help="comma-separated subset")
    p.add_argument("--spin", default=None, help="NAME/INDEX[t]: only this case (t: torch's), for --seconds")
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args()
    import primus_turbo.pytorch as turbo

    table = cases(turbo)
    if args.spin:
        name, index = args.spin.split("/")
        label, ours, theirs = table[name][int(index.rstrip("t"))]
        fn = theirs if index.endswith("t") else ours
        end, calls = time.perf_counter() + args.seconds, 0
        while time.perf_counter() < end:
            host_us(fn, 20)
            calls += 23
        print(f"{name} {label} {'torch' if index.endswith('t') else 'ours'}: {calls} calls")
        return 0
    names = args.ops.split(",") if args.ops else list(table)
    print(f"{'op':28s} {'shape':26s} {'ours us':>9s} {'torch us':>9s} {'torch/ours':>10s}")
    for name in names:
        for label, ours, theirs in table[name]:
            o, th = host_us(ours, args.reps), host_us(theirs, args.reps)
            print(f"{name:28s} {label:26s} {o:9.1f} {th:9.1f} {th / o:10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
