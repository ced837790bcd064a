"""turbo.ops.grouped_gemm_fp8: mixture-of-experts grouped GEMM in FP8, forward and backward, with the
group sizes kept on the device (no host sync; CUDA-graph capturable with sizes changing per replay).

FP8 tensor cores read both operands K-major, so the one kernel is
``out[rows of g] = (A * sA)[rows of g] @ (B[g] * sB[g])^T`` over A ``[M, K]`` and B ``[G, N, K]``
(``kernels/grouped_gemm/cutlass_grouped_gemm_fp8_sm90.cuh``), whose scales are always
per-128-deep-K-block: A's one per row and K block, B's per row or per 128x128 block. Tensorwise
and rowwise scales are restated in that form (the value repeated over the K blocks it covers).
With ``op(b)`` ``[K, N]`` per expert::

    forward  out  = a    [M,K]          x op(b)^T [G,N,K]   (b itself with trans_b, else b^T)
    dgrad    da   = grad [M,N] along N  x op(b)   [G,K,N]   (b^T with trans_b, else b itself)
    wgrad    db   = per-group a^T grad (bf16 grouped GEMM; see below)

Quantization: ``a`` and the output gradient per token along the reduction dimension
(TENSORWISE: one scale for the tensor; ROWWISE: per token; BLOCKWISE: 1x128), all independent of
the groups. ``b``: TENSORWISE one scale for the whole ``[G, ...]`` tensor; ROWWISE one per row of
each expert's K-major operand; BLOCKWISE 128x128 blocks per expert, which the transposed copy used
by dgrad reuses (transposed). HYBRID quantizes the output gradient to E5M2.

wgrad, by default, runs on the bf16 grouped GEMM (turbo.ops.grouped_gemm's variable-K kernel) from
the saved bf16/fp16 input and the output gradient: an FP8 wgrad needs both operands quantized along
the token dimension and K-major, i.e. transposed copies whose per-expert slices start at arbitrary
token offsets — not 16-byte aligned for TMA, and 1x128 blocks that must not cross expert
boundaries. With ``PRIMUS_TURBO_GROUPED_GEMM_FP8_WGRAD=1`` (or ``FP8_WGRAD = True`` here) an FP8
wgrad is used instead (experimental, not yet validated on a GPU): each expert's tokens are copied
into a zero-padded packing where every expert starts at a multiple of 128 columns (offsets computed
on the device), quantized transposed along the tokens, and the grouped FP8 kernel runs with the
groups splitting its reduction.
"""

import ctypes
import os

import torch

from primus_turbo._core import check, lib
from primus_turbo._core.lib import PtGroupedGemmFp8Args, PtTensor, string_out
from primus_turbo.pytorch.core import autotune, library, native
from primus_turbo.pytorch.core.backend import BackendType, OpFamily, PrecisionType
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity, ScalingRecipe
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor
from primus_turbo.pytorch.ops import _mx_blocks
from primus_turbo.pytorch.ops import _quantized_operands as _qo
from primus_turbo.pytorch.core.tensor_bridge import current_stream_handle
from primus_turbo.pytorch.ops._checks import check_cuda_tensors, check_num_cu, flag, route_wgrad_to_main_grad
from primus_turbo.pytorch.ops._group_padding import pad_groups
from primus_turbo.pytorch.ops._transpose import transpose_last2
from primus_turbo.pytorch.ops.grouped_gemm import (
    _check_groups,
    _grouped_gemm_wgrad_op,
    check_group_lens_debug,
    grouped_gemm,
)
from primus_turbo.pytorch.ops.gemm_fp8 import _NATIVE_GRANULARITY
from primus_turbo.pytorch.ops.quantization import quantize_fp8_transposed, quantize_fp8_unpadded

__all__ = ["grouped_gemm_fp8"]

_IN_DTYPES = (torch.bfloat16, torch.float16)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_BLOCK = 128

# The weight gradient in FP8 (experimental, see the module docstring) instead of bf16.
FP8_WGRAD = os.environ.get("PRIMUS_TURBO_GROUPED_GEMM_FP8_WGRAD", "0") == "1"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---- the kernel call ----------------------------------------------------------------------------


class GroupedGemmFp8Problem(autotune.TunableProblem):
    """The planner's view of one FP8 grouped GEMM call, built from the native op's request (the
    launch itself is native: csrc/bindings/torch/grouped_gemm_fp8_ops.cpp)."""

    op = OpFamily.GROUPED_GEMM
    precision = PrecisionType.FP8
    default_backend = BackendType.CUTLASS
    backends = (BackendType.CUTLASS,)

    def __init__(self, pts, offs, b_scale_rows: int, num_sms: int, wgrad: bool, tokens: int, device: torch.device,
                 flags: int = 0):
        """pts: the descriptors of a, a_scale, b, b_scale, group_lens and the output (owned here:
        the args struct points at them)."""
        self._pts, self._offs = pts, offs
        pa, psa, pb, psb, pl, pd = (ctypes.pointer(t) for t in self._pts)
        po = ctypes.pointer(self._offs) if self._offs is not None else None
        self.args = PtGroupedGemmFp8Args(pa, psa, pb, psb, pl, po, pd, int(b_scale_rows), int(num_sms), int(wgrad),
                                         int(tokens), int(flags))
        self.ref = ctypes.byref(self.args)
        self.device = device
        self.stream = current_stream_handle(device)

    @classmethod
    def from_request(cls, request: int, device: int) -> "GroupedGemmFp8Problem":
        """From the native op's planner request (a pt_grouped_gemm_fp8_args alive during the call)."""
        args = PtGroupedGemmFp8Args.from_address(request)
        copy = PtTensor.from_buffer_copy
        pts = [copy(p.contents) for p in (args.a, args.a_scale, args.b, args.b_scale, args.group_lens, args.d)]
        offs = copy(args.group_offs.contents) if args.group_offs else None
        return cls(pts, offs, args.b_scale_rows, args.num_sms, bool(args.wgrad), args.tokens,
                   torch.device("cuda", device), args.flags)

    def key(self) -> str:
        return string_out(lib.pt_grouped_gemm_fp8_problem_key, self.ref, size=512)

    def query(self, backend: BackendType):
        accepted, n = ctypes.c_int32(), ctypes.c_int32()
        reason = ctypes.create_string_buffer(1024)
        check(
            lib.pt_grouped_gemm_fp8_query(
                self.ref, backend.value, ctypes.byref(accepted), ctypes.byref(n), reason, 1024
            )
        )
        return bool(accepted.value), n.value, reason.value.decode()

    def prepare(self, backend: BackendType, config: int) -> None:
        self.workspace_bytes(backend, config)  # builds or loads the module

    def workspace_bytes(self, backend: BackendType, config: int) -> int:
        size = ctypes.c_size_t()
        check(lib.pt_grouped_gemm_fp8_workspace_size(self.ref, backend.value, config, ctypes.byref(size)))
        return size.value

    def run(self, backend: BackendType, config: int, for_tuning: bool = False, ws_bytes: int | None = None) -> None:
        if ws_bytes is None:
            ws_bytes = self.workspace_bytes(backend, config)
        ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=self.device)
        status = lib.pt_grouped_gemm_fp8(self.ref, backend.value, config, ws.data_ptr(), ws_bytes, self.stream)
        if status:
            check(status, context=f"grouped_gemm_fp8 on {backend.name}")


