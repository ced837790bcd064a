"""turbo.ops.grouped_gemm: mixture-of-experts grouped GEMM, forward and backward, with the group
sizes kept on the device (no host sync; CUDA-graph capturable with sizes changing per replay)."""

import ctypes
import os
from typing import Optional

import torch

from primus_turbo._core import PtTensor, check, lib
from primus_turbo._core.lib import PtGroupedGemmArgs, string_out
from primus_turbo.pytorch.core import autotune, library, native
from primus_turbo.pytorch.core.backend import BackendType, OpFamily, PrecisionType
from primus_turbo.pytorch.core.tensor_bridge import current_stream_handle
from primus_turbo.pytorch.ops._checks import (
    check_cuda_tensors,
    check_num_cu,
    check_schedule,
    flag,
    route_wgrad_to_main_grad,
)

__all__ = ["grouped_gemm"]

_DTYPES = (torch.bfloat16, torch.float16)


def _check_groups(group_lens, group_offs, num_groups: Optional[int] = None) -> int:
    if not isinstance(group_lens, torch.Tensor):
        raise TypeError(f"grouped_gemm: argument 'group_lens' must be a torch.Tensor, got {type(group_lens).__name__}")
    if group_lens.dtype != torch.int64:
        raise TypeError(f"grouped_gemm: argument 'group_lens' has dtype {group_lens.dtype}; expected torch.int64")
    if group_lens.dim() != 1 or group_lens.shape[0] < 1:
        raise ValueError(
            f"grouped_gemm: argument 'group_lens' must be 1-D with at least one group, got shape {tuple(group_lens.shape)}"
        )
    g = group_lens.shape[0]
    if num_groups is not None and g != num_groups:
        raise ValueError(f"grouped_gemm: argument 'group_lens' has {g} groups but 'b' has {num_groups}")
    if group_offs is not None:
        if not isinstance(group_offs, torch.Tensor):
            raise TypeError(f"grouped_gemm: argument 'group_offs' must be a torch.Tensor or None, got {type(group_offs).__name__}")
        if group_offs.dtype != torch.int64:
            raise TypeError(f"grouped_gemm: argument 'group_offs' has dtype {group_offs.dtype}; expected torch.int64")
        if tuple(group_offs.shape) != (g + 1,):
            raise ValueError(
                f"grouped_gemm: argument 'group_offs' has shape {tuple(group_offs.shape)}; expected [{g + 1}] (G + 1 offsets)"
            )
    return g


def check_group_lens_debug(op: str, group_lens: torch.Tensor, rows: int) -> None:
    """With PRIMUS_TURBO_CHECK_GROUP_LENS=1: reads group_lens back (a host sync; skipped during a
    CUDA-graph capture and for tensors that are not on a GPU) and rejects negative lengths and a
    sum larger than the rows. Off by default: the kernels clamp every group into the rows on the
    device and zero the rows no group covers. The native bf16 op does the same in C++."""
    if os.environ.get("PRIMUS_TURBO_CHECK_GROUP_LENS", "0") in ("", "0"):
        return
    if not group_lens.is_cuda or torch.cuda.is_current_stream_capturing():
        return
    lens = group_lens.tolist()
    for g, n in enumerate(lens):
        if n < 0:
            raise ValueError(f"{op}: group_lens[{g}] = {n} is negative")
    if sum(lens) > rows:
        raise ValueError(f"{op}: group_lens adds up to {sum(lens)}, more than the {rows} rows of 'a'")


def _check_matrix(name: str, t, ndim: int, dtype=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"grouped_gemm: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"grouped_gemm: argument '{name}' must be {ndim}-D, got shape {tuple(t.shape)}")
    if dtype is None and t.dtype not in _DTYPES:
        raise TypeError(f"grouped_gemm: argument '{name}' has dtype {t.dtype}; expected bfloat16 or float16")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"grouped_gemm: argument '{name}' has dtype {t.dtype}; expected the dtype of 'a' ({dtype})")


def _forward_shape(a, b, group_lens, group_offs, trans_b: bool):
    """Validates the forward's arguments (no device work); returns the output shape."""
    _check_matrix("a", a, 2)
    _check_matrix("b", b, 3, a.dtype)
    _check_groups(group_lens, group_offs, b.shape[0])
    kb, n = (b.shape[2], b.shape[1]) if trans_b else (b.shape[1], b.shape[2])
    if kb != a.shape[1]:
        raise ValueError(
            f"grouped_gemm: inner dimensions do not match: 'a' is {tuple(a.shape)} but 'b' {tuple(b.shape)} "
            f"has K = {kb} (trans_b={trans_b})"
        )
    tensors = {"a": a, "b": b, "group_lens": group_lens}
    if group_offs is not None:
        tensors["group_offs"] = group_offs
    check_cuda_tensors("grouped_gemm", **tensors)
    return a.shape[0], n


