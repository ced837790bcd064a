import torch, primus_turbo.pytorch as turbo
torch.manual_seed(0)
for (b, s, hq, hkv, d) in [(4, 4096, 32, 8, 128), (8, 2048, 32, 32, 128)]:
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in range(5):
        out = turbo.ops.flash_attn_fp8_func(q, k, v, causal=True)
        with torch.no_grad():
            turbo.ops.flash_attn_fp8_func(q, k, v, causal=True)
    torch.cuda.synchronize()
