"""Every FP8 grouped GEMM configuration timed on the MoE layers of the end-to-end benchmark: the
forward and dgrad calls of one expert stack's training step, under autotune, with each
candidate's time printed (the autotune's own measurement, GEMM kernel and its setup only).

    python tools/grouped_fp8_config_probe.py                      # Qwen3-30B-A3B dims, 8192 tokens, top-8
    python tools/grouped_fp8_config_probe.py --granularity tensorwise --balanced

A new configuration or default heuristic in ``csrc/ops/grouped_gemm/grouped_gemm_fp8.cpp`` is
judged here before it reaches the end-to-end step.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--tokens", type=int, default=8192, help="tokens per step before routing")
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768, help="expert intermediate size")
    p.add_argument("--granularity", choices=("tensorwise", "rowwise", "blockwise"), default="blockwise")
    p.add_argument("--balanced", action="store_true", help="equal tokens per expert (else a skewed routing)")
    p.add_argument("--fast-accum", action="store_true", help="Float8QuantConfig(fast_accum=True) (ROWWISE forward)")
    args = p.parse_args(argv)

    os.environ["PRIMUS_TURBO_AUTO_TUNE"] = "1"
    import torch

    if not torch.cuda.is_available():
        print("grouped_fp8_config_probe: needs a CUDA device", file=sys.stderr)
        return 1
    import primus_turbo.pytorch as turbo
    from primus_turbo._core import lib
    from primus_turbo.pytorch.core import autotune
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity

    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import GroupedGemmFp8Problem

    def config_name(problem, backend, config):
        """The FP8 kernel's or (the bf16 wgrad) the bf16 grouped kernel's name of a candidate."""
        fp8 = isinstance(problem, GroupedGemmFp8Problem)
        name_fn = lib.pt_grouped_gemm_fp8_config_name if fp8 else lib.pt_grouped_gemm_config_name
        buf = ctypes.create_string_buffer(256)
        name_fn(problem.ref, backend.value, config, buf, 256)
        return buf.value.decode()

    profile = autotune._profile

    def printing_profile(problem, candidates):
        times = profile(problem, candidates)
        print(f"  {problem.key()}")
        for (backend, config), ms in zip(candidates, times):
            print(f"    config {config} {config_name(problem, backend, config):<28} {ms * 1e3:9.1f} us")
        return times

    autotune._profile = printing_profile
    autotune._lookup = lambda key: None  # measure every problem, whatever an earlier run stored

    torch.manual_seed(0)
    g, rows = args.experts, args.tokens * args.topk
    if args.balanced:
        lens = torch.full((g,), rows // g, dtype=torch.int64)
        lens[: rows - int(lens.sum())] += 1
    else:  # a router's skew: expert popularity drawn from a log-normal
        probs = torch.exp(torch.randn(g) * 0.5)
        lens = torch.bincount(torch.multinomial(probs / probs.sum(), rows, replacement=True), minlength=g)
    print(f"{g} experts, {rows} routed tokens, tokens per expert {int(lens.min())}..{int(lens.max())}")
    lens = lens.cuda()
    gran = ScalingGranularity[args.granularity.upper()]
    cfg = Float8QuantConfig(format=Format.HYBRID, granularity=gran,
                            block_size=128 if gran == ScalingGranularity.BLOCKWISE else None, fast_accum=args.fast_accum)
    layers = {"gate_up": (2 * args.inter, args.hidden), "down": (args.hidden, args.inter)}
    for name, (n, k) in layers.items():
        print(f"{name}: N={n} K={k}")
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5).requires_grad_()
        out = turbo.ops.grouped_gemm_fp8(x, w, lens, trans_b=True, config=cfg)
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
