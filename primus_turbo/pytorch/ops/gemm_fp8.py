"""turbo.ops.gemm_fp8: bf16/fp16 in -> FP8 quantization -> FP8 GEMM -> out_dtype, forward and backward.

Hopper's FP8 tensor cores read both operands K-major, so every GEMM here is
``out[R, C] = (A * sA)[R, K] @ (B * sB)[C, K]^T`` over row-major FP8 operands quantized along K.
One fused quantization of each input yields its row-major copy and its transposed copy (quantized
along the other dimension); the forward uses one, the backward the other, so nothing is quantized
twice. Layout bookkeeping, with ``op(a)`` ``[M, K]`` and ``op(b)`` ``[K, N]``::

    forward  out    = op(a)  [M,K]          x op(b)^T [N,K]
    dgrad    d op(a)= grad   [M,N] along N  x op(b)   [K,N] along N
    wgrad    d op(b)= op(a)^T[K,M] along M  x grad^T  [N,M] along M
"""

import ctypes

import torch
import torch.nn.functional as F

from primus_turbo._core import PtTensor, check, lib
from primus_turbo._core.lib import string_out
from primus_turbo.pytorch.core import autotune, library, native
from primus_turbo.pytorch.core.backend import BackendType, OpFamily, PrecisionType, settings_token
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor, QuantizedTensorPair
from primus_turbo.pytorch.core.tensor_bridge import (
    current_stream_handle,
    device_guard,
    empty_like_pt,
    to_pt,
    workspace,
)
from primus_turbo.pytorch.ops import _fp8_quant, _mx_blocks
from primus_turbo.pytorch.ops import _quantized_operands as _qo
from primus_turbo.pytorch.ops._checks import (
    check_cuda_tensors,
    check_main_grad,
    check_main_grad_pattern,
    dummy_wgrad,
    flag,
    route_wgrad_to_main_grad,
)

__all__ = ["gemm_fp8"]

_IN_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_E8M0 = getattr(torch, "float8_e8m0fnu", torch.uint8)

# pt_fp8_scaling codes (csrc/include/primus_turbo/gemm_fp8.h), defined once with the operand restatements.
TENSOR, ROW, BLOCK_1x128, BLOCK_128x128 = _qo.TENSOR, _qo.ROW, _qo.BLOCK_1x128, _qo.BLOCK_128x128


# ---- the FP8 GEMM kernel call: out = (a * sa) @ (b * sb)^T ------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kernel_scale(scale_inv: torch.Tensor, scaling: int, rows: int, k: int) -> torch.Tensor:
    """The quantizer's scale_inv (see quantize_fp8) in the layout the GEMM reads (gemm_fp8.h):
    tensor -> 0-dim, row -> [rows], 1x128 -> [kb, round_up(rows, 4)] rows-contiguous,
    128x128 -> [ceil(rows/128), round_up(kb, 4)]. A few hundred bytes: one small torch op."""
    s = scale_inv.float()
    if scaling == TENSOR:
        return s.reshape(())
    if scaling == ROW:
        return s.reshape(rows)
    if scaling == BLOCK_1x128:
        return F.pad(s.reshape(rows, _cdiv(k, 128)).t(), (0, (-rows) % 4)).contiguous()
    kb = _cdiv(k, 128)
    return F.pad(s.reshape(_cdiv(rows, 128), kb), (0, (-kb) % 4)).contiguous()


class _GemmFp8PlanRequest(ctypes.Structure):
    """GemmFp8PlanRequest (csrc/bindings/torch/plan_cache.h)."""

    _fields_ = [
        ("a", ctypes.POINTER(PtTensor)),
        ("a_scale", ctypes.POINTER(PtTensor)),
        ("a_scaling", ctypes.c_int32),
        ("b", ctypes.POINTER(PtTensor)),
        ("b_scale", ctypes.POINTER(PtTensor)),
        ("b_scaling", ctypes.c_int32),
        ("d", ctypes.POINTER(PtTensor)),
        ("beta", ctypes.c_float),
        ("flags", ctypes.c_int32),
    ]


class Fp8GemmProblem(autotune.TunableProblem):
    op = OpFamily.GEMM
    precision = PrecisionType.FP8
    default_backend = BackendType.CUBLASLT
    backends = (BackendType.CUBLASLT, BackendType.CUTLASS)

    def __init__(self, args: tuple, device: torch.device):
        """args: pt_gemm_fp8's (a, a_scale, a_scaling, b, b_scale, b_scaling, d, beta, flags) descriptors."""
        self._args, self.beta, self.device = args, float(args[7]), device
        self.stream = current_stream_handle(device)
        self._scratch = None

    @classmethod
    def from_tensors(cls, a, sa, a_scaling, b, sb, b_scaling, out, beta, flags: int = 0) -> "Fp8GemmProblem":
        args = (to_pt(a), to_pt(sa), a_scaling, to_pt(b), to_pt(sb), b_scaling, to_pt(out), float(beta), int(flags))
        return cls(args, out.device)

    @classmethod
    def from_request(cls, request: int, device: int) -> "Fp8GemmProblem":
        """From the native op's planner request (GemmFp8PlanRequest, alive during the call)."""
        r = _GemmFp8PlanRequest.from_address(request)
        copy = PtTensor.from_buffer_copy
        args = (
            copy(r.a.contents), copy(r.a_scale.contents), r.a_scaling, copy(r.b.contents),
            copy(r.b_scale.contents), r.b_scaling, copy(r.d.contents), r.beta, r.flags,
        )
        return cls(args, torch.device("cuda", device))

    def key(self) -> str:
        return "fp8|" + string_out(lib.pt_gemm_fp8_problem_key, *self._args, size=512)

    def query(self, backend: BackendType):
        accepted, n = ctypes.c_int32(), ctypes.c_int32()
        reason = ctypes.create_string_buffer(1024)
        check(lib.pt_gemm_fp8_query(*self._args, backend.value, ctypes.byref(accepted), ctypes.byref(n), reason, 1024))
        return bool(accepted.value), n.value, reason.value.decode()

    def run(self, backend: BackendType, config: int, for_tuning: bool = False) -> None:
        args = self._args
        if for_tuning and self.beta != 0.0:  # profiling must not accumulate into the caller's tensor
            if self._scratch is None:
                self._scratch = empty_like_pt(args[6], self.device).zero_()
            args = args[:6] + (to_pt(self._scratch), self.beta, args[8])
        ws = workspace(self.device)
        status = lib.pt_gemm_fp8(*args, backend.value, config, ws.data_ptr(), ws.numel(), self.stream)
        if status:
            check(status, context=f"gemm_fp8 on {backend.name}")


# Plan key -> (backend, config): after the first call of a problem, a call skips backend
# resolution and the autotune lookup.
_plans = {}