native.register_planner(native.PLAN_GROUPED_GEMM_FP8, GroupedGemmFp8Problem.from_request)


def _mm_fake(a, a_scale, b, b_scale, group_lens, group_offs, b_scale_rows, out_dtype, num_sms):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _wgrad_mm_fake(a, a_scale, b, b_scale, group_lens, group_offs, tokens, out_dtype, num_sms):
    return a.new_empty((group_lens.shape[0], a.shape[0], b.shape[0]), dtype=out_dtype)


# Native ops (csrc/bindings/torch/grouped_gemm_fp8_ops.cpp): the kernel on operands quantized
# elsewhere (pre-quantized, QuantizedTensor, MX and FP4 paths) and the composed forward / backward.
library.register_fake("grouped_gemm_fp8_mm", _mm_fake)
library.register_fake("grouped_gemm_fp8_wgrad_mm", _wgrad_mm_fake)
_mm_op = native.ops.grouped_gemm_fp8_mm.default
_wgrad_mm_op = native.ops.grouped_gemm_fp8_wgrad_mm.default


def padded_width(tokens: int, groups: int) -> int:
    """Columns of the per-expert 128-padded token packing: enough for any group sizes."""
    return _cdiv(tokens + groups * (_BLOCK - 1), _BLOCK) * _BLOCK


def pad_tokens(x: torch.Tensor, group_lens, group_offs, width: int) -> torch.Tensor:
    """x [T, C] -> [width, C]: every group's (clamped) rows moved to start at a multiple of 128, in
    group order, zeros elsewhere; the same packing the wgrad kernel's setup computes on the device.
    No host sync. With group_offs, starts must be non-decreasing."""
    return pad_groups(x, group_lens, group_offs, width, _BLOCK)


def quantize_tokens_transposed(x, group_lens, group_offs, width: int, dtype, g: ScalingGranularity):
    """x [T, C] -> (q [C, width] quantized along the padded tokens, scale [width/128, C]): the wgrad
    kernel's K-major operand and its MN-major 1x128 scales."""
    xp = pad_tokens(x, group_lens, group_offs, width)
    block = _BLOCK if g == ScalingGranularity.BLOCKWISE else None
    q_col, s_col = quantize_fp8_transposed(xp, dtype, g, block_size=block)  # the row copy is never read
    c, kb = x.shape[1], width // _BLOCK
    if g == ScalingGranularity.BLOCKWISE:
        return q_col, s_col.reshape(c, kb).t().contiguous()
    return q_col, s_col.float().reshape(1, -1).expand(kb, c).contiguous()


def grouped_fp8_wgrad(a, grad_out, group_lens, group_offs, trans_b: bool, a_dtype, grad_dtype, g, out_dtype, num_sms=0):
    """FP8 variable-K weight gradient: ``[G, N, K]`` (trans_b) or ``[G, K, N]`` per group
    ``grad_g^T a_g`` / ``a_g^T grad_g``."""
    tokens, groups = a.shape[0], group_lens.shape[0]
    width = padded_width(tokens, groups)
    qa, sa = quantize_tokens_transposed(a, group_lens, group_offs, width, a_dtype, g)  # [K, width]
    qg, sg = quantize_tokens_transposed(grad_out, group_lens, group_offs, width, grad_dtype, g)  # [N, width]
    if trans_b:
        return _wgrad_mm_op(qg, sg, qa, sa, group_lens, group_offs, tokens, out_dtype, num_sms)
    return _wgrad_mm_op(qa, sa, qg, sg, group_lens, group_offs, tokens, out_dtype, num_sms)


def grouped_fp8_mm(
    qa, sa, qb, sb, group_lens, group_offs, b_scale_rows: int, out_dtype, num_sms: int = 0
) -> torch.Tensor:
    """``out[rows of g] = (qa * sa)[rows of g] @ (qb[g] * sb[g])^T`` with the kernel's scale layouts:
    sa ``[M]``, sb ``[G, N]`` (b_scale_rows=0: one scale per row, applied after the product) or
    sa ``[M, ceil(K/128)]``, sb ``[G, N, ceil(K/128)]`` (b_scale_rows=1) or
    ``[G, ceil(N/128), ceil(K/128)]`` (128). num_sms: SMs the persistent kernel may use (0: all)."""
    return _mm_op(qa, sa, qb, sb, group_lens, group_offs, b_scale_rows, out_dtype, num_sms)


# ---- quantization into the kernel's layouts -----------------------------------------------------


