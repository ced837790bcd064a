"""The ``primus_turbo`` torch operator namespace, shared by every op.

Ops are declared with explicit schemas and given a CUDA kernel and a fake (meta) implementation.
This is leaner per call than ``torch.library.custom_op`` (no Python autograd and aliasing layers
around each call); autograd is each op's ``autograd.Function``, which dynamo traces.
"""

import torch

LIB = torch.library.Library("primus_turbo", "DEF")


def define(schema: str, cuda_impl, fake_impl) -> torch._ops.OpOverload:
    """Declares ``primus_turbo::<name>`` with its CUDA kernel and fake implementation; returns the
    op to call."""
    name = schema.split("(", 1)[0]
    LIB.define(schema)
    LIB.impl(name, cuda_impl, "CUDA")
    torch.library.register_fake(f"primus_turbo::{name}", fake_impl, lib=LIB)
    return getattr(torch.ops.primus_turbo, name).default
