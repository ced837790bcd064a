"""turbo.ops.grouped_gemm_fp4: mixture-of-experts grouped GEMM with MXFP4 operands (E2M1 values,
one E8M0 scale per 32 along the reduction dim), forward and backward, group sizes kept on the
device (no host sync; CUDA-graph capturable with sizes changing per replay).

Hopper has no FP4 tensor cores: this is an emulation, built from two existing pieces.

1. Quantization to MXFP4 with ``quantize_fp4`` and the FP4 training recipe of ``gemm_fp4``
   (arXiv 2509.25149), then the restatement of ``_mx_blocks``: every E2M1 value is an exact E4M3
   value (times 2^6), and a 128-deep K block's four E8M0 scales become one fp32 power of two per
   row and 128-block (exact unless a value lands in E4M3's subnormal range, see ``_mx_blocks``).
2. The grouped FP8 block-scaled kernel of ``grouped_gemm_fp8`` (``grouped_fp8_mm``), with 1x128
   scales per row for both operands (``b_scale_rows=1``: the restated weight keeps a scale per row,
   which is what makes the restatement exact; a 128x128 form would merge 16 32x32 blocks).

With ``op(b)`` ``[K, N]`` per expert (the weight)::

    forward  out  = a    [M, K] along K, 1-D blocks of 32      x op(b)^T [G, N, K] along K, 32x32
    dgrad    da   = grad [M, N] along N, stochastic rounding   x op(b)   [G, K, N] along N, 32x32
    wgrad    db   = per-expert a^T grad in bf16/fp16 (turbo.ops.grouped_gemm's variable-K kernel)

``a`` and the output gradient are quantized per token along the reduction dim, so group
boundaries do not matter. The weight is quantized per expert: ``b`` viewed as ``[G*X, Y]`` with X
and Y multiples of 32, so no 32-block (1-D or 32x32) ever spans two experts. With 32x32 blocks
the dgrad copy has the forward copy's scales (the backward multiplies by the same quantized
weight).

wgrad runs in bf16/fp16 from the saved input and the output gradient, like grouped_gemm_fp8's
default: an FP4 wgrad would quantize both operands along the tokens of each expert (blocks of 32
restarting at arbitrary token offsets) and the restated operands would still run on FP8 tensor
cores, so it would cost more than the bf16 GEMM it replaces while adding FP4 error to the weight
gradient. An expert with no tokens gets an exact zero gradient. The recipe's ``use_rht`` (Hadamard
transform of the wgrad operands) therefore has no effect here.
"""

import torch

from primus_turbo.pytorch.core import library, native
from primus_turbo.pytorch.core.low_precision import Float4QuantConfig
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor
from primus_turbo.pytorch.ops import _mx_blocks
from primus_turbo.pytorch.ops import _quantized_operands as _qo
from primus_turbo.pytorch.ops._checks import check_num_cu, flag, route_wgrad_to_main_grad
from primus_turbo.pytorch.ops._transpose import transpose_last2
from primus_turbo.pytorch.ops.gemm_fp4 import _check_config, _q, _seed, recipe_of
from primus_turbo.pytorch.ops.grouped_gemm import _grouped_gemm_wgrad_op, grouped_gemm
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import check_hp_operands, grouped_fp8_mm, plain_hp_operands

__all__ = ["grouped_gemm_fp4"]

_OP = "grouped_gemm_fp4"
_MX = _mx_blocks.MX_BLOCK
# What the MXFP4 grouped GEMM needs of K and N (check_hp_operands' multiple and reason).
_FP4_BLOCKS = (_MX, "MXFP4 blocks of 32, and 32x32 weight blocks that must not span two experts in either orientation")
_ROWWISE_B_SCALES = 1  # grouped_fp8_mm's b_scale_rows: one 1x128 scale per row of B


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def activation_operand(x: torch.Tensor, sr: bool = False):
    """x ``[T, C]`` -> MXFP4 along C, restated: ``(E4M3 [T, C], fp32 scale [T, ceil(C/128)])``,
    the A operand of ``grouped_fp8_mm``."""
    q, s = _q(x, -1, sr=sr)
    return _mx_blocks.mx_fp4_to_1x128(q, s)