def quantize_rows(x: torch.Tensor, dtype: torch.dtype, g: ScalingGranularity):
    """x ``[R, C]`` quantized along C: ``(q [R, C], scale [R, ceil(C/128)])``. MX_BLOCKWISE: E8M0
    per 32, restated as 1x128 blocks (``_mx_blocks``: exact up to values 2^18 below their block's
    largest), as the dense MX GEMM."""
    r, c = x.shape
    kb = _cdiv(c, _BLOCK)
    if g == ScalingGranularity.MX_BLOCKWISE:
        return _mx_blocks.mx_fp8_to_1x128(*quantize_fp8_unpadded(x, dtype, g, block_size=_mx_blocks.MX_BLOCK, axis=-1))
    if g == ScalingGranularity.BLOCKWISE:
        q, s = quantize_fp8_unpadded(x, dtype, g, block_size=_BLOCK, axis=-1)
        return q, s.reshape(r, kb)
    if g == ScalingGranularity.ROWWISE:
        q, s = quantize_fp8_unpadded(x, dtype, g, axis=-1)
    else:
        q, s = quantize_fp8_unpadded(x, dtype, g)
    return q, s.float().reshape(-1, 1).expand(r, kb).contiguous()


def _quantize_2d_batched(w: torch.Tensor, dtype: torch.dtype):
    """w ``[G, X, Y]`` in 128x128 blocks per expert (torch; for X not a multiple of 128)."""
    g, x, y = w.shape
    xb, yb = _cdiv(x, _BLOCK), _cdiv(y, _BLOCK)
    fmax = torch.finfo(dtype).max
    wp = torch.nn.functional.pad(w.float(), (0, yb * _BLOCK - y, 0, xb * _BLOCK - x)).view(g, xb, _BLOCK, yb, _BLOCK)
    amax = wp.abs().amax(dim=(2, 4))
    s = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    q = (wp / s[:, :, None, :, None]).clamp(-fmax, fmax).to(dtype)
    return q.view(g, xb * _BLOCK, yb * _BLOCK)[:, :x, :y].contiguous(), s


def _stated_per_block(scale: torch.Tensor, n_groups: int, x: int, y: int) -> torch.Tensor:
    """TENSORWISE's one weight scale as the kernel's cheaper B-scale form: the same value for every
    128x128 block of each expert's ``[X, Y]``, ``[G, ceil(X/128), ceil(Y/128)]`` (a broadcast view)."""
    return scale.float().reshape(1, 1, 1).expand(n_groups, _cdiv(x, _BLOCK), _cdiv(y, _BLOCK))


