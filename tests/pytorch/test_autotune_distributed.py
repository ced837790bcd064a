"""Autotune under torch.distributed: every rank ends with the same GEMM choice, both when the ranks
profile together and when their on-disk caches disagree (rank 0's entry wins). Needs 2 GPUs."""

import json
import os
import socket

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ["PRIMUS_TURBO_AUTOTUNE_CACHE_FILE"] = os.path.join(tmp, f"autotune_rank{rank}.tsv")
    import torch.distributed as dist

    from primus_turbo.pytorch.core import autotune
    from primus_turbo.pytorch.core.backend import BackendType
    from primus_turbo.pytorch.ops.gemm import GemmProblem

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:

        class CublasLtOnly(GemmProblem):  # cuBLASLt's candidates need no kernel compilation
            backends = (BackendType.CUBLASLT,)

        device = torch.device("cuda", rank)
        a = torch.randn(512, 768, device=device, dtype=torch.bfloat16)
        b = torch.randn(768, 1024, device=device, dtype=torch.bfloat16)
        out = torch.empty(512, 1024, device=device, dtype=torch.bfloat16)
        problem = CublasLtOnly(a, b, out, False, False, 0.0)
        key = f"{problem.op.name}|{autotune.gpu_name(device)}|{problem.key()}"

        profiled = autotune.tune(problem, device)  # no cache anywhere: the ranks profile together

        # Make the caches disagree: rank 1 remembers another candidate, then both decide again.
        candidates = autotune._candidates(problem)
        if rank == 1:
            other = next(c for c in candidates if c != profiled)
            autotune.check(autotune.lib.pt_autotune_store(key.encode(), autotune._encode(other).encode()))
        autotune._decided.clear()
        dist.barrier()
        from_cache = autotune.tune(problem, device)
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump({"profiled": autotune._encode(profiled), "from_cache": autotune._encode(from_cache),
                       "candidates": len(candidates)}, f)
    finally:
        dist.destroy_process_group()


def test_ranks_agree_on_autotune_choice(tmp_path):
    import torch.multiprocessing as mp

    world = 2
    mp.spawn(_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert results[0]["candidates"] >= 2, "cuBLASLt offered a single candidate: nothing to disagree on"
    assert len({r["profiled"] for r in results}) == 1, results
    # Rank 0's cached entry wins over rank 1's different one.
    assert all(r["from_cache"] == results[0]["profiled"] for r in results), results
