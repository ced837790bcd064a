"""LayerNorm benchmark: turbo.ops.layernorm against torch eager and torch.compile of the same math
(float32 statistics, output in the input's dtype), forward and backward, on the hidden sizes of the
model tables (config.gen_norm_test_cases); the engine is membound.py.

    python benchmark/ops/bench_layernorm.py --dtype bf16 [--quick]

Bytes counted once: forward x, gamma, beta, y, mean, rstd; backward x, dy, gamma, mean, rstd, dx,
dgamma, dbeta. Summary entries layernorm_fwd, layernorm_bwd. Exits 1 if a case failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_rmsnorm as rms  # noqa: E402
import membound as mb  # noqa: E402

EPS = 1e-5


def torch_layernorm(x, gamma, beta):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    return ((xf - mean) * torch.rsqrt(var + EPS) * gamma.float() + beta.float()).to(x.dtype)


def make(case, dtype):
    x = (torch.randn(case.tokens, case.hidden, device="cuda") + 1.0).to(dtype).requires_grad_()
    g = (1.0 + 0.1 * torch.randn(case.hidden, device="cuda")).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(case.hidden, device="cuda")).to(dtype).requires_grad_()
    return mb.Inputs((x, g, b), (x, g, b), (torch.randn_like(x),))


def reference(inp):
    x, g, b = (t.detach().double().requires_grad_() for t in inp.args)
    y = torch.nn.functional.layer_norm(x, x.shape[-1:], g, b, EPS)
    return (y.detach(), *torch.autograd.grad(y, (x, g, b), inp.douts[0].double()))


OPS = {
    "layernorm": mb.OpBench(
        "layernorm",
        make,
        lambda x, g, b: mb.turbo().ops.layernorm(x, g, b, EPS),
        torch_layernorm,
        reference,
        fwd_bytes=lambda c, es: 2 * c.tokens * c.hidden * es + 2 * c.hidden * es + 8 * c.tokens,
        bwd_bytes=lambda c, es: 3 * c.tokens * c.hidden * es + 3 * c.hidden * es + 8 * c.tokens,
        names=("y", "dx", "dgamma", "dbeta"),
    ),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_layernorm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    return mb.main(OPS, p, rms.norm_cases, rms.describe, "{Case} T={Tokens} H={Hidden}", argv)


if __name__ == "__main__":
    sys.exit(main())