def quantize_weight_blocks(w: torch.Tensor, dtype: torch.dtype, g: ScalingGranularity):
    """BLOCKWISE / TENSORWISE: w ``[G, X, Y]`` quantized as it lies -> ``(q [G, X, Y], scale
    [G, ceil(X/128), ceil(Y/128)])``, one scale per 128x128 block (TENSORWISE: the one value in
    every block, the kernel's cheaper B-scale form). A block keeps its scale when transposed, so both
    orientations of the kernel's B (forward and dgrad) come from this one quantization
    (``orient_weight``)."""
    n_groups, x, y = w.shape
    if g == ScalingGranularity.TENSORWISE:
        q, s = quantize_fp8_unpadded(w.reshape(n_groups * x, y), dtype, g)
        return q.view(n_groups, x, y), _stated_per_block(s, n_groups, x, y)
    if x % _BLOCK == 0:  # 128x128 blocks of [G*X, Y] never cross experts
        q, s = quantize_fp8_unpadded(
            w.reshape(n_groups * x, y), dtype, g, block_size=_BLOCK, scaling_recipe=ScalingRecipe(use_2d_block=True)
        )
        return q.view(n_groups, x, y), s.view(n_groups, x // _BLOCK, _cdiv(y, _BLOCK))
    return _quantize_2d_batched(w, dtype)


def orient_weight(q: torch.Tensor, s: torch.Tensor, transpose: bool):
    """``quantize_weight_blocks``' result as the kernel's K-major B (K = Y, or X with
    ``transpose``): ``(q, scale, b_scale_rows=128)``."""
    if transpose:
        return transpose_last2(q), s.transpose(1, 2).contiguous(), 128
    return q.contiguous(), s.contiguous(), 128


def quantize_weight(w: torch.Tensor, dtype: torch.dtype, g: ScalingGranularity, transpose: bool):
    """w ``[G, X, Y]`` -> the kernel's K-major B: ``[G, X, Y]`` (K = Y) or, with ``transpose``,
    ``[G, Y, X]`` (K = X); returns ``(q, scale, b_scale_rows)``."""
    if g not in (ScalingGranularity.ROWWISE, ScalingGranularity.MX_BLOCKWISE):
        return orient_weight(*quantize_weight_blocks(w, dtype, g), transpose)
    # ROWWISE: one scale per row of the K-major operand (per output channel and expert); MX: per
    # row and 32 along K, restated per row and 128-block. Either way quantized in the orientation
    # the GEMM reads, so the dgrad quantizes the weight again, along N.
    n_groups = w.shape[0]
    src = transpose_last2(w) if transpose else w.contiguous()
    n, k = src.shape[1], src.shape[2]
    q, s = quantize_rows(src.reshape(n_groups * n, k), dtype, g)
    return q.view(n_groups, n, k), s.view(n_groups, n, _cdiv(k, _BLOCK)), 1


def _dtypes(fmt: Format):
    """(operand dtype, output-gradient dtype)."""
    if fmt == Format.E4M3:
        return torch.float8_e4m3fn, torch.float8_e4m3fn
    if fmt == Format.E5M2:
        return torch.float8_e5m2, torch.float8_e5m2
    return torch.float8_e4m3fn, torch.float8_e5m2  # HYBRID


# ---- autograd -----------------------------------------------------------------------------------


def _dgrad_weight(b, b_t, g, dtype, k_dim: int):
    """The dgrad's B from a QuantizedTensor weight, reducing over ``k_dim`` (1 or 2 of ``[G, X, Y]``):
    the pair's other copy ``b_t`` or ``b`` itself where its scales allow, else ``b`` dequantized and
    quantized again along ``k_dim``."""
    return _qo.backward_copy(
        b, b_t, lambda src: _qo.grouped_weight("grouped_gemm_fp8", "b", src, k_dim),
        lambda src: quantize_weight(src.dequantize(), dtype, g, transpose=k_dim == 1),
    )


class GroupedGemmFp8Function(torch.autograd.Function):
    """Per-group FP8 GEMM; ``a`` a bf16/fp16 tensor or a QuantizedTensor (tokens along K), ``b`` a
    bf16/fp16 weight or a QuantizedTensor (``b_t``: its copy along N for the dgrad, optional)."""

    @staticmethod
    def forward(
        ctx, a, b, b_t, group_lens, group_offs, trans_b: bool, out_dtype, fmt: Format, g: ScalingGranularity,
        num_sms: int
    ):
        fwd_dtype, grad_dtype = _dtypes(fmt)
        qa, sa = _qo.grouped_activation("grouped_gemm_fp8", "a", a) if isinstance(a, QuantizedTensor) else quantize_rows(
            a, fwd_dtype, g
        )
        # The forward's B is op(b)^T [G, N, K]: b itself with trans_b, else its transpose. Block
        # scales serve the dgrad's orientation too: kept, so the weight is quantized once a step.
        wq = ws = dgrad_b = None
        if isinstance(b, QuantizedTensor):
            fwd_k = 2 if trans_b else 1
            fwd_b = _qo.grouped_weight("grouped_gemm_fp8", "b", b, fwd_k)
            if fwd_b is None:
                raise ValueError(
                    f"grouped_gemm_fp8: pre-quantized 'b' is quantized along dim {b.quantized_axis}; the forward reduces "
                    f"over its dim {fwd_k} (K)"
                )
            qb, sb, rows = fwd_b
            if ctx.needs_input_grad[0]:
                dgrad_b = _dgrad_weight(b, b_t, g, fwd_dtype, 3 - fwd_k)
        elif g in (ScalingGranularity.ROWWISE, ScalingGranularity.MX_BLOCKWISE):
            qb, sb, rows = quantize_weight(b, fwd_dtype, g, transpose=not trans_b)
        else:
            wq, ws = quantize_weight_blocks(b, fwd_dtype, g)
            qb, sb, rows = orient_weight(wq, ws, transpose=not trans_b)
        out = grouped_fp8_mm(qa, sa, qb, sb, group_lens, group_offs, rows, out_dtype, num_sms)
        # The wgrad reads a in high precision (dequantized when it came quantized).
        a_hp = (a.dequantize() if ctx.needs_input_grad[1] else None) if isinstance(a, QuantizedTensor) else a
        b_hp = None if isinstance(b, QuantizedTensor) else b
        qd, sd = (dgrad_b[0], dgrad_b[1]) if dgrad_b else (None, None)
        ctx.save_for_backward(a_hp, b_hp, group_lens, group_offs, wq, ws, qd, sd)
        ctx.dgrad_rows = dgrad_b[2] if dgrad_b else None
        ctx.num_sms = num_sms
        ctx.fp8_wgrad = FP8_WGRAD and g != ScalingGranularity.MX_BLOCKWISE  # (no MX token packing)
        ctx.trans_b, ctx.g, ctx.fwd_dtype, ctx.grad_dtype = trans_b, g, fwd_dtype, grad_dtype
        ctx.a_dtype, ctx.b_dtype = a.dtype, b.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b, group_lens, group_offs, wq, ws, qd, sd = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            qg, sg = quantize_rows(grad_out.contiguous(), ctx.grad_dtype, ctx.g)
            # dgrad's B is op(b) [G, K, N]: b's transpose with trans_b, else b itself.
            if qd is not None:
                qb, sb, rows = qd, sd, ctx.dgrad_rows
            elif wq is None:
                qb, sb, rows = quantize_weight(b, ctx.fwd_dtype, ctx.g, transpose=ctx.trans_b)
            else:
                qb, sb, rows = orient_weight(wq, ws, transpose=ctx.trans_b)
            grad_a = grouped_fp8_mm(qg, sg, qb, sb, group_lens, group_offs, rows, ctx.a_dtype, ctx.num_sms)
        if ctx.needs_input_grad[1] and ctx.fp8_wgrad:
            grad_b = grouped_fp8_wgrad(
                a,
                grad_out.contiguous(),
                group_lens,
                group_offs,
                ctx.trans_b,
                ctx.fwd_dtype,
                ctx.grad_dtype,
                ctx.g,
                ctx.b_dtype,
                ctx.num_sms,
            )
        elif ctx.needs_input_grad[1]:
            # Variable-K wgrad on the bf16/fp16 grouped GEMM (module docstring says why).
            grad_b = _grouped_gemm_wgrad_op(
                a, grad_out.to(a.dtype).contiguous(), group_lens, group_offs, ctx.trans_b, ctx.num_sms
            )
            grad_b = grad_b.to(ctx.b_dtype)
        return grad_a, grad_b, None, None, None, None, None, None, None, None


def _fwd_fake(a, b, group_lens, group_offs, trans_b, out_dtype, fwd_dtype, granularity, num_sms, for_backward,
              b_q=None, b_s=None, b_rows=0, fast_accum=False):
    out_dtype, k, n = check_hp_operands("grouped_gemm_fp8", a, b, group_lens, group_offs, trans_b, out_dtype, FP8_ROWS)
    out = a.new_empty((a.shape[0], n), dtype=out_dtype)
    # ROWWISE experts whose rows are not a multiple of 128: the backward quantizes b again, along N;
    # a given b_q: nothing quantized to keep
    if not for_backward or (granularity == 1 and b.shape[1] % _BLOCK) or b_q is not None:
        return out, library.placeholder(a), library.placeholder(a)
    # The dgrad's B: op(b) [G, K, N], K-major along N; scales per tensor, per row of it, per block.
    g = b.shape[0]
    s = () if granularity == 0 else (g, k, 1) if granularity == 1 else (g, _cdiv(k, _BLOCK), _cdiv(n, _BLOCK))
    return out, b.new_empty((g, k, n), dtype=fwd_dtype), b.new_empty(s, dtype=torch.float32)


def _bwd_fake(grad_out, a, b, wq, ws, group_lens, group_offs, trans_b, grad_dtype, fwd_dtype, granularity, num_sms,
              need_a, need_b, d_q=None, d_s=None, d_rows=0):
    grad_a = a.new_empty(a.shape) if need_a else library.placeholder(a)
    grad_b = a.new_empty(b.shape) if need_b else library.placeholder(a)
    return grad_a, grad_b


library.register_fake("grouped_gemm_fp8_fwd", _fwd_fake)
library.register_fake("grouped_gemm_fp8_bwd", _bwd_fake)
_fwd_op = native.ops.grouped_gemm_fp8_fwd.default
_bwd_op = native.ops.grouped_gemm_fp8_bwd.default


def _train_fake(a, b, group_lens, group_offs, trans_b, out_dtype, fwd_dtype, grad_dtype, granularity, num_sms,
                b_q=None, b_s=None, b_rows=0, d_q=None, d_s=None, d_rows=0, fast_accum=False):
    return _fwd_fake(a, b, group_lens, group_offs, trans_b, out_dtype, fwd_dtype, granularity, num_sms, False)[0]


# With the C++ autograd (bindings/torch_autograd/grouped_gemm_fp8_autograd.cpp): forward and backward
# of a training call without Python in between (bf16/fp16 wgrad only).
_train_op = native.training_op("grouped_gemm_fp8_train", _train_fake)


class NativeGroupedGemmFp8Function(torch.autograd.Function):
    """bf16/fp16 ``a`` and ``b`` at TENSORWISE, ROWWISE or BLOCKWISE: one native call per direction
    (quantization, scale layouts, weight orientation and the launches in C++)."""

    @staticmethod
    def forward(ctx, a, b, group_lens, group_offs, trans_b: bool, out_dtype, fmt: Format, g: ScalingGranularity,
                num_sms: int, fast_accum: bool = False):
        fwd_dtype, grad_dtype = _dtypes(fmt)
        code = _NATIVE_GRANULARITY[g]
        out, wq, ws = _fwd_op(a, b, group_lens, group_offs, trans_b, out_dtype, fwd_dtype, code, num_sms,
                              ctx.needs_input_grad[0], fast_accum=fast_accum)
        ctx.save_for_backward(a, b, group_lens, group_offs, wq, ws)
        ctx.trans_b, ctx.g, ctx.code, ctx.num_sms = trans_b, g, code, num_sms
        ctx.fwd_dtype, ctx.grad_dtype = fwd_dtype, grad_dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b, group_lens, group_offs, wq, ws = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        fp8_wgrad = need_b and FP8_WGRAD
        grad_a, grad_b = _bwd_op(grad_out, a, b, wq, ws, group_lens, group_offs, ctx.trans_b, ctx.grad_dtype,
                                 ctx.fwd_dtype, ctx.code, ctx.num_sms, need_a, need_b and not fp8_wgrad)
        if fp8_wgrad:
            grad_b = grouped_fp8_wgrad(a, grad_out.contiguous(), group_lens, group_offs, ctx.trans_b, ctx.fwd_dtype,
                                       ctx.grad_dtype, ctx.g, b.dtype, ctx.num_sms)
        return grad_a if need_a else None, grad_b if need_b else None, None, None, None, None, None, None, None, None


def plain_hp_operands(a, b) -> bool:
    """Whether a native low-precision grouped op takes these operands: plain (not quantized)
    bf16/fp16 CUDA tensors a [M, K] and b [G, ., .] of one dtype, a non-empty problem. Anything else
    (and every error message) goes through the composed path."""
    if isinstance(a, QuantizedTensor) or isinstance(b, QuantizedTensor):
        return False
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or not a.is_cuda:
        return False
    if a.dim() != 2 or b.dim() != 3 or a.dtype not in _IN_DTYPES or b.dtype != a.dtype:
        return False
    return 0 not in a.shape and 0 not in b.shape


def _native_ok(a, b, g) -> bool:
    """plain_hp_operands at a granularity the native path composes, with 128x128 weight blocks that
    stay inside one expert."""
    if g not in _NATIVE_GRANULARITY or not plain_hp_operands(a, b):
        return False
    return g != ScalingGranularity.BLOCKWISE or b.shape[1] % _BLOCK == 0


# ---- public op ----------------------------------------------------------------------------------


def _check_config(config) -> Float8QuantConfig:
    if config is None:
        return Float8QuantConfig()
    if not isinstance(config, Float8QuantConfig):
        raise TypeError(f"grouped_gemm_fp8: config must be a Float8QuantConfig or None, got {type(config).__name__}")
    g = config.granularity
    if g == ScalingGranularity.MX_BLOCKWISE and config.block_size != _mx_blocks.MX_BLOCK:
        raise ValueError(f"grouped_gemm_fp8: MX_BLOCKWISE supports block_size=32, got {config.block_size}")
    if g == ScalingGranularity.BLOCKWISE and config.block_size != _BLOCK:
        raise ValueError(f"grouped_gemm_fp8: BLOCKWISE supports block_size=128, got {config.block_size}")
    return config


def _prequantized_forward(a, b, group_lens, group_offs, trans_b, out_dtype, g, num_sms):
    if g == ScalingGranularity.MX_BLOCKWISE:
        raise NotImplementedError(
            "grouped_gemm_fp8: pre-quantized (q, scale_inv) tuples take TENSORWISE, ROWWISE or BLOCKWISE; pass MX "
            "operands as QuantizedTensors"
        )
    for name, pair in (("a", a), ("b", b)):
        if len(pair) != 2:
            raise TypeError(f"grouped_gemm_fp8: pre-quantized '{name}' must be a pair (q, scale_inv), got {len(pair)} items")
    qa, sa = a
    qb, sb = b
    if not isinstance(qa, torch.Tensor) or qa.dtype not in _FP8_DTYPES or qa.dim() != 2:
        raise TypeError("grouped_gemm_fp8: pre-quantized 'a' must be (q, scale_inv) with q a 2-D float8 tensor [M, K]")
    if not isinstance(qb, torch.Tensor) or qb.dtype not in _FP8_DTYPES or qb.dim() != 3:
        raise TypeError(
            "grouped_gemm_fp8: pre-quantized 'b' must be (q, scale_inv) with q a 3-D float8 tensor [G, N, K]"
        )
    if not trans_b:
        raise ValueError(
            "grouped_gemm_fp8: a pre-quantized 'b' must be stored [G, N, K] (trans_b=True), quantized along K"
        )
    if out_dtype is None:
        raise ValueError("grouped_gemm_fp8: out_dtype is required when the operands are pre-quantized")
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"grouped_gemm_fp8: out_dtype {out_dtype} is not supported; expected bfloat16, float16 or float32")
    m, k = qa.shape
    n_groups, n, kb_ = qb.shape
    if kb_ != k:
        raise ValueError(
            f"grouped_gemm_fp8: inner dimensions do not match: a is {tuple(qa.shape)}, b is {tuple(qb.shape)}"
        )
    n_align = 16 // out_dtype.itemsize  # the output's rows are written 16 bytes at a time
    if k % 16 or n % n_align:
        raise ValueError(
            f"grouped_gemm_fp8: K={k} must be a multiple of 16 (FP8 rows are read 16 bytes at a time) and N={n} of "
            f"{n_align} (a {out_dtype} output row in 16-byte stores)"
        )
    _check_groups(group_lens, group_offs, n_groups)
    kb = _cdiv(k, _BLOCK)
    for name, s in (("a", sa), ("b", sb)):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
            raise TypeError(f"grouped_gemm_fp8: pre-quantized '{name}' scale_inv must be a float32 tensor")
    if g == ScalingGranularity.BLOCKWISE:
        want_a, want_b, rows = (m, kb), (n_groups, _cdiv(n, _BLOCK), kb), 128
    elif g == ScalingGranularity.ROWWISE:
        want_a, want_b, rows = (m, 1), (n_groups, n, 1), 1
    else:  # the weight's one scale is stated per 128x128 block, as quantize_weight states it
        want_a, want_b, rows = (), (), 128
    if sa.numel() != (1 if not want_a else int(torch.Size(want_a).numel())) or (want_a and tuple(sa.shape) != want_a):
        raise ValueError(
            f"grouped_gemm_fp8: pre-quantized 'a' scale_inv has shape {tuple(sa.shape)}; expected {list(want_a)}"
        )
    if sb.numel() != (1 if not want_b else int(torch.Size(want_b).numel())) or (want_b and tuple(sb.shape) != want_b):
        raise ValueError(
            f"grouped_gemm_fp8: pre-quantized 'b' scale_inv has shape {tuple(sb.shape)}; expected {list(want_b)}"
        )
    extra = {"group_offs": group_offs} if isinstance(group_offs, torch.Tensor) else {}
    check_cuda_tensors("grouped_gemm_fp8", a=qa, b=qb, a_scale_inv=sa, b_scale_inv=sb, group_lens=group_lens, **extra)
    if g == ScalingGranularity.ROWWISE:  # the row-scaled kernel, as the native ROWWISE path runs it
        sa, sb, rows = sa.reshape(m), sb.reshape(n_groups, n), 0
    elif g != ScalingGranularity.BLOCKWISE:
        sa = sa.float().reshape(-1, 1).expand(m, kb)
    if g == ScalingGranularity.TENSORWISE:
        sb = _stated_per_block(sb, n_groups, n, k)
    return grouped_fp8_mm(qa, sa.contiguous(), qb, sb.contiguous(), group_lens, group_offs, rows, out_dtype, num_sms)


