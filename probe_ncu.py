import torch, primus_turbo.pytorch as turbo
torch.manual_seed(0)
q = torch.randn(4, 4096, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
for causal in (True, False):
    for _ in range(3):
        turbo.ops.flash_attn_fp8_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        turbo.ops.flash_attn_fp8_func(q, k, v, causal=causal)
    e.record(); torch.cuda.synchronize()
    ms = s.elapsed_time(e) / 10
    fl = 4 * 4096 * 4096 * 32 * 256 * 2 * (0.5 if causal else 1.0)
    print(f"causal={causal}: {ms:.3f} ms, {fl / ms / 1e9:.0f} TFLOPS", flush=True)
