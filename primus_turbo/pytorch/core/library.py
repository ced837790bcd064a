"""The ``primus_turbo`` torch operator namespace, shared by every op.

Native ops are declared and implemented in C++ (csrc/bindings/torch); Python gives them their fake
implementation (``register_fake``). The ops still implemented in Python are declared with explicit
schemas and given a CUDA kernel and a fake implementation (``define``), leaner per call than
``torch.library.custom_op``. Autograd is each op's ``autograd.Function``, which dynamo traces.
"""

import torch

# A fragment: the native ops (csrc/bindings/torch) declare the same namespace from C++.
LIB = torch.library.Library("primus_turbo", "FRAGMENT")


def define(schema: str, cuda_impl, fake_impl) -> torch._ops.OpOverload:
    """Declares ``primus_turbo::<name>`` with its CUDA kernel and fake implementation; returns the
    op to call."""
    name = schema.split("(", 1)[0]
    LIB.define(schema)
    LIB.impl(name, cuda_impl, "CUDA")
    torch.library.register_fake(f"primus_turbo::{name}", fake_impl, lib=LIB)
    return getattr(torch.ops.primus_turbo, name).default


def placeholder(like: torch.Tensor) -> torch.Tensor:
    """The empty uint8 tensor a native op returns for an output not asked for (a gradient, a saved
    copy), as its fake implementation states it."""
    return like.new_empty((0,), dtype=torch.uint8)


def register_fake(name: str, fake_impl) -> None:
    """Gives a native op (declared and implemented in C++) its fake implementation: shapes and the
    argument checks under tracing, meta and fake tensors."""
    torch.library.register_fake(f"primus_turbo::{name}", fake_impl, lib=LIB)


def _direct_ok(args) -> bool:
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    if torch._C._is_torch_function_mode_enabled():
        return False
    for x in args:
        if isinstance(x, torch.Tensor) and (type(x) is not torch.Tensor or not x.is_cuda):
            return False
    return True


def eager_call(op: torch._ops.OpOverload, cuda_impl):
    """A callable for ``op`` that, in plain eager execution (real CUDA tensors, not tracing, no
    dispatch or function mode active), runs its CUDA implementation directly: the dispatcher's
    round trip into Python costs more than a short kernel. Anything else goes through ``op``."""

    def call(*args):
        return cuda_impl(*args) if _direct_ok(args) else op(*args)

    call.__name__ = f"{op.__name__}_call"
    return call


def define_op(schema: str, cuda_impl, fake_impl):
    """``define`` + ``eager_call``: declares the op and returns what an autograd function calls."""
    return eager_call(define(schema, cuda_impl, fake_impl), cuda_impl)