Operand = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


# What an FP8 grouped GEMM needs of K and N (check_hp_operands' multiple and reason).
FP8_ROWS = (16, "FP8 operands are read in 16-byte rows, and the dgrad reads rows of length N")


def check_hp_operands(op: str, a, b, group_lens, group_offs, trans_b: bool, out_dtype, rows: tuple = (1, "")):
    """Checks bf16/fp16 operands of a low-precision grouped GEMM (a [M, K], b [G, N, K] with
    trans_b, else [G, K, N]) and the group tensors, one CUDA device for all, then K and N multiples
    of ``rows[0]`` (why: ``rows[1]``); returns (out_dtype, K, N). Also the native ops' fake
    implementations: a traced call gets the device error an eager one gets."""
    for name, t, nd in (("a", a, 2), ("b", b, 3)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != nd:
            raise ValueError(f"{op}: argument '{name}' must be {nd}-D, got shape {tuple(t.shape)}")
        if t.dtype not in _IN_DTYPES:
            raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}; expected bfloat16 or float16")
    if b.dtype != a.dtype:
        raise TypeError(f"{op}: argument 'b' has dtype {b.dtype}; expected the dtype of 'a' ({a.dtype})")
    out_dtype = a.dtype if out_dtype is None else out_dtype
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"{op}: out_dtype {out_dtype} is not supported; expected bfloat16, float16 or float32")
    _check_groups(group_lens, group_offs, b.shape[0])
    k = a.shape[1]
    kb, n = (b.shape[2], b.shape[1]) if trans_b else (b.shape[1], b.shape[2])
    if kb != k:
        raise ValueError(
            f"{op}: inner dimensions do not match: 'a' is {tuple(a.shape)} but 'b' {tuple(b.shape)} "
            f"has K = {kb} (trans_b={trans_b})"
        )
    offs = {} if group_offs is None else {"group_offs": group_offs}
    check_cuda_tensors(op, a=a, b=b, group_lens=group_lens, **offs)
    check_group_lens_debug(op, group_lens, a.shape[0])
    multiple, reason = rows
    if k % multiple or n % multiple:
        raise ValueError(f"{op}: K={k} and N={n} must be multiples of {multiple} ({reason})")
    return out_dtype, k, n


