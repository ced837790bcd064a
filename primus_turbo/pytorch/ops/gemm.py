"""turbo.ops.gemm: dense GEMM, forward and backward, on cuBLASLt or our CUTLASS Hopper kernels."""

import ctypes
from typing import Optional, Tuple

import torch

from primus_turbo._core import PtTensor, check, lib
from primus_turbo._core.lib import string_out
from primus_turbo.pytorch.core import autotune, library, native
from primus_turbo.pytorch.core.backend import BackendType, OpFamily, PrecisionType
from primus_turbo.pytorch.core.tensor_bridge import (
    current_stream_handle,
    empty_like_pt,
    to_pt,
    workspace,
)
from primus_turbo.pytorch.ops._checks import (
    check_cuda_tensors,
    check_main_grad,
    check_main_grad_pattern,
    dummy_wgrad,
    flag,
)

__all__ = ["gemm"]

_GEMM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _gemm_shape(a, b, trans_a: bool, trans_b: bool, out_dtype) -> Tuple[int, int, torch.dtype]:
    """Validates arguments (no device work) and returns (m, n, out_dtype)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"gemm: argument '{name}' must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in _GEMM_DTYPES:
            raise TypeError(f"gemm: argument '{name}' has dtype {t.dtype}; expected float32, float16 or bfloat16")
    if b.dtype != a.dtype:
        raise TypeError(f"gemm: argument 'b' has dtype {b.dtype}; expected the dtype of 'a' ({a.dtype})")
    out_dtype = a.dtype if out_dtype is None else out_dtype
    if out_dtype not in _GEMM_DTYPES:
        raise TypeError(f"gemm: out_dtype {out_dtype} is not supported; expected float32, float16 or bfloat16")
    if a.dtype == torch.float32 and out_dtype != torch.float32:
        raise TypeError(f"gemm: out_dtype {out_dtype} is not supported for float32 inputs; expected float32")
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    if k != kb:
        raise ValueError(
            f"gemm: inner dimensions do not match: op(a) is [{m}, {k}] (a {tuple(a.shape)}, trans_a={trans_a}) "
            f"but op(b) is [{kb}, {n}] (b {tuple(b.shape)}, trans_b={trans_b})"
        )
    check_cuda_tensors("gemm", a=a, b=b)
    return m, n, out_dtype


class GemmProblem(autotune.TunableProblem):
    """One GEMM problem as the planner sees it: the core's descriptors of a, b and the output."""

    op = OpFamily.GEMM
    precision = PrecisionType.BF16_FP16_FP32
    default_backend = BackendType.CUBLASLT
    backends = (BackendType.CUBLASLT, BackendType.CUTLASS)

    def __init__(self, pa: PtTensor, pb: PtTensor, pout: PtTensor, trans_a: bool, trans_b: bool, beta: float, device):
        self.pa, self.pb, self.pout = pa, pb, pout
        self.trans_a, self.trans_b, self.beta = int(trans_a), int(trans_b), float(beta)
        self.device = device
        self.stream = current_stream_handle(device)
        self._ws = None
        self._scratch = None

    @property
    def ws(self):
        if self._ws is None:
            self._ws = workspace(self.device)
        return self._ws

    def _args(self):
        return self.pa, self.pb, self.pout, self.trans_a, self.trans_b

    def key(self) -> str:
        return string_out(lib.pt_gemm_problem_key, *self._args(), self.beta, size=512)

    def query(self, backend: BackendType):
        accepted, n = ctypes.c_int32(), ctypes.c_int32()
        reason = ctypes.create_string_buffer(1024)
        check(
            lib.pt_gemm_query(
                *self._args(), self.beta, backend.value, ctypes.byref(accepted), ctypes.byref(n), reason, len(reason)
            )
        )
        return bool(accepted.value), n.value, reason.value.decode()

    def prepare(self, backend: BackendType, config: int) -> None:
        check(lib.pt_gemm_prepare(*self._args(), self.beta, backend.value, config))

    def run(self, backend: BackendType, config: int, for_tuning: bool = False) -> None:
        pout = self.pout
        if for_tuning and self.beta != 0.0:
            # Profiling must not accumulate into the caller's tensor several times.
            if self._scratch is None:
                self._scratch = empty_like_pt(self.pout, self.device).zero_()
            pout = to_pt(self._scratch)
        # Only cuBLASLt takes a workspace; the CUTLASS kernels' persistent scheduler needs none.
        ws_ptr, ws_bytes = (self.ws.data_ptr(), self.ws.numel()) if backend == BackendType.CUBLASLT else (None, 0)
        status = lib.pt_gemm(
            self.pa, self.pb, pout, self.trans_a, self.trans_b, 1.0, self.beta,
            backend.value, config, ws_ptr, ws_bytes, self.stream,
        )
        if status:
            check(status, context=f"gemm on {backend.name}")


class _GemmPlanRequest(ctypes.Structure):
    """GemmPlanRequest (csrc/bindings/torch/plan_cache.h)."""

    _fields_ = [
        ("a", ctypes.POINTER(PtTensor)),
        ("b", ctypes.POINTER(PtTensor)),
        ("d", ctypes.POINTER(PtTensor)),
        ("trans_a", ctypes.c_int32),
        ("trans_b", ctypes.c_int32),
        ("beta", ctypes.c_float),
    ]


