"""Times our TURBO attention backward alone (autograd.grad of one forward, CUDA events, 20 calls)
on four shapes: hdim 128 [4, 4K, 32/8] and [1, 16K, 32/32], MLA 192/128 [4, 4K, 128] and
[1, 16K, 16], all causal. For A/B tests of the backward kernels (with PRIMUS_TURBO_KERNEL_INCLUDE
pointing at a variant of csrc/kernels): the numbers of docs/PERFORMANCE.md's fused-dQ table.

    python3 -P tools/attention_bwd_probe.py TAG [det]    # det: deterministic=True (separate dQ)
"""
import sys
import torch
import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.backend import GlobalBackendManager

GlobalBackendManager.set_attn_backend("TURBO")
tag = sys.argv[1]
det = len(sys.argv) > 2 and sys.argv[2] == "det"
for b, s, hq, hkv, d, dv, causal in [(4, 4096, 32, 8, 128, 128, True), (1, 16384, 32, 32, 128, 128, True),
                                     (4, 4096, 128, 128, 192, 128, True), (1, 16384, 16, 16, 192, 128, True)]:
    torch.manual_seed(0)
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, hkv, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = turbo.ops.flash_attn_func(q, k, v, causal=causal, deterministic=det)
    do = torch.randn_like(out)
    for _ in range(3):
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    st.record()
    n = 20
    for _ in range(n):
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    en.record()
    torch.cuda.synchronize()
    ms = st.elapsed_time(en) / n
    flops = 2 * b * s * s * hq * (d + dv) * (0.5 if causal else 1.0) * 2.5
    print(f"{tag:10s} b{b} s{s} h{hq}/{hkv} d{d}/{dv} {'causal' if causal else 'full'} bwd {ms:.3f} ms "
          f"{flops / ms / 1e9:.0f} TFLOPS", flush=True)
