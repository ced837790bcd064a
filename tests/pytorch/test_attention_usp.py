"""turbo.ops.flash_attn_usp_func: context-parallel attention over a (ring x Ulysses) mesh.

Every rank's output, log-sum-exp and q/k/v gradients are checked against the float64 attention of
the whole sequence (computed in every process from the same seed) at the rank's slice of it.
- On the CPU (CI): gloo process groups, the per-block kernels replaced by a float64 reference, so
  the exchanges, the ring schedule (causal skips, the dK/dV sums travelling home) and the merge are
  checked to 1e-9. Meshes 2x2, 4x1 and 1x4; contiguous and zigzag shards; causal and not; GQA,
  MQA and fewer K/V heads than Ulysses ranks.
- On GPUs (2 or more): NCCL, our kernels, the bf16 gate (40 dB); flash_attn_fp8_usp_func over
  Ulysses at the FP8 gate (20 dB).
- flash_attn_varlen_usp_func over Ulysses: packed documents crossing the ranks' shares, both ways.
"""

import contextlib
import os
import socket

import pytest
import torch

from primus_turbo.pytorch.ops import attention_usp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _visible(sq, sk, wl, wr, device):
    i = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if wl >= 0:
        ok &= j >= i - wl
    if wr >= 0:
        ok &= j <= i + wr
    return ok


def _scores(q, k, scale, wl, wr):
    rep = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(rep, 2)) * scale
    return s.masked_fill(~_visible(q.shape[1], k.shape[1], wl, wr, q.device), float("-inf"))