def _wgrad_shape(a, grad_out, group_lens, group_offs, trans_b: bool):
    _check_matrix("a", a, 2)
    _check_matrix("grad_out", grad_out, 2, a.dtype)
    g = _check_groups(group_lens, group_offs)
    if grad_out.shape[0] != a.shape[0]:
        raise ValueError(
            f"grouped_gemm: argument 'grad_out' has shape {tuple(grad_out.shape)}; expected {a.shape[0]} rows like 'a'"
        )
    k, n = a.shape[1], grad_out.shape[1]
    return (g, n, k) if trans_b else (g, k, n)


class GroupedGemmProblem(autotune.TunableProblem):
    op = OpFamily.GROUPED_GEMM
    precision = PrecisionType.BF16_FP16_FP32
    default_backend = BackendType.CUTLASS
    backends = (BackendType.CUTLASS,)

    def __init__(
        self, pts, offs: Optional[PtTensor], wgrad: bool, trans_b: bool, device: torch.device, num_sms: int = 0
    ):
        """pts: the descriptors of a, b, group_lens and the output (owned here: the args struct
        points at them)."""
        self._pts, self._offs = pts, offs
        pa, pb, pl, pd = (ctypes.pointer(t) for t in self._pts)
        po = ctypes.pointer(self._offs) if self._offs is not None else None
        self.args = PtGroupedGemmArgs(pa, pb, pl, po, pd, int(wgrad), int(trans_b), int(num_sms))
        self.ref = ctypes.byref(self.args)
        self.device = device
        self.stream = current_stream_handle(device)

    @classmethod
    def from_request(cls, request: int, device: int) -> "GroupedGemmProblem":
        """From the native op's planner request (a pt_grouped_gemm_args alive during the call)."""
        args = PtGroupedGemmArgs.from_address(request)
        copy = PtTensor.from_buffer_copy
        pts = [copy(p.contents) for p in (args.a, args.b, args.group_lens, args.d)]
        offs = copy(args.group_offs.contents) if args.group_offs else None
        return cls(pts, offs, bool(args.wgrad), bool(args.trans_b), torch.device("cuda", device), args.num_sms)

    def key(self) -> str:
        return string_out(lib.pt_grouped_gemm_problem_key, self.ref, size=512)

    def query(self, backend: BackendType):
        accepted, n = ctypes.c_int32(), ctypes.c_int32()
        reason = ctypes.create_string_buffer(1024)
        check(lib.pt_grouped_gemm_query(self.ref, backend.value, ctypes.byref(accepted), ctypes.byref(n), reason, 1024))
        return bool(accepted.value), n.value, reason.value.decode()

    def prepare(self, backend: BackendType, config: int) -> None:
        check(lib.pt_grouped_gemm_prepare(self.ref, backend.value, config))

    def workspace_bytes(self, backend: BackendType, config: int) -> int:
        size = ctypes.c_size_t()
        check(lib.pt_grouped_gemm_workspace_size(self.ref, backend.value, config, ctypes.byref(size)))
        return size.value

    def run(self, backend: BackendType, config: int, for_tuning: bool = False, ws_bytes: Optional[int] = None) -> None:
        if ws_bytes is None:
            ws_bytes = self.workspace_bytes(backend, config)
        # From torch's caching allocator: graph-safe, and freed (stream-ordered) after the launch.
        ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=self.device)
        status = lib.pt_grouped_gemm(self.ref, backend.value, config, ws.data_ptr(), ws_bytes, self.stream)
        if status:
            check(status, context=f"grouped_gemm on {backend.name}")


native.register_planner(native.PLAN_GROUPED_GEMM, GroupedGemmProblem.from_request)


def _grouped_gemm_fake(a, b, group_lens, group_offs, trans_b, num_sms):
    m, n = _forward_shape(a, b, group_lens, group_offs, trans_b)
    return a.new_empty((m, n))


def _grouped_gemm_wgrad_fake(a, grad_out, group_lens, group_offs, trans_b, num_sms):
    return a.new_empty(_wgrad_shape(a, grad_out, group_lens, group_offs, trans_b))