def _run(a, sa, a_scaling, b, sb, b_scaling, out, beta) -> None:
    if out.numel() == 0:
        return
    key = (
        a.shape, a.stride(), b.shape, b.stride(), out.stride(), a.dtype, b.dtype, out.dtype, a_scaling, b_scaling,
        beta, out.device.index, a.data_ptr() % 16, b.data_ptr() % 16, out.data_ptr() % 16,
        settings_token(OpFamily.GEMM),
    )
    with device_guard(out.device):
        problem = Fp8GemmProblem.from_tensors(a, sa, a_scaling, b, sb, b_scaling, out, beta)
        choice = _plans.get(key)
        if choice is None:
            choice = autotune.select(problem, out.device)
            if not torch.cuda.is_current_stream_capturing():
                _plans[key] = choice
        problem.run(*choice)


def _fp8_mm_cuda(a, sa, a_scaling: int, b, sb, b_scaling: int, out_dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty((a.shape[0], b.shape[0]), dtype=out_dtype, device=a.device)
    _run(a, sa, a_scaling, b, sb, b_scaling, out, 0.0)
    return out


def _fp8_mm_fake(a, sa, a_scaling, b, sb, b_scaling, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def _fp8_mm_accum_cuda(a, sa, a_scaling: int, b, sb, b_scaling: int, out) -> None:
    _run(a, sa, a_scaling, b, sb, b_scaling, out, 1.0)


def _fp8_mm_accum_fake(a, sa, a_scaling, b, sb, b_scaling, out):
    return None


_fp8_mm_op = library.define_op(
    "gemm_fp8_mm(Tensor a, Tensor a_scale, int a_scaling, Tensor b, Tensor b_scale, int b_scaling, "
    "ScalarType out_dtype) -> Tensor",
    _fp8_mm_cuda,
    _fp8_mm_fake,
)
_fp8_mm_accum_op = library.define_op(
    "gemm_fp8_mm_accum_(Tensor a, Tensor a_scale, int a_scaling, Tensor b, Tensor b_scale, int b_scaling, "
    "Tensor(a!) out) -> ()",
    _fp8_mm_accum_cuda,
    _fp8_mm_accum_fake,
)


def _as_blocks(a, sa, a_scaling, b, sb, b_scaling):
    """E5M2 x E5M2 has no cuBLASLt kernel: tensorwise / rowwise scales are then restated as 1x128
    block scales (each value repeated over the K blocks) for the block-scaled CUTLASS kernel."""
    if not (a.dtype == b.dtype == torch.float8_e5m2 and a_scaling in (TENSOR, ROW)):
        return sa, a_scaling, sb, b_scaling
    kb = _cdiv(a.shape[1], 128)
    expand = lambda s, rows: s.float().reshape(-1, 1).expand(rows, kb)
    return expand(sa, a.shape[0]), BLOCK_1x128, expand(sb, b.shape[0]), BLOCK_1x128


def fp8_mm(a, sa, a_scaling: int, b, sb, b_scaling: int, out_dtype) -> torch.Tensor:
    """out[R, C] = (a * sa) @ (b * sb)^T for K-major FP8 a [R, K], b [C, K], scales as quantized
    along K (quantize_fp8 layouts); the binding of every FP8 GEMM below."""
    k = a.shape[1]
    sa, a_scaling, sb, b_scaling = _as_blocks(a, sa, a_scaling, b, sb, b_scaling)
    return _fp8_mm_op(
        a, kernel_scale(sa, a_scaling, a.shape[0], k), a_scaling,
        b, kernel_scale(sb, b_scaling, b.shape[0], k), b_scaling, out_dtype,
    )


def fp8_mm_accum_(a, sa, a_scaling: int, b, sb, b_scaling: int, out: torch.Tensor) -> None:
    k = a.shape[1]
    sa, a_scaling, sb, b_scaling = _as_blocks(a, sa, a_scaling, b, sb, b_scaling)
    _fp8_mm_accum_op(
        a, kernel_scale(sa, a_scaling, a.shape[0], k), a_scaling,
        b, kernel_scale(sb, b_scaling, b.shape[0], k), b_scaling, out,
    )


# ---- configuration -> quantization plan -------------------------------------------------------


def _check_config(config) -> Float8QuantConfig:
    if config is None:
        return Float8QuantConfig()
    if not isinstance(config, Float8QuantConfig):
        raise TypeError(f"gemm_fp8: config must be a Float8QuantConfig or None, got {type(config).__name__}")
    g = config.granularity
    if g == ScalingGranularity.MX_BLOCKWISE and config.block_size != _mx_blocks.MX_BLOCK:
        raise ValueError(f"gemm_fp8: MX_BLOCKWISE supports block_size=32, got {config.block_size}")
    if g == ScalingGranularity.BLOCKWISE and config.block_size != 128:
        raise ValueError(f"gemm_fp8: BLOCKWISE supports block_size=128, got {config.block_size}")
    return config


def _dtypes(fmt: Format) -> tuple[torch.dtype, torch.dtype]:
    """(operand dtype, output-gradient dtype)."""
    if fmt == Format.E4M3:
        return torch.float8_e4m3fn, torch.float8_e4m3fn
    if fmt == Format.E5M2:
        return torch.float8_e5m2, torch.float8_e5m2
    return torch.float8_e4m3fn, torch.float8_e5m2  # HYBRID


def _scalings(g: ScalingGranularity) -> tuple[int, int]:
    """(activation / gradient scaling, weight scaling)."""
    if g == ScalingGranularity.TENSORWISE:
        return TENSOR, TENSOR
    if g == ScalingGranularity.ROWWISE:
        return ROW, ROW
    if g == ScalingGranularity.MX_BLOCKWISE:  # per-32 E8M0 along K, restated as 1x128 blocks
        return BLOCK_1x128, BLOCK_1x128
    return BLOCK_1x128, BLOCK_128x128


def _quantize(x, dtype, g, two_d):
    if g == ScalingGranularity.MX_BLOCKWISE:
        # Both copies MX along their own last dim (1-D blocks of 32: the weight too), then each
        # restated with 1x128 scales for the block-scaled GEMM (see _mx_blocks).
        q_row, s_row, q_col, s_col = _fp8_quant.quantize_with_trans(
            x.contiguous(), dtype, g, _mx_blocks.MX_BLOCK, False
        )
        return (*_mx_blocks.mx_fp8_to_1x128(q_row, s_row), *_mx_blocks.mx_fp8_to_1x128(q_col, s_col))
    return _fp8_quant.quantize_with_trans(x.contiguous(), dtype, g, 128 if g == ScalingGranularity.BLOCKWISE else None, two_d)


# ---- autograd -----------------------------------------------------------------------------


def dgrad_operands(trans_a: bool, grad, b_bwd):
    """The two operands, in order, of the dgrad GEMM ``d op(a) [M, K] = grad [M, N] @ op(b) [K, N]^T``
    (each a tuple of the GEMM's per-operand arguments, both quantized along N): with ``trans_a``
    they swap, so the GEMM writes ``d a`` ``[K, M]`` directly. Shared by gemm_fp8 and gemm_fp4."""
    return (b_bwd, grad) if trans_a else (grad, b_bwd)


def wgrad_operands(trans_b: bool, a_bwd, grad_t):
    """The two operands, in order, of the wgrad GEMM ``d op(b) [K, N] = op(a)^T [K, M] @ grad^T [N, M]^T``
    (both quantized along M): with ``trans_b`` they swap, so the GEMM writes ``d b`` ``[N, K]``."""
    return (grad_t, a_bwd) if trans_b else (a_bwd, grad_t)


def _hp_copies(x, dtype, g, code: int, reduce_dim: int):
    """A high-precision operand's two copies, (along reduce_dim, along the other dim), each
    ``(q, scale_inv, code)`` with q row-major along its last dim: one fused quantization."""
    q_row, s_row, q_col, s_col = _quantize(x, dtype, g, code == BLOCK_128x128)
    row, col = (q_row, s_row, code), (q_col, s_col, code)
    return (row, col) if reduce_dim == 1 else (col, row)


def _requantized(x, dtype, g, code: int, reduce_dim: int):
    """A QuantizedTensor quantized along the wrong dim for this use: dequantized and quantized
    again along reduce_dim (a second rounding; pass the copy in a QuantizedTensorPair to avoid it)."""
    return _hp_copies(x.dequantize(), x.real_dtype, g, code, reduce_dim)[0]


def _operand_copies(name: str, x, x_t, g, dtype, code: int, fwd_dim: int, want_bwd: bool):
    """(forward copy, backward copy or None) of operand ``name``: the forward reduces over dim
    ``fwd_dim`` of x as stored, the backward GEMM that reads x over the other one."""
    if not isinstance(x, QuantizedTensor):
        fwd, bwd = _hp_copies(x, dtype, g, code, fwd_dim)
        return fwd, (bwd if want_bwd else None)
    fwd = _qo.fp8_matrix("gemm_fp8", name, x, fwd_dim)
    if fwd is None:
        raise ValueError(
            f"gemm_fp8: pre-quantized '{name}' is quantized along dim {x.quantized_axis}, but the forward GEMM reduces "
            f"over its dim {fwd_dim} (K): quantize it along K, or pass trans_{name} to match"
        )
    if not want_bwd:
        return fwd, None
    bwd = _qo.backward_copy(
        x, x_t, lambda src: _qo.fp8_matrix("gemm_fp8", f"{name} (backward copy)", src, 1 - fwd_dim),
        lambda src: _requantized(src, dtype, g, code, 1 - fwd_dim),
    )
    return fwd, bwd


class GemmFp8Function(torch.autograd.Function):
    """out = op(a) @ op(b) in FP8, each operand a high-precision tensor (quantized here, both
    copies in one pass) or a QuantizedTensor (read as quantized; ``a_t`` / ``b_t``: the copies its
    backward GEMM reads, else restated from it). Gradients reach either kind as high-precision
    tensors of its shape (straight-through for a QuantizedTensor)."""

    @staticmethod
    def forward(ctx, a, b, a_t, b_t, trans_a: bool, trans_b: bool, out_dtype, fmt: Format, g: ScalingGranularity,
                main_grad):
        fwd_dtype, grad_dtype = _dtypes(fmt)
        act, wgt = _scalings(g)
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1] or main_grad is not None
        # op(a) [M, K] reduces over K (dim 1 of a, 0 with trans_a); op(b)^T [N, K] over dim 0 of b (1 with
        # trans_b). The wgrad reads a over M, the dgrad b over N: the other dims.
        a_fwd, a_bwd = _operand_copies("a", a, a_t, g, fwd_dtype, act, 0 if trans_a else 1, need_b)
        b_fwd, b_bwd = _operand_copies("b", b, b_t, g, fwd_dtype, wgt, 1 if trans_b else 0, need_a)
        out = fp8_mm(*a_fwd, *b_fwd, out_dtype)
        none = a_fwd[0].new_empty(0)
        ctx.save_for_backward(*(a_bwd[:2] if a_bwd else (none, none)), *(b_bwd[:2] if b_bwd else (none, none)))
        ctx.a_code, ctx.b_code = (a_bwd or a_fwd)[2], (b_bwd or b_fwd)[2]
        ctx.trans_a, ctx.trans_b, ctx.g, ctx.grad_dtype, ctx.act = trans_a, trans_b, g, grad_dtype, act
        ctx.a_dtype, ctx.b_dtype, ctx.b_shape = a.dtype, b.dtype, b.shape
        ctx.main_grad, ctx.n_inputs = main_grad, 10
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a_bwd, sa_bwd, b_bwd, sb_bwd = ctx.saved_tensors
        act = ctx.act
        g_row, sg_row, g_col, sg_col = _quantize(grad_out.contiguous(), ctx.grad_dtype, ctx.g, False)
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            # d op(a) [M, K] = grad [M, N] @ op(b) [K, N]^T; transposed operands give d a directly.
            x, y = dgrad_operands(ctx.trans_a, (g_row, sg_row, act), (b_bwd, sb_bwd, ctx.b_code))
            grad_a = fp8_mm(*x, *y, ctx.a_dtype)
        if ctx.needs_input_grad[1] or ctx.main_grad is not None:
            # d op(b) [K, N] = op(a)^T [K, M] @ grad^T [N, M]^T.
            x, y = wgrad_operands(ctx.trans_b, (a_bwd, sa_bwd, ctx.a_code), (g_col, sg_col, act))
            args = (*x, *y)
            if ctx.main_grad is not None and ctx.g == ScalingGranularity.MX_BLOCKWISE:
                # cuBLASLt's block-scaled GEMM does not accumulate: an fp32 product, then one add.
                ctx.main_grad.add_(fp8_mm(*args, torch.float32))
                grad_b = dummy_wgrad(ctx.b_shape, ctx.b_dtype, ctx.main_grad.device)
            elif ctx.main_grad is not None:
                fp8_mm_accum_(*args, ctx.main_grad)
                grad_b = dummy_wgrad(ctx.b_shape, ctx.b_dtype, ctx.main_grad.device)
            else:
                grad_b = fp8_mm(*args, ctx.b_dtype)
        return (grad_a, grad_b) + (None,) * (ctx.n_inputs - 2)


# ---- the native training path (csrc/bindings/torch/gemm_fp8_ops.cpp) ----------------------------
# TENSORWISE, ROWWISE and BLOCKWISE with E4M3 or HYBRID: quantization, scale layouts and the GEMM of
# each direction in one C++ call. MX_BLOCKWISE, E5M2 and pre-quantized operands use the composite
# path above.


native.register_planner(native.PLAN_GEMM_FP8, Fp8GemmProblem.from_request)

# pt_quant_granularity codes of the granularities the native path takes.
_NATIVE_GRANULARITY = {
    ScalingGranularity.TENSORWISE: 0,
    ScalingGranularity.ROWWISE: 1,
    ScalingGranularity.BLOCKWISE: 2,
}


def _fwd_fake(a, b, trans_a, trans_b, out_dtype, fwd_dtype, granularity, for_backward, fast_accum=False):
    out_dtype_, m, k, n = check_hp_operands(
        "gemm_fp8", a, b, trans_a, trans_b, out_dtype, "FP8 GEMM operands are read in 16-byte rows",
        "its transposed FP8 operands have rows of length M and N",
    )
    out = a.new_empty((m, n), dtype=out_dtype)
    if not for_backward:
        return out, *(library.placeholder(a) for _ in range(4))
    s_a = {0: (), 1: (k, 1), 2: (_cdiv(m, 128), k)}[granularity]  # 1x128: MN-major, as the GEMM reads it
    # 128x128: the block count along N rounded up to 4, as the GEMM reads it.
    s_b = {0: (), 1: (k, 1), 2: (_cdiv(k, 128), -(-_cdiv(n, 128) // 4) * 4)}[granularity]
    f32 = torch.float32
    return (
        out, a.new_empty((k, m), dtype=fwd_dtype), a.new_empty(s_a, dtype=f32),
        a.new_empty((k, n), dtype=fwd_dtype), a.new_empty(s_b, dtype=f32),
    )


def _bwd_fake(grad, a_bwd, sa_bwd, b_bwd, sb_bwd, trans_a, trans_b, grad_dtype, granularity, a_dtype, b_dtype,
              need_a, need_b, main_grad):
    m, n, k = grad.shape[0], grad.shape[1], a_bwd.shape[0]
    grad_a = grad.new_empty((k, m) if trans_a else (m, k), dtype=a_dtype) if need_a else library.placeholder(grad)
    wants_b = need_b and main_grad is None
    grad_b = grad.new_empty((n, k) if trans_b else (k, n), dtype=b_dtype) if wants_b else library.placeholder(grad)
    return grad_a, grad_b


def _infer_fake(a, b, trans_a, trans_b, out_dtype, fwd_dtype, granularity, fast_accum=False):
    return _fwd_fake(a, b, trans_a, trans_b, out_dtype, fwd_dtype, granularity, False)[0]


def _train_fake(a, b, trans_a, trans_b, out_dtype, fwd_dtype, grad_dtype, granularity, b_q=None, b_s=None,
                b_scaling=0, d_q=None, d_s=None, fast_accum=False):
    return _fwd_fake(a, b, trans_a, trans_b, out_dtype, fwd_dtype, granularity, True)[0]


library.register_fake("gemm_fp8", _infer_fake)
library.register_fake("gemm_fp8_fwd", _fwd_fake)
library.register_fake("gemm_fp8_bwd", _bwd_fake)
_native_infer = native.ops.gemm_fp8.default
_native_fwd = native.ops.gemm_fp8_fwd.default
_native_bwd = native.ops.gemm_fp8_bwd.default
# With the C++ autograd (bindings/torch_autograd/gemm_fp8_autograd.cpp): forward and backward of a
# training call without Python in between.
_native_train = native.training_op("gemm_fp8_train", _train_fake)


class NativeGemmFp8Function(torch.autograd.Function):
    """GemmFp8Function's math with each direction one native call."""

    @staticmethod
    def forward(ctx, a, b, trans_a: bool, trans_b: bool, out_dtype, fmt: Format, g: ScalingGranularity, main_grad,
                fast_accum: bool = False):
        fwd_dtype, grad_dtype = _dtypes(fmt)
        code = _NATIVE_GRANULARITY[g]
        out, a_bwd, sa_bwd, b_bwd, sb_bwd = _native_fwd(
            a, b, trans_a, trans_b, out_dtype, fwd_dtype, code, True, fast_accum
        )
        ctx.save_for_backward(a_bwd, sa_bwd, b_bwd, sb_bwd)
        ctx.args = (trans_a, trans_b, grad_dtype, code, a.dtype, b.dtype)
        ctx.b_shape, ctx.main_grad = b.shape, main_grad
        return out

    @staticmethod
    def backward(ctx, grad_out):
        main_grad = ctx.main_grad
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_a, grad_b = _native_bwd(grad_out, *ctx.saved_tensors, *ctx.args, need_a, need_b, main_grad)
        if main_grad is not None:
            grad_b = dummy_wgrad(ctx.b_shape, ctx.args[5], main_grad.device)
        elif not need_b:
            grad_b = None
        return (grad_a if need_a else None), grad_b, None, None, None, None, None, None, None


def _fwd_qb_fake(a, b_q, b_scale_inv, b_scaling, trans_a, out_dtype, fwd_dtype, granularity, for_backward,
                 fast_accum=False):
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    out = a.new_empty((m, b_q.shape[0]), dtype=out_dtype)
    if not for_backward:
        return out, library.placeholder(a), library.placeholder(a)
    s_a = {0: (), 1: (k, 1), 2: (_cdiv(m, 128), k)}[granularity]
    return out, a.new_empty((k, m), dtype=fwd_dtype), a.new_empty(s_a, dtype=torch.float32)


library.register_fake("gemm_fp8_fwd_qb", _fwd_qb_fake)
_native_fwd_qb = native.ops.gemm_fp8_fwd_qb.default


class NativeGemmFp8QuantizedBFunction(torch.autograd.Function):
    """out = op(a) @ op(b) with b given quantized (``native_weight_copies``): the forward quantizes a
    alone (one native call), the backward is gemm_fp8_bwd reading b's copy along N. b's gradient is
    the high-precision gradient of the tensor it stands for (straight-through)."""

    @staticmethod
    def forward(ctx, a, b, b_fwd, b_bwd, trans_a: bool, trans_b: bool, out_dtype, fmt: Format, g: ScalingGranularity,
                fast_accum: bool = False):
        fwd_dtype, grad_dtype = _dtypes(fmt)
        code = _NATIVE_GRANULARITY[g]
        out, a_bwd, sa_bwd = _native_fwd_qb(a, *b_fwd, trans_a, out_dtype, fwd_dtype, code, True, fast_accum)
        none = library.placeholder(a)
        ctx.save_for_backward(a_bwd, sa_bwd, *(b_bwd[:2] if b_bwd is not None else (none, none)))
        ctx.args = (trans_a, trans_b, grad_dtype, code, a.dtype, b.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_a, grad_b = _native_bwd(grad_out, *ctx.saved_tensors, *ctx.args, need_a, need_b, None)
        return (grad_a if need_a else None), (grad_b if need_b else None), *(None,) * 8


# ---- argument checks -----------------------------------------------------------------------------


def check_hp_operands(op: str, a, b, trans_a, trans_b, out_dtype, k_reason: str, bwd_reason: str):
    """The checks of high-precision ``a`` / ``b`` shared by gemm_fp8 and gemm_fp4, in order: tensors,
    2-D, dtypes, out_dtype, inner dimensions, K % 16 (``k_reason``), M and N % 16 when a backward
    may follow (``bwd_reason``), one CUDA device. Returns (out_dtype, M, K, N)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{op}: argument '{name}' must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in _IN_DTYPES:
            raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}; expected float16, bfloat16 or float32")
    if b.dtype != a.dtype:
        raise TypeError(f"{op}: argument 'b' has dtype {b.dtype}; expected the dtype of 'a' ({a.dtype})")
    out_dtype = a.dtype if out_dtype is None else out_dtype
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"{op}: out_dtype {out_dtype} is not supported; expected float32, float16 or bfloat16")
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    if k != kb:
        raise ValueError(
            f"{op}: inner dimensions do not match: op(a) is [{m}, {k}] (a {tuple(a.shape)}, trans_a={trans_a}) "
            f"but op(b) is [{kb}, {n}] (b {tuple(b.shape)}, trans_b={trans_b})"
        )
    if k % 16:
        raise ValueError(f"{op}: K={k} must be a multiple of 16 ({k_reason})")
    if (a.requires_grad or b.requires_grad) and torch.is_grad_enabled() and (m % 16 or n % 16):
        raise ValueError(f"{op}: the backward needs M={m} and N={n} to be multiples of 16 ({bwd_reason})")
    check_cuda_tensors(op, a=a, b=b)
    return out_dtype, m, k, n


# ---- shapes the FP8 kernels cannot read directly ----------------------------------------------


def _odd_shape_padding(a, b, trans_a: bool, trans_b: bool):
    """(pad M, pad K, pad N) to multiples of 16 where the FP8 path needs them (K always; M and N when a
    backward may follow, for its transposed copies), or None when a and b fit as they are (or are
    not plain 2-D tensors: the checks then name what is wrong)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2):
        return None
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    n = b.shape[0] if trans_b else b.shape[1]
    training = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    pads = ((-m) % 16 if training else 0, (-k) % 16, (-n) % 16 if training else 0)
    return pads if any(pads) and m and n and k else None


def _gemm_fp8_padded(a, b, trans_a, trans_b, out_dtype, config, pattern, pads):
    """gemm_fp8 of op(a) [M, K] and op(b) [K, N] zero-padded to multiples of 16, the result cut back
    to [M, N]: zeros add nothing to the products nor to any amax, so the values (and, through the
    pad and the slice, the gradients) are those of the unpadded problem at one extra copy each."""
    pm, pk, pn = pads
    if pattern is not None:  # b's gradient reaches main_grad through the unpadded b
        b = route_wgrad_to_main_grad(b, pattern)
    a_op = a.t() if trans_a else a
    b_op = b.t() if trans_b else b
    out = gemm_fp8(F.pad(a_op, (0, pk, 0, pm)), F.pad(b_op, (0, pn, 0, pk)), out_dtype=out_dtype, config=config)
    return out[: a_op.shape[0], : b_op.shape[1]]


# ---- pre-quantized operands -----------------------------------------------------------------


def _prequantized(x, name: str, trans: bool, must_trans: bool, scaling: int, mx: bool = False):
    if len(x) != 2:
        raise TypeError(f"gemm_fp8: pre-quantized '{name}' must be a pair (q, scale_inv), got {len(x)} items")
    q, s = x
    if not isinstance(q, torch.Tensor) or q.dtype not in _FP8_DTYPES or q.dim() != 2:
        raise TypeError(f"gemm_fp8: pre-quantized '{name}' must be (q, scale_inv) with q a 2-D float8 tensor")
    if isinstance(s, torch.Tensor):  # the kernels read the scales through a raw pointer
        check_cuda_tensors("gemm_fp8", **{name: q, f"{name}_scale_inv": s})
    if bool(trans) != must_trans:
        raise ValueError(
            f"gemm_fp8: a pre-quantized '{name}' must be stored K-major (trans_{name}={must_trans}): quantize "
            f"op({name}) along K"
        )
    rows, k = q.shape
    if mx:
        if not isinstance(s, torch.Tensor) or s.dtype not in (_E8M0, torch.uint8):
            raise TypeError(
                f"gemm_fp8: pre-quantized MX '{name}' scale_inv must be an E8M0 tensor (torch.float8_e8m0fnu)"
            )
        if tuple(s.shape) != (rows, _cdiv(k, 32)):
            raise ValueError(
                f"gemm_fp8: pre-quantized MX '{name}' scale_inv has shape {tuple(s.shape)}; expected "
                f"{[rows, _cdiv(k, 32)]} for q of shape {tuple(q.shape)}"
            )
        return _mx_blocks.mx_fp8_to_1x128(q.contiguous(), s.contiguous())
    if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
        raise TypeError(f"gemm_fp8: pre-quantized '{name}' scale_inv must be a float32 tensor")
    expected = {
        TENSOR: (),
        ROW: (rows, 1),
        BLOCK_1x128: (rows, _cdiv(k, 128)),
        BLOCK_128x128: (_cdiv(rows, 128), _cdiv(k, 128)),
    }[scaling]
    if tuple(s.shape) != expected and not (scaling == TENSOR and s.numel() == 1):
        raise ValueError(
            f"gemm_fp8: pre-quantized '{name}' scale_inv has shape {tuple(s.shape)}; expected {list(expected)} "
            f"for q of shape {tuple(q.shape)}"
        )
    return q.contiguous(), s


def _forward_prequantized(a, b, trans_a, trans_b, out_dtype, g):
    act, wgt = _scalings(g)
    mx = g == ScalingGranularity.MX_BLOCKWISE
    qa, sa = _prequantized(a, "a", trans_a, False, act, mx)
    qb, sb = _prequantized(b, "b", trans_b, True, wgt, mx)
    if qa.shape[1] != qb.shape[1]:
        raise ValueError(f"gemm_fp8: inner dimensions do not match: a is {tuple(qa.shape)}, b is {tuple(qb.shape)}")
    if qa.shape[1] % 16:
        raise ValueError(f"gemm_fp8: K={qa.shape[1]} must be a multiple of 16 (FP8 rows are read 16 bytes at a time)")
    if out_dtype is None:
        raise ValueError("gemm_fp8: out_dtype is required when 'a' is pre-quantized")
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"gemm_fp8: out_dtype {out_dtype} is not supported; expected float32, float16 or bfloat16")
    check_cuda_tensors("gemm_fp8", a=qa, b=qb, a_scale_inv=sa, b_scale_inv=sb)
    return fp8_mm(qa, sa, act, qb, sb, wgt, out_dtype)


# ---- pre-quantized activation with its high-precision tensor (training) ---------------------


def _quantize_col(x, dtype, g):
    """Only the transposed copy of x [M, K] (quantized along M, stored [K, M]): what the wgrad needs
    when the copy along K came pre-quantized (turbo.ops.rmsnorm_fp8 / swiglu_fp8)."""
    from primus_turbo.pytorch.ops import quantization as qz

    block = 128 if g == ScalingGranularity.BLOCKWISE else 0
    _, _, q_col, s_col = qz._quantize_op(x.contiguous(), dtype, qz._GRANULARITY[g], block, False, True, True, 0, 0)
    return q_col, s_col


class GemmFp8PrequantAFunction(GemmFp8Function):
    """GemmFp8Function with op(a) given as (q, scale_inv) quantized along K plus its high-precision
    tensor: the forward GEMM reads q as is; the backward is GemmFp8Function's (inherited: the same
    eight inputs, a_hp and b first), with the gradient of the dequantized a going to a_hp
    (straight-through) and the wgrad operand quantized from a_hp."""

    @staticmethod
    def forward(ctx, a_hp, b, qa, sa, trans_b: bool, out_dtype, fmt_g: tuple, main_grad):
        fmt, g = fmt_g
        fwd_dtype, grad_dtype = _dtypes(fmt)
        act, wgt = _scalings(g)
        b_row, sb_row, b_col, sb_col = _quantize(b, fwd_dtype, g, wgt == BLOCK_128x128)
        b_fwd, sb_fwd = (b_row, sb_row) if trans_b else (b_col, sb_col)
        b_bwd, sb_bwd = (b_col, sb_col) if trans_b else (b_row, sb_row)
        out = fp8_mm(qa, sa, act, b_fwd, sb_fwd, wgt, out_dtype)
        a_bwd = sa_bwd = None
        if ctx.needs_input_grad[1] or main_grad is not None:
            a_bwd, sa_bwd = _quantize_col(a_hp, fwd_dtype, g)
        ctx.save_for_backward(a_bwd, sa_bwd, b_bwd, sb_bwd)
        ctx.trans_a, ctx.trans_b, ctx.g, ctx.grad_dtype = False, trans_b, g, grad_dtype
        ctx.act, ctx.a_code, ctx.b_code = act, act, wgt
        ctx.a_dtype, ctx.b_dtype, ctx.b_shape = a_hp.dtype, b.dtype, b.shape
        ctx.main_grad, ctx.n_inputs = main_grad, 8
        return out


def _forward_prequantized_a_hp(a, b, trans_a, trans_b, out_dtype, config, fuse_bgrad_accum_pattern):
    if config.granularity == ScalingGranularity.MX_BLOCKWISE:
        raise NotImplementedError(
            "gemm_fp8: a pre-quantized (q, scale_inv, a_hp) activation takes TENSORWISE, ROWWISE or BLOCKWISE "
            "(rmsnorm_fp8 / swiglu_fp8 make ROWWISE and BLOCKWISE), not MX_BLOCKWISE"
        )
    q, s, a_hp = a
    act, _ = _scalings(config.granularity)
    qa, sa = _prequantized((q, s), "a", trans_a, False, act)
    if not isinstance(a_hp, torch.Tensor) or a_hp.shape != qa.shape or a_hp.dtype not in _IN_DTYPES:
        raise TypeError(
            "gemm_fp8: a pre-quantized 'a' with its high-precision tensor is (q, scale_inv, a_hp) with a_hp a "
            f"float16/bfloat16/float32 tensor of q's shape {tuple(qa.shape)}"
        )
    if qa.dtype != _dtypes(config.format)[0]:
        raise TypeError(f"gemm_fp8: pre-quantized 'a' has dtype {qa.dtype}; config.format {config.format.name} "
                        f"needs {_dtypes(config.format)[0]}")
    if not isinstance(b, torch.Tensor) or b.dim() != 2 or b.dtype != a_hp.dtype:
        raise TypeError(f"gemm_fp8: with a pre-quantized 'a', 'b' must be a 2-D tensor of a_hp's dtype ({a_hp.dtype})")
    m, k = qa.shape
    kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    if k != kb:
        raise ValueError(f"gemm_fp8: inner dimensions do not match: a is {tuple(qa.shape)}, op(b) is [{kb}, {n}]")
    if k % 16:
        raise ValueError(f"gemm_fp8: K={k} must be a multiple of 16 (FP8 GEMM operands are read in 16-byte rows)")
    if (a_hp.requires_grad or b.requires_grad) and torch.is_grad_enabled() and (m % 16 or n % 16):
        raise ValueError(f"gemm_fp8: the backward needs M={m} and N={n} to be multiples of 16")
    out_dtype = a_hp.dtype if out_dtype is None else out_dtype
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"gemm_fp8: out_dtype {out_dtype} is not supported; expected float32, float16 or bfloat16")
    check_cuda_tensors("gemm_fp8", a=qa, b=b, a_scale_inv=sa, a_hp=a_hp)
    main_grad = check_main_grad(b, fuse_bgrad_accum_pattern)
    if main_grad is not None and config.granularity == ScalingGranularity.BLOCKWISE:
        raise ValueError("gemm_fp8: fuse_bgrad_accum_pattern='megatron' supports TENSORWISE and ROWWISE, not BLOCKWISE")
    return GemmFp8PrequantAFunction.apply(
        a_hp, b, qa, sa, trans_b, out_dtype, (config.format, config.granularity), main_grad
    )


# ---- public op --------------------------------------------------------------------------------


Operand = (
    torch.Tensor
    | QuantizedTensor
    | QuantizedTensorPair
    | tuple[torch.Tensor, torch.Tensor]
    | tuple[torch.Tensor, torch.Tensor, torch.Tensor]
)


def _training_main_grad(b, pattern, granularity):
    """b.main_grad for fuse_bgrad_accum_pattern='megatron' (checked), or None."""
    main_grad = check_main_grad(b, pattern)
    if main_grad is not None and granularity == ScalingGranularity.BLOCKWISE:
        raise ValueError(
            "gemm_fp8: fuse_bgrad_accum_pattern='megatron' supports TENSORWISE, ROWWISE and MX_BLOCKWISE, not BLOCKWISE"
        )
    return main_grad


@native.raises_python_errors
def gemm_fp8(
    a: Operand,
    b: Operand,
    trans_a: bool = False,
    trans_b: bool = False,
    out_dtype: torch.dtype | None = None,
    config: Float8QuantConfig | None = None,
    fuse_bgrad_accum_pattern: str | None = None,
) -> torch.Tensor:
    """``op(a) @ op(b)`` computed in FP8: both inputs are quantized per ``config`` (default E4M3
    tensorwise), multiplied on FP8 tensor cores with FP32 accumulation, and written as
    ``out_dtype`` (default ``a.dtype``). Differentiable: dgrad and wgrad run in FP8 at the same
    granularity (HYBRID: the output gradient in E5M2, the rest E4M3).

    Args:
        a: ``[M, K]`` (``[K, M]`` with ``trans_a``), float16/bfloat16/float32, CUDA.
        b: ``[K, N]`` (``[N, K]`` with ``trans_b``), same dtype as ``a``. With BLOCKWISE, ``b`` is
            the weight: 128x128 blocks; ``a`` and the output gradient use 1x128 blocks along K.
        config: :class:`Float8QuantConfig`; TENSORWISE, ROWWISE, BLOCKWISE (block_size=128),
            MX_BLOCKWISE (block_size=32, E8M0): every operand, the weight included, in blocks of 32
            along its GEMM's K. Emulated on Hopper: the four E8M0 scales of a 128-deep K block are
            restated as one power of two (their maximum) and the block-scaled FP8 GEMM runs (see
            docs/ARCHITECTURE.md; exact up to values 2^18 below their block's largest).
        fuse_bgrad_accum_pattern: ``"megatron"`` (TENSORWISE/ROWWISE/MX_BLOCKWISE) adds b's
            gradient into ``b.main_grad`` inside the wgrad GEMM, as :func:`gemm` (MX_BLOCKWISE: an
            fp32 wgrad, then one add).

    QuantizedTensor operands (``turbo.core.quantized_tensor``), forward and backward: either
    operand may be a :class:`QuantizedTensor` quantized along its GEMM's K (``a`` along dim 1, or
    0 with ``trans_a``; ``b`` along dim 0, or 1 with ``trans_b``; TENSORWISE and 2-D blocks
    either way), read without quantizing again, or a :class:`QuantizedTensorPair` ``(data,
    data_t)`` whose ``data_t`` (quantized along the other dim) the backward GEMM reads, e.g. a
    weight from ``create_quantized_weight(w, ..., need_weight_transpose_cache=True)`` with
    ``trans_b=True``. Without ``data_t`` the backward copy is restated from ``data`` (a transpose
    for TENSORWISE and 2-D blocks, else a re-quantization of the dequantized values). The gradient
    of a QuantizedTensor is the high-precision gradient of the tensor it stands for. The other
    operand may stay high precision (quantized here per ``config``); ``out_dtype`` defaults to
    the operands' promoted dtype.

    Pre-quantized tuples (forward only, no autograd): pass ``a=(q, scale_inv)`` with ``q [M, K]``
    and ``trans_a=False``, and ``b=(q, scale_inv)`` with ``q [N, K]`` and ``trans_b=True``, both
    quantized along K as ``turbo.ops.quantize_fp8(x, dtype, granularity, axis=-1)`` returns them
    (BLOCKWISE ``b``: ``scaling_recipe.use_2d_block=True``; MX_BLOCKWISE: E8M0 scale_inv
    ``[rows, ceil(K/32)]``); ``out_dtype`` is then required.

    Pre-quantized activation for training: ``a=(q, scale_inv, a_hp)`` (``trans_a=False``; e.g.
    ``turbo.ops.rmsnorm_fp8(..., return_hp=True)`` / ``swiglu_fp8``, ROWWISE or BLOCKWISE, the
    config's forward format) with a high-precision ``b``: the forward GEMM reads q without
    quantizing a again; differentiable, with a's gradient going to ``a_hp`` (straight-through) and
    the wgrad operand (a quantized along M) quantized from ``a_hp``.

    Shapes: any M, K, N. The FP8 kernels read rows of 16 bytes, so K (and M and N when a backward
    may follow: the transposed copies are FP8 rows of length M and N) that are not multiples of 16
    are zero-padded inside the op, at one extra copy of each operand, and the result cut back;
    aligned shapes (real models') take no copy. Partial 128-blocks are fine. Pre-quantized
    operands must be aligned.
    """
    config = _check_config(config)
    trans_a, trans_b = flag("gemm_fp8", "trans_a", trans_a), flag("gemm_fp8", "trans_b", trans_b)
    if _qo.is_quantized(a) or _qo.is_quantized(b):
        return _gemm_fp8_quantized(a, b, trans_a, trans_b, out_dtype, config, fuse_bgrad_accum_pattern)
    code = _NATIVE_GRANULARITY.get(config.granularity)
    # The common case first, with nothing computed twice: plain 2-D CUDA operands whose sizes the
    # FP8 kernels take as they are go straight to one native call.
    if (
        code is not None
        and config.format != Format.E5M2
        and isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.is_cuda
        and a.dim() == 2
        and b.dim() == 2
    ):
        sa, sb = a.shape, b.shape
        m, k = (sa[1], sa[0]) if trans_a else (sa[0], sa[1])
        n = sb[0] if trans_b else sb[1]
        training = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
        if m and n and k and not (k % 16 or (training and (m % 16 or n % 16))):
            if out_dtype is None:
                out_dtype = a.dtype
            if not training:
                if fuse_bgrad_accum_pattern is not None:
                    check_main_grad_pattern(fuse_bgrad_accum_pattern)
                return _native_infer(a, b, trans_a, trans_b, out_dtype, torch.float8_e4m3fn, code, config.fast_accum)
            main_grad = _training_main_grad(b, fuse_bgrad_accum_pattern, config.granularity)
            if main_grad is None and native.eager_cpp_autograd():
                return _native_train(
                    a, b, trans_a, trans_b, out_dtype, *_dtypes(config.format), code, fast_accum=config.fast_accum
                )
            return NativeGemmFp8Function.apply(
                a, b, trans_a, trans_b, out_dtype, config.format, config.granularity, main_grad, config.fast_accum
            )
    pads = _odd_shape_padding(a, b, trans_a, trans_b)
    if pads is not None and a.dtype == b.dtype and a.dtype in _IN_DTYPES:
        return _gemm_fp8_padded(a, b, trans_a, trans_b, out_dtype or a.dtype, config, fuse_bgrad_accum_pattern, pads)
    if isinstance(a, tuple) and len(a) == 3 and not isinstance(b, tuple):
        return _forward_prequantized_a_hp(a, b, trans_a, trans_b, out_dtype, config, fuse_bgrad_accum_pattern)
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)):
            raise TypeError("gemm_fp8: pass both 'a' and 'b' pre-quantized, or neither")
        return _forward_prequantized(a, b, trans_a, trans_b, out_dtype, config.granularity)
    out_dtype, m, k, n = check_hp_operands(
        "gemm_fp8", a, b, trans_a, trans_b, out_dtype,
        "FP8 GEMM operands are read in 16-byte rows",
        "its transposed FP8 operands have rows of length M and N",
    )
    if m == 0 or n == 0 or k == 0:  # nothing to quantize; the (empty or zero) product in torch
        return ((a.t() if trans_a else a) @ (b.t() if trans_b else b)).to(out_dtype)
    main_grad = _training_main_grad(b, fuse_bgrad_accum_pattern, config.granularity)
    return GemmFp8Function.apply(
        a, b, None, None, trans_a, trans_b, out_dtype, config.format, config.granularity, main_grad
    )