def ref_block_forward(q, k, v, scale, wl, wr, code):
    s = _scores(q, k, scale, wl, wr)
    lse = torch.logsumexp(s, -1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.exp(s - lse[..., None]),
                       v.double().repeat_interleave(q.shape[2] // k.shape[2], 2))
    return out.to(q.dtype), lse.to(torch.float32 if q.dtype != torch.float64 else q.dtype)


def ref_block_backward(dout, q, k, v, out, lse, scale, wl, wr, code, deterministic):
    rep = q.shape[2] // k.shape[2]
    b, sk, hkv, d = k.shape
    p = torch.exp(_scores(q, k, scale, wl, wr) - lse.double()[..., None])
    dout, out = dout.double(), out.double()
    kk, vv = k.double().repeat_interleave(rep, 2), v.double().repeat_interleave(rep, 2)
    dv = torch.einsum("bhqk,bqhd->bkhd", p, dout)
    dp = torch.einsum("bqhd,bkhd->bhqk", dout, vv)
    ds = p * (dp - (dout * out).sum(-1).transpose(1, 2)[..., None])
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kk) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.double()) * scale
    dk = dk.view(b, sk, hkv, rep, d).sum(3)
    dv = dv.view(b, sk, hkv, rep, v.shape[-1]).sum(3)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _full_reference(q, k, v, dout, causal, scale):
    q, k, v = (t.double().detach().requires_grad_() for t in (q, k, v))
    s = _scores(q, k, scale, -1, 0 if causal else -1)
    lse = torch.logsumexp(s, -1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.repeat_interleave(q.shape[2] // k.shape[2], 2))
    out.backward(dout.double())
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _run_cases(rank, world, ring, ulysses, device, dtype, cases, check, fn=None, layouts=("contiguous", "zigzag"),
               check_lse=None):
    ug, rg = attention_usp.mesh_groups(ring, ulysses)
    for (causal, hq, hkv, s_local), layout in ((c, lay) for c in cases for lay in layouts):
        gen = torch.Generator().manual_seed(1000 + 10 * hq + hkv + int(causal))
        b, d, total = 2, 64 if device.type == "cuda" else 8, s_local * world
        q, k, v, dout = (torch.randn(b, total, h, d, generator=gen) for h in (hq, hkv, hkv, hq))
        scale = d ** -0.5
        out_ref, lse_ref, dq_ref, dk_ref, dv_ref = _full_reference(q, k, v, dout, causal, scale)
        mine = attention_usp.shard_positions(total, ring, rank // ulysses, ulysses, rank % ulysses, layout)
        ql, kl, vl = (t[:, mine].to(device, dtype).requires_grad_() for t in (q, k, v))
        kwargs = {"seq_layout": layout} if fn is None else {}
        out, lse = (fn or attention_usp.flash_attn_usp_func)(ql, kl, vl, causal=causal, return_lse=True,
                                                             ulysses_group=ug, ring_group=rg, **kwargs)
        out.backward(dout[:, mine].to(device, dtype))
        what = f"rank {rank} mesh {ring}x{ulysses} {layout} causal={causal} heads {hq}/{hkv}"
        check(out, out_ref[:, mine], f"out, {what}")
        (check_lse or check)(lse.transpose(1, 2), lse_ref[:, :, mine].transpose(1, 2), f"lse, {what}")
        for name, got, ref in (("dq", ql.grad, dq_ref), ("dk", kl.grad, dk_ref), ("dv", vl.grad, dv_ref)):
            check(got, ref[:, mine], f"{name}, {what}")


def _module_matches_the_function(rank, ring, ulysses):
    """TurboAttention with the groups (Megatron's [S, B, H, D] layout, zigzag shards) is
    flash_attn_usp_func, forward and backward."""
    from primus_turbo.pytorch.modules import TurboAttention

    ug, rg = attention_usp.mesh_groups(ring, ulysses)
    gen = torch.Generator().manual_seed(7 + rank)
    q, k, v = (torch.randn(4, 2, 8, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    module = TurboAttention(causal=True, ulysses_group=ug, ring_group=rg, layout="sbhd", seq_layout="zigzag")
    out = module(q, k, v)
    out.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = attention_usp.flash_attn_usp_func(*(t.transpose(0, 1) for t in (q, k, v)), causal=True,
                                            ulysses_group=ug, ring_group=rg, seq_layout="zigzag").transpose(0, 1)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, rtol=0, atol=0)


def _errors_that_need_groups(ring, ulysses):
    """Every rank raises the same error before any exchange (no rank left waiting)."""
    ug, rg = attention_usp.mesh_groups(ring, ulysses)
    x = torch.randn(1, 3, 4 * ulysses + 1, 8, dtype=torch.float64)
    if ulysses > 1:
        with pytest.raises(ValueError, match="not a multiple of the Ulysses"):
            attention_usp.flash_attn_usp_func(x, x, x, ulysses_group=ug, ring_group=rg)
    x = torch.randn(1, 3, 4 * ulysses, 8, dtype=torch.float64)
    if ring > 1:
        if ulysses % 2:
            with pytest.raises(ValueError, match="even number of tokens"):
                attention_usp.flash_attn_usp_func(x, x, x, ulysses_group=ug, ring_group=rg, seq_layout="zigzag")
        with pytest.raises(NotImplementedError, match="window_size"):
            attention_usp.flash_attn_usp_func(x, x, x, window_size=(2, 0), ulysses_group=ug, ring_group=rg)
        with pytest.raises(NotImplementedError, match="ring_group"):
            attention_usp.flash_attn_fp8_usp_func(x, x, x, ulysses_group=ug, ring_group=rg)
        cu = torch.tensor([0, 3], dtype=torch.int32)
        with pytest.raises(NotImplementedError, match="ring_group"):
            attention_usp.flash_attn_varlen_usp_func(x[0], x[0], x[0], cu, cu, 3, 3, ulysses_group=ug, ring_group=rg)
    with pytest.raises(TypeError, match="'k'"):
        attention_usp.flash_attn_usp_func(x, x.float(), x, ulysses_group=ug, ring_group=rg)
    with pytest.raises(ValueError, match="world size"):
        attention_usp.mesh_groups(ring * ulysses, 2)


@contextlib.contextmanager
def _process_group(rank, world, port, backend="gloo"):
    """This spawned process as rank ``rank`` of a new default group (NCCL: on GPU ``rank``)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    kwargs = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        kwargs["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(backend, rank=rank, world_size=world, **kwargs)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _use_reference_blocks():
    """The single-device calls replaced by the float64 reference: the CPU tests check the exchanges
    and the ring, not the kernels."""
    attention_usp.block_forward = ref_block_forward
    attention_usp.block_backward = ref_block_backward
    attention_usp.local_attention = lambda q, k, v, scale, wl, wr, det: ref_block_forward(q, k, v, scale, wl, wr, 0)
    attention_usp.local_varlen_attention = ref_varlen


def _exact(got, ref, what):
    torch.testing.assert_close(got.double(), ref.double(), rtol=1e-9, atol=1e-9, msg=what)


def _cpu_worker(rank, world, port, ring, ulysses):
    _use_reference_blocks()
    with _process_group(rank, world, port):
        # GQA, and fewer K/V heads than Ulysses ranks (MQA; 2 heads over 4 ranks): repeated first.
        cases = [(False, 8, 8, 6), (True, 8, 4, 10), (True, 16, 4, 4), (True, 8, 1, 4), (False, 8, 2, 2)]
        _run_cases(rank, world, ring, ulysses, torch.device("cpu"), torch.float64, cases, _exact)
        _module_matches_the_function(rank, ring, ulysses)
        _errors_that_need_groups(ring, ulysses)


@pytest.mark.parametrize("ring,ulysses", [(2, 2), (4, 1), (1, 4)])
def test_usp_exchanges_and_ring_on_cpu(ring, ulysses):
    import torch.multiprocessing as mp

    mp.spawn(_cpu_worker, args=(ring * ulysses, _free_port(), ring, ulysses), nprocs=ring * ulysses, join=True)


def ref_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, deterministic):
    """Per-sequence float64 reference of a packed batch: (out [T, H, Dv], lse [H, T])."""
    outs, lses = [], []
    for i in range(len(cu_q) - 1):
        (a, b), (c, d) = cu_q[i:i + 2].tolist(), cu_k[i:i + 2].tolist()
        o, lse = ref_block_forward(q[None, a:b], k[None, c:d], v[None, c:d], scale, wl, wr, 0)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def _run_varlen(rank, ulysses, device, dtype, check, total, lens, hq, hkv, d):
    """Packed documents crossing the ranks' shares, causal, GQA: out, lse and grads of this rank's
    tokens against the whole batch's reference."""
    ug, rg = attention_usp.mesh_groups(1, ulysses)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    assert cu[-1] == total
    gen = torch.Generator().manual_seed(99)
    q, k, v, dout = (torch.randn(total, h, d, generator=gen, dtype=torch.float64) for h in (hq, hkv, hkv, hq))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    out_ref, lse_ref = ref_varlen(*full, cu, cu, max(lens), max(lens), d ** -0.5, -1, 0, False)
    out_ref.backward(dout)
    t_local = total // ulysses
    mine = slice(rank * t_local, (rank + 1) * t_local)
    ql, kl, vl = (t[mine].to(device, dtype).requires_grad_() for t in (q, k, v))
    cu_dev = cu.to(device)
    out, lse = attention_usp.flash_attn_varlen_usp_func(ql, kl, vl, cu_dev, cu_dev, max(lens), max(lens), causal=True,
                                                        return_lse=True, ulysses_group=ug, ring_group=rg)
    out.backward(dout[mine].to(device, dtype))
    what = f"varlen rank {rank} of {ulysses}"
    check(out, out_ref.detach()[mine], f"out, {what}")
    check(lse, lse_ref.detach()[:, mine], f"lse, {what}")
    for name, got, ref in (("dq", ql.grad, full[0].grad), ("dk", kl.grad, full[1].grad), ("dv", vl.grad, full[2].grad)):
        check(got, ref[mine], f"{name}, {what}")


def _varlen_cpu_worker(rank, world, port):
    _use_reference_blocks()
    with _process_group(rank, world, port):
        _run_varlen(rank, world, torch.device("cpu"), torch.float64, _exact, 40, [5, 12, 13, 10], 8, 4, 8)


def test_varlen_usp_over_ulysses_on_cpu():
    import torch.multiprocessing as mp

    mp.spawn(_varlen_cpu_worker, args=(4, _free_port()), nprocs=4, join=True)


def _compile_cpu_worker(rank, world, port):
    _use_reference_blocks()
    with _process_group(rank, world, port):
        ug, rg = attention_usp.mesh_groups(world, 1)
        gen = torch.Generator().manual_seed(rank)
        q, k, v = (torch.randn(1, 4, 2, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))

        def f(q, k, v):
            return attention_usp.flash_attn_usp_func(q, k, v, causal=True, ulysses_group=ug, ring_group=rg) * 2

        eager = f(q, k, v)
        eager.sum().backward()
        grads = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        compiled = torch.compile(f)(q, k, v)
        compiled.sum().backward()
        torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)
        for got, t in zip(grads, (q, k, v)):
            torch.testing.assert_close(t.grad, got, rtol=1e-12, atol=1e-12)


def test_usp_under_torch_compile_on_cpu():
    """torch.compile of a function calling it (graph breaks at the exchanges): eager's result."""
    import torch.multiprocessing as mp

    mp.spawn(_compile_cpu_worker, args=(2, _free_port()), nprocs=2, join=True)


def _gpu_worker(rank, world, port, ring, ulysses, fp8=False, varlen=False):
    from turbo_test_utils import snr_db

    with _process_group(rank, world, port, "nccl"):
        gate = 20.0 if fp8 else 40.0  # ACCURACY.md: FP8 attention 20 dB, bf16 40 dB

        def check(got, ref, what):
            db = snr_db(got.float().cpu(), ref)
            assert db >= gate, f"{what}: {db:.1f} dB"

        if varlen:
            _run_varlen(rank, world, torch.device("cuda", rank), torch.bfloat16, check, 1024, [100, 257, 243, 424],
                        8, 2, 64)
            return
        cases = [(False, 8, 8, 256), (True, 8, 2, 384), (True, 16, 4, 128), (True, 8, 1, 128)]

        def check_lse(got, ref, what):  # a large, nearly constant offset: an SNR would flatter it
            torch.testing.assert_close(got.double().cpu(), ref, rtol=0, atol=0.25 if fp8 else 0.02, msg=what)

        fn = attention_usp.flash_attn_fp8_usp_func if fp8 else None
        layouts = ("contiguous",) if fp8 else ("contiguous", "zigzag")
        _run_cases(rank, world, ring, ulysses, torch.device("cuda", rank), torch.bfloat16, cases, check, fn, layouts,
                   check_lse)


def _gpu_meshes():
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    meshes = [(2, 1), (1, 2)] if n >= 2 else []
    return meshes + ([(2, 2), (4, 1)] if n >= 4 else [])


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_meshes(), reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("ring,ulysses", _gpu_meshes() or [(2, 1)])
def test_usp_on_gpus(ring, ulysses):
    import torch.multiprocessing as mp

    mp.spawn(_gpu_worker, args=(ring * ulysses, _free_port(), ring, ulysses), nprocs=ring * ulysses, join=True)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_meshes(), reason="needs 2 CUDA GPUs")
def test_fp8_usp_over_ulysses_on_gpus():
    import torch.multiprocessing as mp

    mp.spawn(_gpu_worker, args=(2, _free_port(), 1, 2, True), nprocs=2, join=True)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_meshes(), reason="needs 2 CUDA GPUs")
def test_varlen_usp_over_ulysses_on_gpus():
    import torch.multiprocessing as mp

    mp.spawn(_gpu_worker, args=(2, _free_port(), 1, 2, False, True), nprocs=2, join=True)


def test_bad_arguments_name_what_is_wrong():
    q = torch.randn(1, 8, 4, 8)
    with pytest.raises(ValueError, match="'k'"):
        attention_usp.flash_attn_usp_func(q, torch.randn(8, 4, 8), q)
    with pytest.raises(ValueError, match="share B and S"):
        attention_usp.flash_attn_usp_func(q, torch.randn(1, 9, 4, 8), torch.randn(1, 9, 4, 8))
    with pytest.raises(TypeError, match="ulysses_group"):
        attention_usp.flash_attn_usp_func(q, q, q, ulysses_group="world")
    with pytest.raises(NotImplementedError, match="dropout"):
        attention_usp.flash_attn_usp_func(q, q, q, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="dropout"):
        attention_usp.flash_attn_fp8_usp_func(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="seq_layout"):
        attention_usp.flash_attn_usp_func(q, q, q, seq_layout="striped")
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="3-D"):
        attention_usp.flash_attn_varlen_usp_func(q, q, q, cu, cu, 8, 8)


def test_shard_positions_cover_the_sequence_once():
    for ring, ulysses, layout in ((1, 4, "zigzag"), (2, 2, "zigzag"), (4, 1, "zigzag"), (2, 2, "contiguous")):
        shards = [attention_usp.shard_positions(48, ring, r, ulysses, u, layout)
                  for r in range(ring) for u in range(ulysses)]
        assert all(len(p) == 48 // (ring * ulysses) for p in shards)
        assert torch.equal(torch.sort(torch.cat(shards)).values, torch.arange(48))
    # zigzag, ring of 2: position 0 holds chunks 0 and 3 of 4, position 1 chunks 1 and 2
    assert attention_usp.shard_positions(8, 2, 0, seq_layout="zigzag").tolist() == [0, 1, 6, 7]
    assert attention_usp.shard_positions(8, 2, 1, 2, 1, "zigzag").tolist() == [4, 5]
    with pytest.raises(ValueError, match="equal parts"):
        attention_usp.shard_positions(20, 4, 0, seq_layout="zigzag")
