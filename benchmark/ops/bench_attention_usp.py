"""Context-parallel attention benchmark: turbo.ops.flash_attn_usp_func over every (ring x Ulysses)
mesh of the ranks, against one GPU running the whole sequence with flash_attn_func.

    torchrun --nproc_per_node 4 benchmark/ops/bench_attention_usp.py
    torchrun --nproc_per_node 2 benchmark/ops/bench_attention_usp.py --seqlens 32768 --heads 32 8

Ring meshes run with contiguous shards and with the load-balanced zigzag order (seq_layout).
Per mesh and case: forward and forward+backward milliseconds (CUDA events, median, the slowest
rank), and the scaling efficiency ``t_single / (N * t_cp)``: 1.0 means the N GPUs split the single
GPU's time perfectly. The single-GPU time is measured on rank 0 alone with the whole sequence.
Correctness first: rank shards of the CP output against the single-GPU output (bf16 gate, 40 dB).
Writes <output-dir>/<gpu>/attn_usp.csv (rank 0).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

if __package__:
    from . import bench_utils as bu
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_utils as bu  # type: ignore[no-redef]


def _meshes(world: int):
    """(ring, ulysses, seq_layout) with ring * ulysses == world; zigzag where there is a ring."""
    pairs = [(world // u, u) for u in range(1, world + 1) if world % u == 0]
    return [(r, u, lay) for r, u in pairs for lay in (("contiguous", "zigzag") if r > 1 else ("contiguous",))]


def _time(fn, warmup: int = 3, iters: int = 20) -> float:
    """Median ms per call with CUDA events; a fixed number of calls on every rank (the collectives
    inside must line up, so no adaptive warm-up)."""
    for _ in range(warmup):
        fn()
    starts, ends = ([torch.cuda.Event(enable_timing=True) for _ in range(iters)] for _ in range(2))
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in zip(starts, ends))[iters // 2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqlens", nargs="+", type=int, default=[16384, 65536], help="whole sequence lengths")
    p.add_argument("--heads", nargs=2, type=int, default=[32, 8], metavar=("HQ", "HKV"))
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    args = p.parse_args(argv)

    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.ops.attention_usp import mesh_groups, shard_positions

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    hq, hkv, d, b = *args.heads, args.head_dim, args.batch
    rows = []
    meshes = [(m, mesh_groups(*m[:2])) for m in _meshes(world)]  # every rank creates every group, in order
    for seqlen in args.seqlens:
        for causal in (True, False):
            gen = torch.Generator(device=device).manual_seed(seqlen + causal)
            q, k, v, dout = (torch.randn(b, seqlen, h, d, generator=gen, device=device, dtype=torch.bfloat16)
                             for h in (hq, hkv, hkv, hq))
            single = {}
            if rank == 0:
                qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
                ref = turbo.ops.flash_attn_func(qs, ks, vs, causal=causal)
                single["fwd"] = _time(lambda: turbo.ops.flash_attn_func(qs, ks, vs, causal=causal))
                single["step"] = _time(
                    lambda: turbo.ops.flash_attn_func(qs, ks, vs, causal=causal).backward(dout))
                ref = ref.detach()
            else:
                ref = torch.empty_like(q)
            dist.broadcast(ref, 0)
            for (ring, ulysses, layout), (ug, rg) in meshes:
                mine = shard_positions(seqlen, ring, rank // ulysses, ulysses, rank % ulysses, layout).to(device)
                ql, kl, vl = (t[:, mine].contiguous().requires_grad_() for t in (q, k, v))
                dl = dout[:, mine].contiguous()

                def fwd():
                    return turbo.ops.flash_attn_usp_func(ql, kl, vl, causal=causal, ulysses_group=ug, ring_group=rg,
                                                         seq_layout=layout)

                out = fwd()
                snr = bu.snr_db(out.float(), ref[:, mine].float())
                t_fwd = _time(fwd)
                t_step = _time(lambda: fwd().backward(dl))
                t = torch.tensor([t_fwd, t_step, -snr], device=device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank, the worst SNR
                t_fwd, t_step, snr = t[0].item(), t[1].item(), -t[2].item()
                if rank == 0:
                    row = {
                        "mesh": f"{ring}x{ulysses}", "ring": ring, "ulysses": ulysses, "seq_layout": layout,
                        "seqlen": seqlen,
                        "causal": causal, "heads": f"{hq}/{hkv}", "head_dim": d, "batch": b,
                        "check": "PASS" if snr >= 40.0 else "FAIL", "out_snr_db": snr,
                        "cp_fwd_ms": t_fwd, "cp_step_ms": t_step,
                        "single_fwd_ms": single["fwd"], "single_step_ms": single["step"],
                        "fwd_efficiency": single["fwd"] / (world * t_fwd),
                        "step_efficiency": single["step"] / (world * t_step),
                    }
                    rows.append(row)
                    print(f"{row['mesh']:>5} {layout:<10} S={seqlen:<6} causal={causal!s:<5} {row['check']} "
                          f"{snr:5.1f} dB  fwd {t_fwd:7.3f} ms ({row['fwd_efficiency']:.2f})  step {t_step:7.3f} ms "
                          f"({row['step_efficiency']:.2f})  single {single['fwd']:.3f} / {single['step']:.3f} ms",
                          flush=True)
    if rank == 0 and rows:
        gpu = bu.gpu_short_name()
        stamp = bu.run_stamp(gpu)
        rows = [{**stamp, "gpus": world, **r} for r in rows]
        path = bu.write_csv(bu.results_dir_for(args.output_dir, gpu) / "attn_usp.csv", rows, list(rows[0]))
        print(f"wrote {path}")
    dist.destroy_process_group()
    return 0 if all(r["check"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
