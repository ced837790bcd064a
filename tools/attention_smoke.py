"""Quick look at the attention kernels on the GPU: SNR of out, lse, dq, dk, dv (and dsink) of the
native ops against a float32 reference, for a handful of shapes and masks. A debugging aid; the
tests are tests/pytorch/test_attention.py.

    python tools/attention_smoke.py [--bench] [--backend TURBO|CUDNN]   (default TURBO)
"""

import math
import sys
from pathlib import Path

import torch

from primus_turbo.pytorch.core import native  # noqa: F401  (loads the native ops)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmark.ops.bench_utils import time_cuda  # noqa: E402

ops = torch.ops.primus_turbo
BACKENDS = {"TURBO": 4, "CUDNN": 3, "auto": 0}  # pt_backend codes
BACKEND = BACKENDS["TURBO"]


def snr(out, ref):
    noise = (out.double() - ref.double()).pow(2).sum().item()
    sig = ref.double().pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * math.log10(max(sig, 1e-300) / noise)


def reference(q, k, v, scale, left, right, sink, dout):
    """[B, S, H, D] float32 reference with autograd."""
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    sk = sink.detach().float().requires_grad_() if sink is not None else None
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    kr = kf.repeat_interleave(Hq // Hkv, dim=2)
    vr = vf.repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kr) * scale
    i = torch.arange(Sq, device=q.device)[:, None]
    j = torch.arange(Sk, device=q.device)[None, :]
    vis = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if right >= 0:
        vis &= j <= i + Sk - Sq + right
    if left >= 0:
        vis &= j >= i + Sk - Sq - left
    s = s.masked_fill(~vis, float("-inf"))
    row_any = vis.any(-1)[:, None]
    if sk is not None:  # the sink keeps every row's softmax finite
        s = torch.cat([s, sk.view(1, Hq, 1, 1).expand(B, Hq, Sq, 1)], dim=-1)
    else:  # rows that see nothing: zero output, lse +inf (as the kernel), and no NaN gradients
        s = torch.where(row_any, s, 0.0)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    if sk is not None:
        p = p[..., :-1]
    else:
        p = p * row_any
        lse = torch.where(row_any[..., 0], lse, float("inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", p, vr)
    o.backward(dout.float())
    return o.detach(), lse.detach(), qf.grad, kf.grad, vf.grad, (sk.grad if sk is not None else None)


def case(B, Sq, Sk, Hq, Hkv, D, Dv, left=-1, right=-1, sink=False, dtype=torch.bfloat16):
    torch.manual_seed(0)
    q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=dtype)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dtype)
    v = torch.randn(B, Sk, Hkv, Dv, device="cuda", dtype=dtype)
    dout = torch.randn(B, Sq, Hq, Dv, device="cuda", dtype=dtype)
    s = torch.randn(Hq, device="cuda") if sink else None
    scale = D ** -0.5
    out, lse = ops.attention_fwd(q, k, v, s, None, None, Sq, Sk, scale, left, right, BACKEND)
    dq, dk, dv, ds = ops.attention_bwd(
        dout, q, k, v, out, lse, s, None, None, Sq, Sk, scale, left, right, BACKEND, False
    )
    torch.cuda.synchronize()
    ro, rl, rdq, rdk, rdv, rds = reference(q, k, v, scale, left, right, s, dout)
    fin = torch.isfinite(rl)
    res = {
        "out": snr(out, ro),
        "lse": snr(lse[fin], rl[fin]) if fin.any() else float("inf"),
        "dq": snr(dq, rdq),
        "dk": snr(dk, rdk),
        "dv": snr(dv, rdv),
    }
    if sink:
        res["dsink"] = snr(ds, rds)
    ok = all(x >= 40 for x in res.values())
    print(f"{'OK  ' if ok else 'FAIL'} B{B} Sq{Sq} Sk{Sk} H{Hq}/{Hkv} D{D}/{Dv} win({left},{right}) sink={sink} "
          f"{str(dtype)[6:]}: " + " ".join(f"{k} {v:.1f}" for k, v in res.items()), flush=True)
    return ok


CASES = [
    dict(B=2, Sq=128, Sk=128, Hq=2, Hkv=2, D=128, Dv=128),
    dict(B=2, Sq=200, Sk=333, Hq=4, Hkv=1, D=128, Dv=128, right=0),
    dict(B=1, Sq=333, Sk=200, Hq=4, Hkv=2, D=64, Dv=64, right=0),
    dict(B=1, Sq=17, Sk=17, Hq=2, Hkv=2, D=96, Dv=96),
    dict(B=1, Sq=300, Sk=300, Hq=2, Hkv=1, D=192, Dv=128, right=0),
    dict(B=1, Sq=257, Sk=257, Hq=2, Hkv=2, D=256, Dv=256),
    dict(B=2, Sq=300, Sk=300, Hq=8, Hkv=1, D=64, Dv=64, left=40, right=0, sink=True),
    dict(B=1, Sq=1, Sk=1000, Hq=2, Hkv=2, D=128, Dv=128, right=0),
    dict(B=1, Sq=130, Sk=130, Hq=2, Hkv=2, D=128, Dv=128, dtype=torch.float16),
]

def bench(B=4, S=4096, H=32, Hkv=32, D=128, causal=True):
    """ms and TFLOPS of forward and forward+backward, ours vs SDPA on cuDNN, in this process."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    right = 0 if causal else -1
    flops = 4 * B * S * S * H * D / (2 if causal else 1)

    def ours_fwd():
        return ops.attention_fwd(q, k, v, None, None, None, S, S, D**-0.5, -1, right, BACKEND)

    def ours_step():
        out, lse = ours_fwd()
        ops.attention_bwd(dout, q, k, v, out, lse, None, None, None, S, S, D**-0.5, -1, right, BACKEND, False)

    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    dt = dout.transpose(1, 2)

    def sdpa_fwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=H != Hkv)

    def sdpa_step():
        torch.autograd.grad(sdpa_fwd(), (qt, kt, vt), dt)

    with torch.no_grad():
        f_ours, f_sdpa = time_cuda(ours_fwd), time_cuda(sdpa_fwd)
    s_ours, s_sdpa = time_cuda(ours_step), time_cuda(sdpa_step)
    print(f"B{B} S{S} H{H}/{Hkv} D{D} causal={causal}: fwd ours {f_ours:.2f} ms ({flops / f_ours / 1e9:.0f} TFLOPS) "
          f"cudnn {f_sdpa:.2f} ms ({flops / f_sdpa / 1e9:.0f}); step ours {s_ours:.2f} ms "
          f"({3.5 * flops / s_ours / 1e9:.0f}) cudnn {s_sdpa:.2f} ms ({3.5 * flops / s_sdpa / 1e9:.0f}); "
          f"step ratio {s_sdpa / s_ours:.2f}", flush=True)


if __name__ == "__main__":
    if "--backend" in sys.argv:
        BACKEND = BACKENDS[sys.argv[sys.argv.index("--backend") + 1]]
    failed = 0
    for c in CASES:
        try:
            failed += not case(**c)
        except RuntimeError as e:  # a shape the forced backend does not take
            if "cannot run" not in str(e):
                raise
            print(f"SKIP {c}: {str(e).split(': ', 2)[-1]}", flush=True)
    if "--bench" in sys.argv:
        for causal in (False, True):
            bench(causal=causal)
        bench(B=2, S=8192, H=64, Hkv=8, D=128, causal=True)
    sys.exit(1 if failed else 0)
