import sys, time, torch
sys.path.insert(0, "tests/pytorch")
from attention_reference import reference
import primus_turbo.pytorch as turbo
def snr(a, b):
    a, b = a.double(), b.double()
    return (10 * torch.log10(b.pow(2).sum() / (a - b).pow(2).sum().clamp_min(1e-300))).item()
for (b, s, hq, hkv, d, dv, causal) in [(1, 128, 1, 1, 128, 128, False), (2, 300, 4, 2, 128, 128, True), (1, 200, 2, 2, 64, 64, False), (1, 257, 2, 1, 192, 128, True), (1, 300, 2, 2, 96, 96, False)]:
    torch.manual_seed(0)
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, s, hkv, dv, device="cuda", dtype=torch.bfloat16)
    try:
        t0 = time.time()
        out, lse = turbo.ops.flash_attn_fp8_func(q, k, v, causal=causal, return_lse=True)
        torch.cuda.synchronize()
        ref, rlse = reference(q, k, v, causal=causal)[:2]
        print(f"d{d}/{dv} s{s} causal={causal}: out SNR {snr(out, ref):.1f} lse SNR {snr(lse, rlse):.1f} ({time.time()-t0:.1f}s)", flush=True)
    except Exception as e:
        print(f"d{d}/{dv}: ERROR {type(e).__name__}: {str(e)[:400]}", flush=True)
