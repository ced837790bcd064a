"""Child process of test_attention.py's kernel-choice test: with PRIMUS_TURBO_ATTN_KERNEL set before
the first attention call (the core reads it once) our kernel runs on the chosen modules: "mma",
the mma.sync forward and backward, which sm_90a otherwise replaces with the wgmma ones. out, lse,
dq, dk, dv (and dsink) against the float32 reference over masks, GQA, sinks, odd lengths, both
dtypes and head dims 64 and 128. Prints one line a case; exits 1 on a failure."""

import os
import sys

import torch
from attention_reference import reference, varlen_reference
from turbo_test_utils import snr_db

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.backend import GlobalBackendManager

assert os.environ.get("PRIMUS_TURBO_ATTN_KERNEL") == "mma"
GlobalBackendManager.set_attn_backend("TURBO")

CASES = [  # b, sq, sk, hq, hkv, d, causal, window, sink, dtype
    (2, 256, 256, 4, 4, 128, False, (-1, -1), False, torch.bfloat16),
    (2, 256, 256, 8, 2, 128, True, (-1, -1), False, torch.bfloat16),
    (1, 1000, 1000, 4, 1, 64, True, (-1, -1), False, torch.float16),
    (2, 17, 300, 4, 2, 128, True, (-1, -1), True, torch.bfloat16),
    (2, 333, 100, 4, 4, 64, True, (-1, -1), False, torch.bfloat16),  # rows that see no key
    (2, 300, 300, 8, 1, 64, True, (128, 0), True, torch.bfloat16),  # GPT-OSS window + sinks
    (1, 4097, 4097, 2, 1, 128, True, (-1, -1), False, torch.bfloat16),
    (2, 200, 230, 4, 2, 128, False, (7, 9), False, torch.float16),  # a two-sided window, fp16
]


def check(name, got, ref):
    inf = torch.isinf(ref)
    if inf.any() and not torch.equal(got[inf], ref[inf]):
        return f"{name}: +inf rows differ"
    g, r = got[~inf].double(), ref[~inf].double()
    if not torch.isfinite(g).all():
        return f"{name}: non-finite values"
    snr = snr_db(g, r) if r.numel() else float("inf")
    return None if snr >= 40 else f"{name}: SNR {snr:.1f} dB"


failed = 0
for b, sq, sk, hq, hkv, d, causal, window, with_sink, dtype in CASES:
    torch.manual_seed(sq + sk + d)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
    dout = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    sink = torch.randn(hq, device="cuda") if with_sink else None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([sink.clone().requires_grad_()] if with_sink else [])
    out, lse = turbo.ops.flash_attn_func(
        *leaves[:3], causal=causal, window_size=window, sink=leaves[3] if with_sink else None, return_lse=True
    )
    grads = torch.autograd.grad(out, leaves, dout)
    ref = reference(q, k, v, dout, sink=sink, causal=causal, window_size=window)
    got = (out, lse, *grads[:3], grads[3] if with_sink else None)
    errors = [check(n, g, r) for n, g, r in zip(("out", "lse", "dq", "dk", "dv", "dsink"), got, ref) if r is not None]
    errors = [e for e in errors if e]
    failed += bool(errors)
    print(f"{'FAIL' if errors else 'OK  '} b{b} q{sq} k{sk} h{hq}/{hkv} d{d} causal={causal} window={window} "
          f"sink={with_sink} {dtype}: {'; '.join(errors)}", flush=True)

lens = [5, 0, 1, 300, 129]
cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
torch.manual_seed(7)
q = torch.randn(sum(lens), 8, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(sum(lens), 2, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn(sum(lens), 2, 128, device="cuda", dtype=torch.bfloat16)
dout = torch.randn_like(q)
leaves = [t.clone().requires_grad_() for t in (q, k, v)]
out, lse = turbo.ops.flash_attn_varlen_func(*leaves, cu, cu, 300, 300, causal=True, return_lse=True)
grads = torch.autograd.grad(out, leaves, dout)
ref = varlen_reference(q, k, v, dout, cu, cu, causal=True)
errors = [check(n, g, r) for n, g, r in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), ref[:5])]
errors = [e for e in errors if e]
failed += bool(errors)
print(f"{'FAIL' if errors else 'OK  '} varlen {lens}: {'; '.join(errors)}", flush=True)
sys.exit(1 if failed else 0)
