"""Where the host time of a training step of the end-to-end benchmark's model goes: the step
(forward, backward, optimizer) under torch.profiler, after warm-up steps, with the CPU-side
operators sorted by self time and the CUDA runtime calls that can stall the host (synchronizations,
allocations) counted.

    python tools/profile_train_step_host.py --arch moe --variant turbo_fp8_blockwise --optimizer turbo \\
        --fp8-weight-cache experts
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmark" / "e2e"))
sys.path.insert(0, str(REPO / "benchmark" / "ops"))
import bench_train_step as bts  # noqa: E402
import config as cfg  # noqa: E402
from model import Stack, rope_tables  # noqa: E402


def add_step_arguments(p: argparse.ArgumentParser, arch: str, variant: str) -> None:
    """The model and step arguments shared with tools/step_gaps.py."""
    p.add_argument("--arch", choices=("dense", "moe"), default=arch)
    p.add_argument("--variant", default=variant)
    p.add_argument("--optimizer", choices=("torch", "turbo"), default="turbo")
    p.add_argument("--fp8-weight-cache", nargs="?", const="all", default=None, choices=("all", "experts"),
                   help="as bench_train_step.py's: every FP8 layer (all, the default when given) or the expert stacks")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=8192)


def make_step(args):
    """(forward+backward, optimizer step) closures of the end-to-end benchmark's model for ``args``
    (add_step_arguments), on the GPU, as bench_train_step.py builds the variant."""
    m = (cfg.DENSE_MODELS if args.arch == "dense" else cfg.MOE_MODELS)[
        "Llama-3.1-8B" if args.arch == "dense" else "Qwen3-30B-A3B"]
    seq = min(getattr(m, "seq", 4096), args.tokens)
    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(1234)
    with device:
        base = Stack(m, args.layers, args.arch).to(dtype=dtype).state_dict()
    model, step_model = bts.build(args.variant, base, m, args.layers, args.arch, device, dtype, args.fp8_weight_cache)
    if args.optimizer == "turbo":
        import primus_turbo.pytorch as turbo

        opt = turbo.optim.FusedAdamW(model.parameters(), lr=2e-5)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    x = torch.randn(args.tokens // seq, seq, m.hidden, device=device, dtype=dtype)
    target = torch.randn_like(x)
    cos, sin = rope_tables(seq, model.rope_dim, device)

    def fwd_bwd():
        F.mse_loss(step_model(x, cos, sin).float(), target.float()).backward()

    def optimizer_step():
        opt.step()
        opt.zero_grad(set_to_none=True)

    return fwd_bwd, optimizer_step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(p, "moe", "turbo_fp8_blockwise")
    p.add_argument("--rows", type=int, default=25)
    args = p.parse_args()
    fwd_bwd, optimizer_step = make_step(args)

    def step():
        fwd_bwd()
        optimizer_step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows)
    print(table)
    stalls = [e for e in prof.key_averages() if any(w in e.key for w in ("Synchronize", "Malloc", "Free", "Memcpy",
                                                                          "item", "_local_scalar_dense"))]
    for e in stalls:
        print(f"  {e.key}: {e.count // 3} a step, {e.self_cpu_time_total / 3e3:.2f} ms a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