@native.raises_python_errors
def grouped_gemm_fp8(
    a: Operand,
    b: Operand,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    trans_b: bool = True,
    out_dtype: torch.dtype | None = None,
    config: Float8QuantConfig | None = None,
    num_cu: int | None = None,
    fuse_bgrad_accum_pattern: str | None = None,
) -> torch.Tensor:
    """Per-group ``a[rows of g] @ op(b[g])`` in FP8: the expert layers of a mixture of experts.

    Args:
        a: ``[M, K]`` tokens sorted by group, bfloat16 or float16, on a CUDA device.
        b: ``[G, N, K]`` with ``trans_b`` (the default, ``torch.nn.Linear`` layout per expert), else
            ``[G, K, N]``; same dtype as ``a``.
        group_lens: int64 ``[G]`` on a's device; never copied to the host (no sync; CUDA-graph
            capturable, sizes may change between replays).
        group_offs: optional int64 ``[G + 1]`` group starts (default: prefix sum of group_lens).
        out_dtype: bfloat16, float16 or float32 (default: a's dtype).
        config: :class:`Float8QuantConfig` (default E4M3 TENSORWISE): TENSORWISE, ROWWISE,
            BLOCKWISE (block_size=128: 1x128 per token for ``a`` and the output gradient, 128x128
            per expert for ``b``) or MX_BLOCKWISE (block_size=32, E8M0 per 32 along each GEMM's K,
            the weight included; emulated on Hopper as the dense MX path: the four scales of a
            128-deep K block restated as one power of two for the block-scaled kernel); E4M3,
            E5M2 or HYBRID (E5M2 output gradient).
        num_cu: SMs the persistent FP8 kernels may use (default: all), e.g. to leave room for
            overlapped communication; rounded down to an even count (clusters of 2 CTAs).
        fuse_bgrad_accum_pattern: ``"megatron"``: b's gradient is added into ``b.main_grad`` after
            the wgrad GEMM and autograd gets a placeholder (as ``grouped_gemm``).

    Differentiable in ``a`` (FP8 dgrad at the same granularity) and ``b`` (bf16/fp16 grouped
    wgrad; an expert with no tokens gets a zero gradient). QuantizedTensor operands, forward and
    backward: ``b`` a 3-D :class:`QuantizedTensor` quantized along K (dim 2 with ``trans_b``,
    else 1; TENSORWISE and 128x128 2-D blocks either way) or a :class:`QuantizedTensorPair` whose
    ``data_t`` (along N) the dgrad reads (e.g. ``create_quantized_weight(w, ...,
    need_weight_transpose_cache=True)``); ``a`` a 2-D QuantizedTensor along K (TENSORWISE,
    ROWWISE, BLOCKWISE 1x128, tokens unpadded). Their gradients are the high-precision ones
    (the wgrad reads ``a`` dequantized). Pre-quantized tuples (forward only):
    ``a=(q [M, K], scale_inv)``, ``b=(q [G, N, K], scale_inv)`` with ``trans_b=True`` and
    ``out_dtype``; scale_inv as ``quantize_fp8`` returns it along K (0-dim / ``[M, 1]`` /
    ``[M, ceil(K/128)]`` for ``a``; 0-dim / ``[G, N, 1]`` / ``[G, ceil(N/128), ceil(K/128)]`` for
    ``b``). K must be a multiple of 16, and N too (FP8 rows are read 16 bytes at a time).
    """
    config = _check_config(config)
    trans_b = flag("grouped_gemm_fp8", "trans_b", trans_b)
    g = config.granularity
    num_sms = check_num_cu("grouped_gemm_fp8", num_cu)
    if _qo.is_quantized(a) or _qo.is_quantized(b):
        return _quantized_forward(a, b, group_lens, group_offs, trans_b, out_dtype, config, num_sms,
                                  fuse_bgrad_accum_pattern)
    if fuse_bgrad_accum_pattern is not None and isinstance(b, torch.Tensor):
        b = route_wgrad_to_main_grad(b, fuse_bgrad_accum_pattern)
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)):
            raise TypeError("grouped_gemm_fp8: pass both 'a' and 'b' pre-quantized, or neither")
        if fuse_bgrad_accum_pattern is not None:
            raise ValueError(
                "grouped_gemm_fp8: fuse_bgrad_accum_pattern needs a trainable weight; pre-quantized (q, scale_inv) "
                "tuples have no backward"
            )
        return _prequantized_forward(a, b, group_lens, group_offs, trans_b, out_dtype, g, num_sms)
    if _native_ok(a, b, g):  # checks, quantization and launches in C++
        if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):  # no backward: the product only
            out_dt = a.dtype if out_dtype is None else out_dtype
            return _fwd_op(a, b, group_lens, group_offs, trans_b, out_dt, _dtypes(config.format)[0],
                           _NATIVE_GRANULARITY[g], num_sms, False, fast_accum=config.fast_accum)[0]
        if not FP8_WGRAD and native.eager_cpp_autograd():
            fwd_dtype, grad_dtype = _dtypes(config.format)
            return _train_op(a, b, group_lens, group_offs, trans_b, a.dtype if out_dtype is None else out_dtype,
                             fwd_dtype, grad_dtype, _NATIVE_GRANULARITY[g], num_sms, fast_accum=config.fast_accum)
        return NativeGroupedGemmFp8Function.apply(
            a, b, group_lens, group_offs, trans_b, a.dtype if out_dtype is None else out_dtype, config.format, g,
            num_sms, config.fast_accum,
        )
    out_dtype, k, n = check_hp_operands("grouped_gemm_fp8", a, b, group_lens, group_offs, trans_b, out_dtype, FP8_ROWS)
    if a.shape[0] == 0 or n == 0 or k == 0:  # nothing to quantize: the bf16 op's exact empty / zero result
        return grouped_gemm(a, b, group_lens, group_offs, trans_b=trans_b, num_cu=num_cu).to(out_dtype)
    return GroupedGemmFp8Function.apply(
        a, b, None, group_lens, group_offs, trans_b, out_dtype, config.format, g, num_sms
    )