def _rows_pad_beside_quantized(a, b, trans_a: bool) -> int:
    """Rows to add to a plain ``a`` whose M is not a multiple of 16 beside a quantized ``b`` (a
    layer's cached weight and a last batch of 7 tokens, say), else 0."""
    if not (isinstance(a, torch.Tensor) and not isinstance(a, QuantizedTensor) and a.dim() == 2 and _qo.is_quantized(b)):
        return 0
    return (-a.shape[1 if trans_a else 0]) % 16


def _gemm_fp8_quantized(a, b, trans_a: bool, trans_b: bool, out_dtype, config, pattern):
    """gemm_fp8 with QuantizedTensor / QuantizedTensorPair operands (either or both), training or not."""
    pm = _rows_pad_beside_quantized(a, b, trans_a)
    if pm:
        # Zero rows up to a multiple of 16, the result cut back: exact (zero rows add nothing to the
        # products nor to any amax), and the slice drops their gradients.
        m = a.shape[1 if trans_a else 0]
        padded = F.pad(a, (0, pm) if trans_a else (0, 0, 0, pm))
        return _gemm_fp8_quantized(padded, b, trans_a, trans_b, out_dtype, config, pattern)[:m]
    a, a_t, b, b_t, out_dtype = _qo.dense_operands("gemm_fp8", a, b, trans_a, trans_b, out_dtype, config)
    main_grad = _training_main_grad(b, pattern, config.granularity)
    if main_grad is None:
        training = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
        copies = native_weight_copies(a, b, b_t, trans_b, config, training and a.requires_grad)
        if copies is not None and not training:
            code, fwd_dtype = _NATIVE_GRANULARITY[config.granularity], _dtypes(config.format)[0]
            return _native_fwd_qb(a, *copies[0], trans_a, out_dtype, fwd_dtype, code, False, config.fast_accum)[0]
        if copies is not None:
            return NativeGemmFp8QuantizedBFunction.apply(
                a, b, *copies, trans_a, trans_b, out_dtype, config.format, config.granularity, config.fast_accum
            )
    return GemmFp8Function.apply(a, b, a_t, b_t, trans_a, trans_b, out_dtype, config.format, config.granularity, main_grad)