def weight_operand(w: torch.Tensor, along_last: bool, two_d: bool):
    """w ``[G, X, Y]`` (X, Y multiples of 32) -> the K-major B operand of ``grouped_fp8_mm``,
    MXFP4-quantized per expert and restated: ``(E4M3 [G, R, C], fp32 scale [G, R, ceil(C/128)])``.

    ``along_last``: K = Y, ``[G, X, Y]``; else K = X, the per-expert transpose ``[G, Y, X]``.
    ``two_d``: 32x32 blocks (the same blocks, hence the same quantized values, in both
    orientations), else 1-D blocks of 32 along K.
    """
    # The transposed orientation quantizes a transposed bf16 copy along its rows rather than
    # quantize_fp4(axis=0) over [G*X, Y] followed by moving the expert index on the packed bytes:
    # that reordering needs dtype views of float4_e2m1fn_x2, which torch.compile's inductor does
    # not lower on every backend.
    src = w if along_last else transpose_last2(w)
    g, rows, k = src.shape
    # [G*R, K/2] and scales [G*R, K/32] (or [G*R/32, K/32]): R % 32 == 0, so no block spans experts.
    q, s = _q(src.reshape(g * rows, k), -1, two_d=two_d)
    q8, s8 = _mx_blocks.mx_fp4_to_1x128(q, s)
    return q8.view(g, rows, k), s8.view(g, rows, _cdiv(k, 128))


def _quantized_weight(src: QuantizedTensor, k_dim: int):
    """The restated B of an FP4 QuantizedTensor weight ``[G, X, Y]`` reducing over ``k_dim`` (1 or
    2), or None when it is quantized along the other dim. FP4 data is stored per expert with its
    rows along the other dim (``quantize_fp4``'s 3-D layouts), which is the kernel's K-major B."""
    if not _mx_blocks.is_fp4(src.qdata) or src.qdata.dim() != 3:
        raise TypeError(f"{_OP}: a pre-quantized 'b' must be a 3-D FP4 QuantizedTensor, got {src!r}")
    if src.quantized_axis != k_dim or (src.scaling_recipe is not None and src.scaling_recipe.use_rht):
        return None
    g, rows, half = src.qdata.shape
    k = 2 * half
    s = src.scale_inv
    q8, s8 = _mx_blocks.mx_fp4_to_1x128(src.qdata.reshape(g * rows, half), s.reshape(-1, s.shape[-1]))
    return q8.view(g, rows, k), s8.view(g, rows, _cdiv(k, 128))


def _weight(b, b_t, k_dim: int, two_d: bool, forward: bool):
    """B reducing over dim ``k_dim`` of b ``[G, X, Y]``: quantized here from a high-precision b, read
    from a QuantizedTensor (b, or the pair's other copy), else b dequantized and quantized again
    (a forward copy that does not match raises)."""
    if not isinstance(b, QuantizedTensor):
        return weight_operand(b, along_last=k_dim == 2, two_d=two_d)
    if not forward:
        return _qo.backward_copy(b, b_t, lambda src: _quantized_weight(src, k_dim),
                                 lambda src: weight_operand(src.dequantize(), along_last=k_dim == 2, two_d=two_d))
    got = _quantized_weight(b, k_dim)
    if got is None:
        raise ValueError(f"{_OP}: pre-quantized 'b' is quantized along dim {b.quantized_axis} (or with the Hadamard "
                         f"transform); the forward reads it along its dim {k_dim} (K)")
    return got


def _activation(a):
    """A from a high-precision a, or from an FP4 QuantizedTensor quantized along K (tight tokens)."""
    if not isinstance(a, QuantizedTensor):
        return activation_operand(a)
    if not _mx_blocks.is_fp4(a.qdata) or a.qdata.dim() != 2 or a.quantized_axis != 1:  # (FP4 rows stay tight)
        raise ValueError(f"{_OP}: a pre-quantized 'a' must be a 2-D FP4 QuantizedTensor quantized along K (axis -1), "
                         "tokens unpadded")
    if a.scaling_recipe is not None and a.scaling_recipe.use_rht:
        raise ValueError(f"{_OP}: a pre-quantized 'a' must not carry the Hadamard transform (the weight has none)")
    return _mx_blocks.mx_fp4_to_1x128(a.qdata, a.scale_inv)