# Native ops (csrc/bindings/torch/grouped_gemm_ops.cpp): checks, plan lookup and launch in one call.
library.register_fake("grouped_gemm", _grouped_gemm_fake)
library.register_fake("grouped_gemm_wgrad", _grouped_gemm_wgrad_fake)
_grouped_gemm_op = native.ops.grouped_gemm.default
_grouped_gemm_wgrad_op = native.ops.grouped_gemm_wgrad.default


class GroupedGemmFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, group_lens, group_offs, trans_b: bool, num_sms: int):
        out = _grouped_gemm_op(a, b, group_lens, group_offs, trans_b, num_sms)
        ctx.save_for_backward(a, b, group_lens, group_offs)
        ctx.trans_b, ctx.num_sms = trans_b, num_sms
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b, group_lens, group_offs = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            # dgrad: grad_out @ op(b[g])^T is the same kernel reading b the other way round.
            grad_a = _grouped_gemm_op(grad_out, b, group_lens, group_offs, not ctx.trans_b, ctx.num_sms)
        if ctx.needs_input_grad[1]:
            # wgrad: a variable-K grouped GEMM over each group's rows.
            grad_b = _grouped_gemm_wgrad_op(a, grad_out, group_lens, group_offs, ctx.trans_b, ctx.num_sms)
        return grad_a, grad_b, None, None, None, None


@native.raises_python_errors
def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: Optional[torch.Tensor] = None,
    trans_b: bool = False,
    num_cu: Optional[int] = None,
    schedule: str = "static",
    fuse_bgrad_accum_pattern: Optional[str] = None,
) -> torch.Tensor:
    """Per-group ``a[rows of g] @ op(b[g])``: the expert layers of a mixture of experts.

    Args:
        a: ``[M, K]`` tokens sorted by group, bfloat16 or float16, on a CUDA device.
        b: ``[G, K, N]`` (``[G, N, K]`` with ``trans_b``), same dtype.
        group_lens: int64 ``[G]`` on a's device: rows of each group (zero is fine). Never copied
            to the host, so the call does not synchronize and can be captured in a CUDA graph.
        group_offs: optional int64 ``[G + 1]``: group g starts at row ``group_offs[g]``
            (default: the exclusive prefix sum of ``group_lens``).
        num_cu: SMs the persistent kernels (forward, dgrad, wgrad) may use (default: all), e.g. to
            leave SMs to overlapped communication; rounded down to an even count (the kernels
            launch clusters of 2 CTAs), at least 2.
        schedule: the persistent kernels' tile schedule: ``"static"`` (the only one here: each
            CTA takes every num_cu-th tile; the AMD library's ``"work_steal"`` raises
            ``NotImplementedError``).
        fuse_bgrad_accum_pattern: ``"megatron"``: b's gradient is added into ``b.main_grad``
            (float32 or b's dtype) right after the wgrad GEMM and autograd gets a placeholder, as
            Megatron's gradient-accumulation fusion expects (one add; the grouped wgrad kernel
            does not accumulate in place).

    Returns ``[M, N]``. Differentiable in ``a`` and ``b``; an expert with no rows gets a zero
    weight gradient. If ``group_lens`` does not add up to ``M`` (which cannot be checked without
    a sync), each group is clamped to rows ``[0, M)``: nothing out of bounds is read or written,
    and the rows past the last group come back as zeros. ``PRIMUS_TURBO_CHECK_GROUP_LENS=1``
    checks the sizes on the host instead (a sync): negative lengths or a sum above ``M`` raise
    ``ValueError``.
    """
    trans_b = flag("grouped_gemm", "trans_b", trans_b)
    if not (
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and isinstance(group_lens, torch.Tensor)
        and (group_offs is None or isinstance(group_offs, torch.Tensor))
    ):
        _forward_shape(a, b, group_lens, group_offs, trans_b)  # raises the TypeError naming the argument
    num_sms = check_num_cu("grouped_gemm", num_cu)
    check_schedule("grouped_gemm", schedule)
    if fuse_bgrad_accum_pattern is not None:
        b = route_wgrad_to_main_grad(b, fuse_bgrad_accum_pattern)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        if native.eager_cpp_autograd():
            # The op's autograd is registered in C++ (bindings/torch_autograd): no Python in between.
            return _grouped_gemm_op(a, b, group_lens, group_offs, trans_b, num_sms)
        return GroupedGemmFunction.apply(a, b, group_lens, group_offs, trans_b, num_sms)
    return _grouped_gemm_op(a, b, group_lens, group_offs, trans_b, num_sms)