def cached_weight_native_ok(a, weight, config) -> bool:
    """Whether a layer's per-step FP8 weight cache can feed the native training op: eager mode with
    the C++ autograd, no FP8 wgrad, and tokens ``a`` and ``weight`` ``[G, N, K]`` that the uncached
    layer would send to the native op too (``_native_ok``: bf16/fp16, nothing empty, BLOCKWISE
    experts of whole 128-row blocks). The rest (a rank with no tokens, say) takes the layer's
    uncached call."""
    return (
        _train_op is not None and not FP8_WGRAD and native.eager_cpp_autograd()
        and _native_ok(a, weight, config.granularity)
    )


def _weight_rows_fake(w, out_dtype):
    g, n, k = w.shape
    return (w.new_empty((g, n, k), dtype=out_dtype), w.new_empty((g, n), dtype=torch.float32),
            w.new_empty((g, k, n), dtype=out_dtype), w.new_empty((g, k), dtype=torch.float32))


library.register_fake("grouped_weight_rows_fp8", _weight_rows_fake)
_weight_rows_op = native.ops.grouped_weight_rows_fp8.default


def weight_rows_native_ok(w: torch.Tensor, config) -> bool:
    """Whether a weight stack's ROWWISE per-step copies come from :func:`grouped_weight_rows`: 3-D
    bf16/fp16 on CUDA, each expert's rows a multiple of 128, K of 16, nothing empty."""
    return (
        config.granularity == ScalingGranularity.ROWWISE and w.dim() == 3 and w.is_cuda and w.dtype in _IN_DTYPES
        and w.numel() > 0 and w.shape[1] % _BLOCK == 0 and w.shape[2] % 16 == 0
    )