def _gemm_problem(request: int, device: int) -> GemmProblem:
    """The native op's planner request (the first call of a problem: sizes, layouts, dtypes,
    alignment, device, settings) as the problem autotune sees."""
    r = _GemmPlanRequest.from_address(request)
    copy = PtTensor.from_buffer_copy  # the request's descriptors live only during this call
    args = (copy(r.a.contents), copy(r.b.contents), copy(r.d.contents))
    return GemmProblem(*args, r.trans_a, r.trans_b, r.beta, torch.device("cuda", device))


native.register_planner(native.PLAN_GEMM, _gemm_problem)


def _gemm_fake(a, b, trans_a, trans_b, out_dtype):
    m, n, out_dtype = _gemm_shape(a, b, trans_a, trans_b, out_dtype)
    return a.new_empty((m, n), dtype=out_dtype)


def _gemm_accum_fake(a, b, out, trans_a, trans_b):
    m, n, _ = _gemm_shape(a, b, trans_a, trans_b, out.dtype)
    if tuple(out.shape) != (m, n):
        raise ValueError(f"gemm: accumulation target has shape {tuple(out.shape)}; expected [{m}, {n}]")


# Native ops (csrc/bindings/torch/gemm_ops.cpp): checks, plan lookup and launch in one C++ call.
library.register_fake("gemm", _gemm_fake)
library.register_fake("gemm_accum_", _gemm_accum_fake)
_gemm_call = native.ops.gemm.default
_gemm_accum_call = native.ops.gemm_accum_.default


class GemmFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, trans_a: bool, trans_b: bool, out_dtype, main_grad):
        out = _gemm_call(a, b, trans_a, trans_b, out_dtype)
        ctx.save_for_backward(a, b)
        ctx.trans_a, ctx.trans_b = trans_a, trans_b
        ctx.main_grad = main_grad
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        ta, tb = ctx.trans_a, ctx.trans_b
        grad_a = grad_b = None
        if grad_out.dtype != a.dtype:  # a float32 output of 16-bit operands: the backward GEMMs read a's dtype
            grad_out = grad_out.to(a.dtype)
        if ctx.needs_input_grad[0]:
            # d op(a) = grad_out @ op(b)^T, written in a's own orientation.
            if ta:
                grad_a = _gemm_call(b, grad_out, tb, True, a.dtype)
            else:
                grad_a = _gemm_call(grad_out, b, False, not tb, a.dtype)
        if ctx.needs_input_grad[1] or ctx.main_grad is not None:
            # d op(b) = op(a)^T @ grad_out, written in b's own orientation.
            if tb:
                args = (grad_out, a, True, ta)
            else:
                args = (a, grad_out, not ta, False)
            if ctx.main_grad is not None:
                _gemm_accum_call(args[0], args[1], ctx.main_grad, args[2], args[3])
                grad_b = dummy_wgrad(b.shape, b.dtype, b.device)
            else:
                grad_b = _gemm_call(*args, b.dtype)
        return grad_a, grad_b, None, None, None, None


@native.raises_python_errors
def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool = False,
    trans_b: bool = False,
    out_dtype: Optional[torch.dtype] = None,
    fuse_bgrad_accum_pattern: Optional[str] = None,
) -> torch.Tensor:
    """``op(a) @ op(b)`` where ``op`` transposes when ``trans_a`` / ``trans_b`` is set.

    Args:
        a: ``[M, K]`` (``[K, M]`` with ``trans_a``), float32, float16 or bfloat16, on a CUDA device.
        b: ``[K, N]`` (``[N, K]`` with ``trans_b``), same dtype as ``a``.
        out_dtype: output dtype (default: ``a.dtype``); float32 output is allowed for 16-bit inputs.
        fuse_bgrad_accum_pattern: ``"megatron"`` accumulates the weight gradient of ``b`` into
            ``b.main_grad`` inside the GEMM and sets ``b.grad_added_to_main_grad``.

    Any row- or column-major view works (other strides are copied once). Differentiable.
    """
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        _gemm_shape(a, b, trans_a, trans_b, out_dtype)  # raises the TypeError naming the argument
    trans_a, trans_b = flag("gemm", "trans_a", trans_a), flag("gemm", "trans_b", trans_b)
    if out_dtype is None:
        out_dtype = a.dtype
    elif not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"gemm: out_dtype must be a torch.dtype or None, got {out_dtype!r}")
    if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        if fuse_bgrad_accum_pattern is not None:
            check_main_grad_pattern(fuse_bgrad_accum_pattern)  # no wgrad will be made to accumulate
        return _gemm_call(a, b, trans_a, trans_b, out_dtype)
    main_grad = check_main_grad(b, fuse_bgrad_accum_pattern)
    if main_grad is None and native.eager_cpp_autograd():
        # The op's autograd is registered in C++ (bindings/torch_autograd): no Python in between.
        return _gemm_call(a, b, trans_a, trans_b, out_dtype)
    return GemmFunction.apply(a, b, trans_a, trans_b, out_dtype, main_grad)
