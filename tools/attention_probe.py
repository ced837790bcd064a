"""Times our TURBO attention forward or backward alone (bench_utils.time_cuda: median of per-call
CUDA events) on a few shapes, for A/B tests of the sm90 kernels (with PRIMUS_TURBO_KERNEL_INCLUDE
pointing at a variant of csrc/kernels): hdim 128 [8, 2K, 32/8] causal and [8, 2K, 32/32] full,
[4, 4K, 32/8] causal, [1, 8K, 32/8] causal (the dense training step's), [2, 8K, 32/32] full, [1, 16K, 32/32] causal and full;
MLA 192/128 [4, 4K, 128] and [1, 16K, 16] causal. The backward is autograd.grad of one forward.
fp8fwd times flash_attn_fp8_func's forward (quantization included) and prints each kernel's share
of the 16K shapes; fp8bwd times its backward on our FP8 backward kernels (MLA's head dims take the
16-bit one) and prints each kernel's share of one backward of the 16K causal shape.

    python3 -P tools/attention_probe.py TAG fwd|bwd|fp8fwd|fp8bwd [det] [d128]
    # det: deterministic=True (separate dQ); d128: the head-dim-128 shapes only
"""
import sys
from pathlib import Path

import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.backend import GlobalBackendManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmark.ops.bench_utils import time_cuda  # noqa: E402

SHAPES = [  # batch, seqlen, heads q / kv, head dims q·k / v, causal
    (8, 2048, 32, 8, 128, 128, True), (8, 2048, 32, 32, 128, 128, False),
    (4, 4096, 32, 8, 128, 128, True), (1, 8192, 32, 8, 128, 128, True), (2, 8192, 32, 32, 128, 128, False),
    (1, 16384, 32, 32, 128, 128, True),
    (1, 16384, 32, 32, 128, 128, False), (4, 4096, 128, 128, 192, 128, True), (1, 16384, 16, 16, 192, 128, True),
]


def main():
    tag, mode = sys.argv[1], sys.argv[2]
    det, d128_only = "det" in sys.argv[3:], "d128" in sys.argv[3:]
    GlobalBackendManager.set_attn_backend("TURBO")
    if mode == "fp8bwd":
        from primus_turbo.pytorch.ops import attention_fp8

        attention_fp8._FP8_BWD = True  # our FP8 backward kernels (opt-in)
    for b, s, hq, hkv, d, dv, causal in SHAPES:
        if d128_only and d != 128:
            continue
        torch.manual_seed(0)
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, s, hkv, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        if mode in ("fwd", "fp8fwd"):
            fn = turbo.ops.flash_attn_fp8_func if mode == "fp8fwd" else turbo.ops.flash_attn_func
            with torch.no_grad():
                ms = time_cuda(lambda: fn(q, k, v, causal=causal))
                if mode == "fp8fwd" and s == 16384 and d == 128:
                    kernel_shares(lambda: fn(q, k, v, causal=causal))
            mult = 1.0
        else:
            fn = turbo.ops.flash_attn_fp8_func if mode == "fp8bwd" else turbo.ops.flash_attn_func
            out = fn(q, k, v, causal=causal, deterministic=det)
            do = torch.randn_like(out)
            ms = time_cuda(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
            mult = 2.5
            if mode == "fp8bwd" and s == 16384 and causal and d == 128:
                kernel_shares(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
        flops = 2 * b * s * s * hq * (d + dv) * (0.5 if causal else 1.0) * mult
        print(f"{tag:10s} {mode} b{b} s{s} h{hq}/{hkv} d{d}/{dv} {'causal' if causal else 'full'} {ms:.3f} ms "
              f"{flops / ms / 1e9:.0f} TFLOPS", flush=True)


def kernel_shares(fn):
    """Each kernel's GPU time in one call of fn (after a warm-up), largest first."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.device_time_total for e in events)
    for e in sorted(events, key=lambda e: -e.device_time_total)[:8]:
        print(f"    {e.device_time_total / 1e3:8.3f} ms {100 * e.device_time_total / total:5.1f}%  {e.key[:90]}")


if __name__ == "__main__":
    main()