class GroupedGemmFp4Function(torch.autograd.Function):
    """Per-group MXFP4 GEMM; ``a`` and ``b`` high-precision or FP4 QuantizedTensors (``b_t``: the
    weight's copy along N for the dgrad)."""

    @staticmethod
    def forward(ctx, a, b, b_t, group_lens, group_offs, trans_b: bool, out_dtype, two_d: bool, sr: bool,
                num_sms: int):
        qa, sa = _activation(a)
        # The forward's B is op(b)^T [G, N, K]: b itself with trans_b, else its per-expert transpose.
        qb, sb = _weight(b, None, 2 if trans_b else 1, two_d, True)
        out = grouped_fp8_mm(qa, sa, qb, sb, group_lens, group_offs, _ROWWISE_B_SCALES, out_dtype, num_sms)
        # The backward: the dgrad's B (made now for a QuantizedTensor weight, whose high-precision
        # values are gone) and a in high precision for the bf16 wgrad.
        qd = sd = b_hp = None
        if isinstance(b, QuantizedTensor):
            if ctx.needs_input_grad[0]:
                qd, sd = _weight(b, b_t, 1 if trans_b else 2, two_d, False)
        else:
            b_hp = b
        a_hp = (a.dequantize() if ctx.needs_input_grad[1] else None) if isinstance(a, QuantizedTensor) else a
        ctx.save_for_backward(a_hp, b_hp, group_lens, group_offs, qd, sd)
        ctx.trans_b, ctx.two_d, ctx.sr, ctx.num_sms = trans_b, two_d, sr, num_sms
        ctx.a_dtype, ctx.b_dtype = a.dtype, b.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b, group_lens, group_offs, qd, sd = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            qg, sg = activation_operand(grad_out.contiguous(), sr=ctx.sr)
            # dgrad's B is op(b) [G, K, N] along N: b's transpose with trans_b, else b itself.
            if qd is None:
                qd, sd = weight_operand(b, along_last=not ctx.trans_b, two_d=ctx.two_d)
            grad_a = grouped_fp8_mm(qg, sg, qd, sd, group_lens, group_offs, _ROWWISE_B_SCALES, ctx.a_dtype, ctx.num_sms)
        if ctx.needs_input_grad[1]:
            # Variable-K wgrad on the bf16/fp16 grouped GEMM (module docstring says why).
            grad_b = _grouped_gemm_wgrad_op(
                a, grad_out.to(a.dtype).contiguous(), group_lens, group_offs, ctx.trans_b, ctx.num_sms
            )
            grad_b = grad_b.to(ctx.b_dtype)
        return grad_a, grad_b, None, None, None, None, None, None, None, None


def _native_fwd_fake(a, b, group_lens, group_offs, trans_b, out_dtype, two_d, num_sms):
    out_dtype, k, n = check_hp_operands(_OP, a, b, group_lens, group_offs, trans_b, out_dtype, _FP4_BLOCKS)
    return a.new_empty((a.shape[0], n), dtype=out_dtype)


def _native_bwd_fake(grad_out, a, b, group_lens, group_offs, trans_b, two_d, sr, seed, num_sms, need_a, need_b):
    none = library.placeholder(a)
    return a.new_empty(a.shape) if need_a else none, a.new_empty(b.shape) if need_b else none


# Native ops (csrc/bindings/torch/grouped_gemm_fp8_ops.cpp): FP4 quantization, restatement and the
# grouped FP8 kernel per direction (the bf16 wgrad in the backward's call).
library.register_fake("grouped_gemm_fp4_fwd", _native_fwd_fake)
library.register_fake("grouped_gemm_fp4_bwd", _native_bwd_fake)
_native_fwd = native.ops.grouped_gemm_fp4_fwd.default
_native_bwd = native.ops.grouped_gemm_fp4_bwd.default


class NativeGroupedGemmFp4Function(torch.autograd.Function):
    """GroupedGemmFp4Function's math on high-precision operands, one native call per direction."""

    @staticmethod
    def forward(ctx, a, b, group_lens, group_offs, trans_b: bool, out_dtype, two_d: bool, sr: bool, num_sms: int):
        out = _native_fwd(a, b, group_lens, group_offs, trans_b, out_dtype, two_d, num_sms)
        ctx.save_for_backward(a, b, group_lens, group_offs)
        ctx.args = (trans_b, two_d, sr)
        ctx.num_sms = num_sms
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b, group_lens, group_offs = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        trans_b, two_d, sr = ctx.args
        grad_a, grad_b = _native_bwd(grad_out, a, b, group_lens, group_offs, trans_b, two_d, sr,
                                     _seed(sr and need_a), ctx.num_sms, need_a, need_b)
        return grad_a if need_a else None, grad_b if need_b else None, None, None, None, None, None, None, None