def cached_weight_native_ok(a, weight, config) -> bool:
    """Whether a layer's per-step FP8 weight cache can feed the native training op
    (``gemm_fp8_cached_weight``): eager mode with the C++ autograd, a 2-D float16/bfloat16/float32 CUDA
    ``a`` of the weight's dtype, M, K and N positive multiples of 16, a granularity and format the
    native path composes."""
    return (
        _native_train is not None and native.eager_cpp_autograd() and isinstance(a, torch.Tensor)
        and not isinstance(a, QuantizedTensor) and a.is_cuda and a.dim() == 2 and a.dtype == weight.dtype
        and a.dtype in _IN_DTYPES and config.granularity in _NATIVE_WEIGHT_CODE and config.format != Format.E5M2
        and all(d > 0 and d % 16 == 0 for d in (a.shape[0], *weight.shape))
    )


def gemm_fp8_cached_weight(a, weight, data, data_t, config):
    """``gemm_fp8(a, weight, trans_b=True)`` with the weight ``[N, K]`` already quantized for this
    optimizer step (``data`` along K, ``data_t`` along N, as ``create_quantized_weight`` makes them):
    one native training call that quantizes only ``a`` (and the output gradient), reading the
    copies; ``weight`` receives the wgrad. The caller checked ``cached_weight_native_ok``. None when
    the copies are not in the layouts the native GEMM reads (the caller then passes the pair to
    ``gemm_fp8``)."""
    need_dgrad = torch.is_grad_enabled() and a.requires_grad
    copies = native_weight_copies(a, data, data_t, True, config, need_dgrad)
    if copies is None:
        return None
    (b_q, b_s, code), dgrad = copies
    d_q, d_s = (dgrad[0], dgrad[1]) if dgrad is not None else (None, None)
    return _native_train(a, weight, False, True, a.dtype, *_dtypes(config.format), _NATIVE_GRANULARITY[config.granularity],
                         b_q, b_s, code, d_q, d_s, fast_accum=config.fast_accum)


