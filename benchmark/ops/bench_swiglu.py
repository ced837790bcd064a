"""Gated activation benchmark: turbo.ops.swiglu / geglu and their MoE variants with routing
probabilities (swiglu_with_probs / geglu_with_probs, no row mask) against torch eager and
torch.compile of the same math (float32 arithmetic, output in the input's dtype), forward and
backward, on the MLP intermediate sizes of the dense and MoE model tables
(config.gen_activation_test_cases); the engine is membound.py.

    python benchmark/ops/bench_swiglu.py --dtype bf16 [--quick] [--ops swiglu geglu_probs]

Bytes counted once ([T, 2I] input, [T, I] output): forward x, out (+ probs); backward x, dy, dx
(+ probs, dprobs). Summary entries swiglu_fwd, swiglu_bwd, geglu_*, swiglu_probs_*,
geglu_probs_*.

swiglu_fp8 / swiglu_fp8_1x128: swiglu with the output quantized to FP8 E4M3 in the same pass
(rowwise / 1x128 scales, no bf16 output), forward only: bytes x, q, scales; checked bit-exact
against swiglu + quantize_fp8; summary entries swiglu_fp8_fwd, swiglu_fp8_1x128_fwd with
ratio_geomean against that unfused chain and ratio_vs_compiled_geomean against torch.compile.
Exits 1 if a case failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import config as cfg  # noqa: E402
import membound as mb  # noqa: E402

ACTS = {"swiglu": F.silu, "geglu": lambda g: F.gelu(g, approximate="none")}


def torch_math(act, with_probs):
    f = ACTS[act]

    def fn(x, probs=None):
        gate, up = x.float().chunk(2, dim=-1)
        out = f(gate) * up
        if with_probs:
            out = out * probs.unsqueeze(-1)
        return out.to(x.dtype)

    return fn


def ours(act, with_probs):
    if with_probs:
        return lambda x, p: getattr(mb.turbo().ops, act + "_with_probs")(x, p, None)
    return lambda x: getattr(mb.turbo().ops, act)(x)


def make(with_probs):
    def fn(case, dtype):
        x = torch.randn(case.tokens, 2 * case.cols, device="cuda", dtype=dtype).requires_grad_()
        dy = torch.randn(case.tokens, case.cols, device="cuda", dtype=dtype)
        if not with_probs:
            return mb.Inputs((x,), (x,), (dy,))
        p = torch.rand(case.tokens, device="cuda").requires_grad_()
        return mb.Inputs((x, p), (x, p), (dy,))

    return fn


def reference(act, with_probs):
    f = ACTS[act]

    def fn(inp):
        leaves = tuple(t.detach().double().requires_grad_() for t in inp.args)
        gate, up = leaves[0].chunk(2, dim=-1)
        out = f(gate) * up
        if with_probs:
            out = out * leaves[1].unsqueeze(-1)
        return (out.detach(), *torch.autograd.grad(out, leaves, inp.douts[0].double()))

    return fn


def _op(act, with_probs):
    name = act + ("_probs" if with_probs else "")
    extra_f, extra_b = (4, 8) if with_probs else (0, 0)
    return mb.OpBench(
        name,
        make(with_probs),
        ours(act, with_probs),
        torch_math(act, with_probs),
        reference(act, with_probs),
        fwd_bytes=lambda c, es: 3 * c.tokens * c.cols * es + extra_f * c.tokens,
        bwd_bytes=lambda c, es: 5 * c.tokens * c.cols * es + extra_b * c.tokens,
        names=("out", "dx", "dprobs") if with_probs else ("out", "dx"),
    )


OPS = {op.name: op for op in (_op(a, p) for p in (False, True) for a in ACTS)}


def _fp8_op(block: int):
    """swiglu with its output quantized to FP8 E4M3 (rowwise, or 1x128 blocks) in the same pass;
    forward only, against swiglu + quantize_fp8 and torch.compile of the same math."""
    config = mb.fp8_config(block)
    plain = torch_math("swiglu", False)

    def make(case, dtype):
        return (torch.randn(case.tokens, 2 * case.cols, device="cuda", dtype=dtype),)

    def reference64(x):
        gate, up = x.double().chunk(2, dim=-1)
        return F.silu(gate) * up

    return mb.Fp8FwdBench(
        "swiglu_fp8" + ("" if block == 0 else f"_1x{block}"),
        make,
        lambda x: mb.turbo().ops.swiglu_fp8(x, config=config),
        lambda x: mb.quantize_fp8_unfused(mb.turbo().ops.swiglu(x), block),
        lambda x: mb.torch_quantize_fp8(plain(x), block),
        reference64,
        lambda q, s: mb.fp8_dequantize(q, s, block),
        fwd_bytes=lambda c, es: 2 * c.tokens * c.cols * es + mb.fp8_bytes(c.tokens, c.cols, block),  # x, q, scales
    )


OPS.update({op.name: op for op in (_fp8_op(0), _fp8_op(128))})


def activation_cases(args):
    if args.quick:
        args.models = args.models or ["Llama-3.1-8B", "DeepSeek-V3"]
        args.tokens = args.tokens or [8192]
    args.tokens = args.tokens or list(cfg.NORM_TOKENS)
    return cfg.gen_activation_test_cases(args.tokens, args.models)


def describe(case):
    return {"Case": case.name, "Tokens": case.tokens, "Cols": case.cols}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_swiglu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    return mb.main(OPS, p, activation_cases, describe, "{Case} T={Tokens} I={Cols}", argv)


if __name__ == "__main__":
    sys.exit(main())