@native.raises_python_errors
def grouped_gemm_fp4(
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    trans_b: bool = True,
    out_dtype: torch.dtype | None = None,
    config: Float4QuantConfig | None = None,
    num_cu: int | None = None,
    fuse_bgrad_accum_pattern: str | None = None,
) -> torch.Tensor:
    """Per-group ``a[rows of g] @ op(b[g])`` with MXFP4 operands: the expert layers of a mixture
    of experts. Emulated on Hopper's FP8 tensor cores (MXFP4 accuracy, FP8 speed minus the
    quantization and restatement passes; see the module docstring and docs/ARCHITECTURE.md).

    Args:
        a: ``[M, K]`` tokens sorted by group, bfloat16 or float16, on a CUDA device.
        b: ``[G, N, K]`` with ``trans_b`` (the default, ``torch.nn.Linear`` layout per expert), else
            ``[G, K, N]``; same dtype as ``a``.
        group_lens: int64 ``[G]`` on a's device; never copied to the host (no sync; CUDA-graph
            capturable, sizes may change between replays). Sizes adding up to more than M are
            clamped as in ``grouped_gemm_fp8``.
        group_offs: optional int64 ``[G + 1]`` group starts (default: prefix sum of group_lens).
        out_dtype: bfloat16, float16 or float32 (default: a's dtype).
        config: :class:`Float4QuantConfig` (E2M1_X2, MX_BLOCKWISE, E8M0, block_size 32). The recipe
            switches are chosen as in ``gemm_fp4`` (``config.scaling_recipe_for_trans``, else a
            ``config.scaling_recipe`` that sets any switch, else ``FP4_TRAINING_RECIPE``):
            ``use_2d_block`` 32x32 weight blocks per expert, ``use_sr`` stochastic rounding of the
            output gradient (a new seed per eager call; fixed at trace / capture time under
            torch.compile or CUDA graphs); ``use_rht`` has no effect (wgrad is bf16).
        num_cu: SMs the persistent kernels may use (default: all), e.g. to leave room for
            overlapped communication; rounded down to an even count (clusters of 2 CTAs).
        fuse_bgrad_accum_pattern: ``"megatron"``: b's gradient is added into ``b.main_grad`` after
            the wgrad GEMM and autograd gets a placeholder (as ``grouped_gemm``).

    Differentiable in ``a`` (dgrad through the same MXFP4 emulation) and ``b`` (wgrad on the
    bf16/fp16 grouped GEMM; an expert with no tokens gets a zero gradient). K and N must be
    multiples of 32 (a weight block never spans two experts, in either orientation); violations
    raise ``ValueError`` before any work.

    QuantizedTensor operands (forward and backward): ``b`` a 3-D FP4 QuantizedTensor quantized
    along K (``quantize_fp4`` axis 2 with ``trans_b``, else 1), or a QuantizedTensorPair whose
    ``data_t`` (along N) the dgrad reads (else the dequantized weight is quantized again); ``a`` a
    2-D FP4 QuantizedTensor along K (tokens unpadded). Their gradients are high precision (the
    wgrad reads ``a`` dequantized).
    """
    config = _check_config(config, _OP)
    trans_b = flag(_OP, "trans_b", trans_b)
    num_sms = check_num_cu(_OP, num_cu)
    b_t = None
    if _qo.is_quantized(a) or _qo.is_quantized(b):
        a, _ = _qo.split_pair(_OP, "a", a, config)  # the wgrad reads a in high precision
        b, b_t = _qo.split_pair(_OP, "b", b, config)
    if fuse_bgrad_accum_pattern is not None and isinstance(b, torch.Tensor):
        b = route_wgrad_to_main_grad(b, fuse_bgrad_accum_pattern)
    if b_t is None and plain_hp_operands(a, b):  # checks, quantization and launches in C++
        r = recipe_of(config)
        out_dtype = a.dtype if out_dtype is None else out_dtype
        if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):  # no backward: no Function
            return _native_fwd(a, b, group_lens, group_offs, trans_b, out_dtype, bool(r.use_2d_block), num_sms)
        return NativeGroupedGemmFp4Function.apply(
            a, b, group_lens, group_offs, trans_b, out_dtype, bool(r.use_2d_block), bool(r.use_sr), num_sms,
        )
    out_dtype, k, n = check_hp_operands(_OP, a, b, group_lens, group_offs, trans_b, out_dtype, _FP4_BLOCKS)
    quantized = isinstance(a, QuantizedTensor) or isinstance(b, QuantizedTensor)
    if quantized and k == 0:
        raise ValueError(f"{_OP}: pre-quantized operands need K > 0")
    if (a.shape[0] == 0 or n == 0 or k == 0) and not quantized:
        # nothing to quantize: the bf16 op's exact empty / zero result
        return grouped_gemm(a, b, group_lens, group_offs, trans_b=trans_b, num_cu=num_cu).to(out_dtype)
    r = recipe_of(config)
    contiguous = lambda x: x if isinstance(x, QuantizedTensor) else x.contiguous()  # noqa: E731
    return GroupedGemmFp4Function.apply(
        contiguous(a), contiguous(b), b_t, group_lens, group_offs, trans_b, out_dtype,
        bool(r.use_2d_block), bool(r.use_sr), num_sms,
    )
