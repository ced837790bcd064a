"""The attention reference of ACCURACY.md: explicit softmax(q k^T * scale + mask) v in float32 on
upcast inputs, with its gradients by autograd; shared by the GPU tests and the host-side checks
(where it stands in for the kernels)."""

import torch


def reference(q, k, v, dout=None, sink=None, softmax_scale=None, causal=False, window_size=(-1, -1)):
    """One fixed-length batch ([B, S, H, D] tensors, any strides) in float32 on upcast inputs:
    (out, lse, dq, dk, dv, dsink), the gradients by autograd (None without dout). GQA by repeating
    k and v; the sink is an extra logit column dropped after the softmax; key j is visible from
    query i iff i + Sk - Sq - left <= j <= i + Sk - Sq + right."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    left, right = window_size
    right = 0 if causal else right
    grad = dout is not None
    qf, kf, vf = (t.detach().float().requires_grad_(grad) for t in (q, k, v))
    sf = sink.detach().float().requires_grad_(grad) if sink is not None else None
    kr, vr = kf.repeat_interleave(hq // hkv, dim=2), vf.repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kr) * scale
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    s = s.masked_fill(~visible, -1e30)  # finite: a query without keys keeps finite gradients
    if sf is not None:
        s = torch.cat((s, sf.view(1, hq, 1, 1).expand(b, hq, sq, 1)), dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])[..., :sk] * visible  # a query without keys: all weight on the sink
    out = torch.einsum("bhqk,bkhd->bqhd", p, vr)
    lse = lse.detach()
    if sf is None:
        lse = lse.masked_fill(~visible.any(-1), float("inf"))
    grads = [None] * 4
    if grad:
        leaves = [qf, kf, vf] + ([sf] if sf is not None else [])
        got = torch.autograd.grad(out, leaves, dout.float(), allow_unused=True)
        grads = [torch.zeros_like(t) if g is None else g for g, t in zip(got, leaves)] + [None] * (4 - len(leaves))
    return (out.detach(), lse, *grads)


def varlen_reference(q, k, v, dout, cu_q, cu_k, sink=None, **kwargs):
    """Packed [T, H, D] sequences: the fixed-length reference per sequence, concatenated; lse
    [Hq, Tq], dsink summed over the sequences."""
    lens_q, lens_k = cu_q.diff().tolist(), cu_k.diff().tolist()
    parts, dsink = [], None
    for qs, ks, vs, gs in zip(q.split(lens_q), k.split(lens_k), v.split(lens_k), dout.split(lens_q)):
        *per_seq, ds = reference(qs[None], ks[None], vs[None], gs[None], sink, **kwargs)
        parts.append([t[0] for t in per_seq])  # out, lse, dq, dk, dv without the batch dimension
        if ds is not None:
            dsink = ds if dsink is None else dsink + ds
    out, lse, dq, dk, dv = (torch.cat(ts, dim=1 if i == 1 else 0) for i, ts in enumerate(zip(*parts)))
    return out, lse, dq, dk, dv, dsink


def reference_flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), sink=None):
    """A stand-in for turbo.ops.flash_attn_func (forward only, any device) for host-side tests."""
    kwargs = {"softmax_scale": softmax_scale, "causal": causal, "window_size": window_size}
    return reference(q, k, v, None, sink, **kwargs)[0].to(q.dtype)


def reference_flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, sink=None, **kwargs):
    """A stand-in for turbo.ops.flash_attn_varlen_func (forward only) for host-side tests."""
    lens_q, lens_k = cu_q.diff().tolist(), cu_k.diff().tolist()
    assert max(lens_q) <= max_q and max(lens_k) <= max_k, "max_seqlen_q/k must bound the lengths"
    outs = [
        reference_flash_attn_func(qs[None], ks[None], vs[None], sink=sink, **kwargs)[0]
        for qs, ks, vs in zip(q.split(lens_q), k.split(lens_k), v.split(lens_k))
    ]
    return torch.cat(outs)
