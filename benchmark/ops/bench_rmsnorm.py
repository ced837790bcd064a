"""RMSNorm benchmark: turbo.ops.rmsnorm and turbo.ops.rmsnorm_residual against torch eager and
torch.compile of the same math, forward and backward, on the hidden sizes of the model tables
(config.gen_norm_test_cases). The engine (correctness first, CUDA-graph timing, effective
bandwidth against the copy bandwidth, CSV and summary entries) is membound.py.

    python benchmark/ops/bench_rmsnorm.py --dtype bf16
    python benchmark/ops/bench_rmsnorm.py --ops rmsnorm_residual --tokens 8192 --models Llama-3.1-8B
    python benchmark/ops/bench_rmsnorm.py --quick

Bytes counted once: rmsnorm forward x, gamma, y, rstd; backward x, dy, gamma, rstd, dx, dgamma.
rmsnorm_residual forward x, residual, gamma, y, x + residual, rstd; backward dy, d(x + residual),
x + residual, gamma, rstd, dx (= dresidual, one tensor), dgamma. Summary entries rmsnorm_fwd,
rmsnorm_bwd, rmsnorm_residual_fwd, rmsnorm_residual_bwd.

rmsnorm_fp8 / rmsnorm_fp8_1x128: rmsnorm with the output quantized to FP8 E4M3 in the same pass
(rowwise / 1x128 scales, no bf16 output), forward only: bytes x, gamma, q, scales, rstd; checked
bit-exact against rmsnorm + quantize_fp8; summary entries rmsnorm_fp8_fwd, rmsnorm_fp8_1x128_fwd
with ratio_geomean against that unfused chain and ratio_vs_compiled_geomean against torch.compile.
Exits 1 if a case failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import config as cfg  # noqa: E402
import membound as mb  # noqa: E402

EPS = 1e-6


def torch_rmsnorm(x, gamma):
    """The same math in plain torch: float32 statistics, output in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * gamma.float()).to(x.dtype)


def torch_rmsnorm_residual(x, residual, gamma):
    s = x + residual
    return torch_rmsnorm(s, gamma), s


def ref_rmsnorm(s64, g64):
    return s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + EPS) * g64


def _leaf(t):
    return t.detach().double().requires_grad_()


def make_rmsnorm(case, dtype):
    x = torch.randn(case.tokens, case.hidden, device="cuda", dtype=dtype).requires_grad_()
    g = (1.0 + 0.1 * torch.randn(case.hidden, device="cuda")).to(dtype).requires_grad_()
    return mb.Inputs((x, g), (x, g), (torch.randn_like(x),))


def reference_rmsnorm(inp):
    x, g = map(_leaf, inp.args)
    y = ref_rmsnorm(x, g)
    return (y.detach(), *torch.autograd.grad(y, (x, g), inp.douts[0].double()))


def make_residual(case, dtype):
    x = torch.randn(case.tokens, case.hidden, device="cuda", dtype=dtype).requires_grad_()
    r = torch.randn_like(x).requires_grad_()
    g = (1.0 + 0.1 * torch.randn(case.hidden, device="cuda")).to(dtype).requires_grad_()
    return mb.Inputs((x, r, g), (x, r, g), (torch.randn_like(x), torch.randn_like(x)))


def reference_residual(inp):
    x, r, g = inp.args
    s = (x + r).detach()
    s64, g64 = _leaf(s), _leaf(g)
    y = ref_rmsnorm(s64, g64)
    ds, dg = torch.autograd.grad(y, (s64, g64), inp.douts[0].double())
    ds = ds + inp.douts[1].double()
    return y.detach(), s.double(), ds, ds, dg


OPS = {
    "rmsnorm": mb.OpBench(
        "rmsnorm",
        make_rmsnorm,
        lambda x, g: mb.turbo().ops.rmsnorm(x, g, EPS),
        torch_rmsnorm,
        reference_rmsnorm,
        fwd_bytes=lambda c, es: 2 * c.tokens * c.hidden * es + c.hidden * es + 4 * c.tokens,
        bwd_bytes=lambda c, es: 3 * c.tokens * c.hidden * es + 2 * c.hidden * es + 4 * c.tokens,
        names=("y", "dx", "dgamma"),
    ),
    "rmsnorm_residual": mb.OpBench(
        "rmsnorm_residual",
        make_residual,
        lambda x, r, g: mb.turbo().ops.rmsnorm_residual(x, r, g, EPS),
        torch_rmsnorm_residual,
        reference_residual,
        fwd_bytes=lambda c, es: 4 * c.tokens * c.hidden * es + c.hidden * es + 4 * c.tokens,
        bwd_bytes=lambda c, es: 4 * c.tokens * c.hidden * es + 2 * c.hidden * es + 4 * c.tokens,
        names=("y", "x+residual", "dx", "dresidual", "dgamma"),
    ),
}


def _fp8_op(block: int):
    """rmsnorm with its output quantized to FP8 E4M3 (rowwise, or 1x128 blocks) in the same pass;
    forward only, against rmsnorm + quantize_fp8 and torch.compile of the same math."""
    config = mb.fp8_config(block)

    def make(case, dtype):
        x = torch.randn(case.tokens, case.hidden, device="cuda", dtype=dtype)
        return x, (1.0 + 0.1 * torch.randn(case.hidden, device="cuda")).to(dtype)

    return mb.Fp8FwdBench(
        "rmsnorm_fp8" + ("" if block == 0 else f"_1x{block}"),
        make,
        lambda x, g: mb.turbo().ops.rmsnorm_fp8(x, g, EPS, config=config),
        lambda x, g: mb.quantize_fp8_unfused(mb.turbo().ops.rmsnorm(x, g, EPS), block),
        lambda x, g: mb.torch_quantize_fp8(torch_rmsnorm(x, g), block),
        lambda x, g: ref_rmsnorm(x.double(), g.double()),
        lambda q, s: mb.fp8_dequantize(q, s, block),
        # x, gamma, q and its scales, rstd
        fwd_bytes=lambda c, es: c.tokens * c.hidden * es + c.hidden * es + mb.fp8_bytes(c.tokens, c.hidden, block)
        + 4 * c.tokens,
    )


OPS.update({op.name: op for op in (_fp8_op(0), _fp8_op(128))})


def norm_cases(args):
    if args.quick:
        args.models = args.models or ["Llama-3.1-8B"]
        args.tokens = args.tokens or [8192]
    args.tokens = args.tokens or list(cfg.NORM_TOKENS)
    return cfg.gen_norm_test_cases(args.tokens, args.models)


def describe(case):
    return {"Case": case.name, "Tokens": case.tokens, "Hidden": case.hidden}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_rmsnorm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    return mb.main(OPS, p, norm_cases, describe, "{Case} T={Tokens} H={Hidden}", argv)


if __name__ == "__main__":
    sys.exit(main())