@native.raises_python_errors
def grouped_weight_rows(w: torch.Tensor, dtype: torch.dtype):
    """A ROWWISE weight stack ``w [G, N, K]`` (``trans_b`` layout) quantized in one native pass into
    both copies the grouped kernels read, one scale a row each: ``(q [G, N, K], s [G, N])`` for the
    forward and ``(q_t [G, K, N], s_t [G, K])`` for the dgrad, the values the uncached training
    forward makes. The caller checked :func:`weight_rows_native_ok`."""
    with torch.no_grad():
        return _weight_rows_op(w.detach(), dtype)


def _train_given_weight(a, weight, group_lens, group_offs, config, num_sms: int, fwd, dgrad):
    """The native training op with the weight's copies given in the kernel's layout: ``fwd`` the
    forward's ``(q, s, rows)``, ``dgrad()`` the dgrad's, asked for only when ``a`` will get a
    gradient. ``weight`` receives the bf16/fp16 wgrad."""
    fwd_dtype, grad_dtype = _dtypes(config.format)
    qd, sd, d_rows = dgrad() if a.requires_grad and torch.is_grad_enabled() else (None, None, 0)
    return _train_op(a, weight, group_lens, group_offs, True, a.dtype, fwd_dtype, grad_dtype,
                     _NATIVE_GRANULARITY[config.granularity], num_sms, *fwd, qd, sd, d_rows,
                     fast_accum=config.fast_accum)


@native.raises_python_errors
def grouped_gemm_fp8_rows_cached(a, weight, q, s, q_t, s_t, group_lens, group_offs, config, num_sms: int = 0):
    """``grouped_gemm_fp8(a, weight, ..., trans_b=True)`` at ROWWISE with the weight's copies from
    :func:`grouped_weight_rows` (a layer's per-step cache, one scale a row: rows 0): the native
    training op quantizes only the tokens and the output gradient; ``weight`` receives the
    bf16/fp16 wgrad. The caller checked ``cached_weight_native_ok``."""
    return _train_given_weight(a, weight, group_lens, group_offs, config, num_sms, (q, s, 0), lambda: (q_t, s_t, 0))


@native.raises_python_errors
def grouped_gemm_fp8_cached_weight(a, weight, data, data_t, group_lens, group_offs, config, num_sms: int = 0):
    """``grouped_gemm_fp8(a, weight, ..., trans_b=True)`` with the weight ``[G, N, K]`` already quantized
    for this optimizer step (``data`` along K, ``data_t`` along N, as ``create_quantized_weight`` makes
    them): their kernel layouts (restated once, kept with the copies) go to the native training op,
    which quantizes only the tokens and the output gradient; ``weight`` receives the bf16/fp16 wgrad.
    The caller checked ``cached_weight_native_ok``."""
    fwd_dtype = _dtypes(config.format)[0]
    return _train_given_weight(
        a, weight, group_lens, group_offs, config, num_sms, _qo.grouped_weight("grouped_gemm_fp8", "b", data, 2),
        lambda: _dgrad_weight(data, data_t, config.granularity, fwd_dtype, 1),
    )


def _quantized_forward(a, b, group_lens, group_offs, trans_b: bool, out_dtype, config, num_sms: int, pattern):
    """grouped_gemm_fp8 with a QuantizedTensor (or pair) for ``a`` and/or ``b``; differentiable."""
    op = "grouped_gemm_fp8"
    a, _ = _qo.split_pair(op, "a", a, config)  # the wgrad reads a in high precision: a's other copy has no use
    b, b_t = _qo.split_pair(op, "b", b, config)
    for name, x, nd in (("a", a, 2), ("b", b, 3)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor or QuantizedTensor, got {type(x).__name__}")
        if x.dim() != nd:
            raise ValueError(f"{op}: argument '{name}' must be {nd}-D, got shape {tuple(x.shape)}")
        if x.dtype not in _IN_DTYPES:  # a QuantizedTensor's dtype is the one it stands for
            raise TypeError(f"{op}: argument '{name}' has dtype {x.dtype}; expected bfloat16 or float16")
    _check_groups(group_lens, group_offs, b.shape[0])
    k = a.shape[1]
    kb, n = (b.shape[2], b.shape[1]) if trans_b else (b.shape[1], b.shape[2])
    if kb != k:
        raise ValueError(f"{op}: inner dimensions do not match: 'a' is {tuple(a.shape)} but 'b' {tuple(b.shape)} "
                         f"has K = {kb} (trans_b={trans_b})")
    if k % 16 or n % 16 or k == 0:
        raise ValueError(f"{op}: K={k} and N={n} must be multiples of 16, K > 0 (FP8 operands are read in 16-byte rows)")
    out_dtype = a.dtype if out_dtype is None else out_dtype
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"{op}: out_dtype {out_dtype} is not supported; expected bfloat16, float16 or float32")
    offs = {} if group_offs is None else {"group_offs": group_offs}
    check_cuda_tensors(op, a=a, b=b, group_lens=group_lens, **offs)
    check_group_lens_debug(op, group_lens, a.shape[0])
    if pattern is not None:
        b = route_wgrad_to_main_grad(b, pattern)
    return GroupedGemmFp8Function.apply(
        a, b, b_t, group_lens, group_offs, trans_b, out_dtype, config.format, config.granularity, num_sms
    )