# The scaling code a granularity's weights take in the native GEMM (fp8_scalings in C++).
_NATIVE_WEIGHT_CODE = {
    ScalingGranularity.TENSORWISE: TENSOR,
    ScalingGranularity.ROWWISE: ROW,
    ScalingGranularity.BLOCKWISE: BLOCK_128x128,
}


def native_weight_copies(a, b, b_t, trans_b: bool, config, need_dgrad: bool):
    """``(q, scale_inv, code)`` of a pre-quantized weight ``b`` along K (the forward's) and along N
    (the dgrad's, or None without ``need_dgrad``) when the native path takes the GEMM with a
    high-precision ``a`` (a layer's per-step weight cache, e.g.), else None: b FP8 in the config's
    forward format and granularity, its copies in the scaling the native GEMM reads."""
    if not (isinstance(b, QuantizedTensor) and isinstance(a, torch.Tensor) and not isinstance(a, QuantizedTensor)):
        return None
    if a.numel() == 0 or b.numel() == 0:  # empty problems: the composite path writes the empty product
        return None
    code = _NATIVE_WEIGHT_CODE.get(config.granularity)
    if code is None or config.format == Format.E5M2 or not a.is_cuda or b.qdata.dtype != _dtypes(config.format)[0]:
        return None
    k_dim = 1 if trans_b else 0
    fwd = _qo.fp8_matrix("gemm_fp8", "b", b, k_dim)
    if fwd is None or fwd[2] != code:
        return None
    bwd = None
    if need_dgrad:
        bwd = _qo.backward_copy(
            b, b_t, lambda src: _qo.fp8_matrix("gemm_fp8", "b (backward copy)", src, 1 - k_dim), lambda src: None
        )
        if bwd is None or bwd[2] != code:
            return None
    return fwd, bwd
