"""QuantizedTensor operands restated as what the FP8 GEMM kernels read: a row-major FP8 matrix
quantized along its last dim (the GEMM's reduction dim), its scales in ``quantize_fp8``'s
along-K layout, and the scaling code of ``gemm_fp8.h``. A tensor quantized along its first dim
is transposed (data and scales; no re-quantization); TENSORWISE and 2-D-block tensors serve
either orientation; MX scales are restated as 1x128 blocks (see ``_mx_blocks``)."""

import torch

from primus_turbo.pytorch.core.low_precision import ScalingGranularity
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor, QuantizedTensorPair, _is_fp4, _two_d
from primus_turbo.pytorch.ops import _mx_blocks
from primus_turbo.pytorch.ops._checks import check_cuda_tensors
from primus_turbo.pytorch.ops._transpose import transpose_last2
from primus_turbo.pytorch.ops.quantization import _IN_DTYPES

__all__ = [
    "backward_copy",
    "dense_operands",
    "fp8_matrix",
    "grouped_activation",
    "grouped_weight",
    "is_quantized",
    "split_pair",
]

# pt_fp8_scaling codes (csrc/include/primus_turbo/gemm_fp8.h).
TENSOR, ROW, BLOCK_1x128, BLOCK_128x128 = 0, 1, 2, 3


def is_quantized(x) -> bool:
    return isinstance(x, (QuantizedTensor, QuantizedTensorPair))


def backward_copy(x: QuantizedTensor, x_t, read, requantize):
    """The copy a backward GEMM reads from a QuantizedTensor operand: ``read`` (a restatement
    returning None when the tensor is quantized along the wrong dim) of the pair's other copy
    ``x_t``, else of ``x`` itself, else ``requantize(x)`` (dequantized and quantized again)."""
    for src in (x_t, x):
        got = None if src is None else read(src)
        if got is not None:
            return got
    return requantize(x)


def split_pair(op: str, name: str, x, config=None):
    """(QuantizedTensor or tensor, optional copy along the other dim) of an operand, each
    QuantizedTensor checked against ``config`` (its granularity and block size; the backward
    quantizes the gradient per config, and the two must pair in one GEMM)."""
    data, data_t = (x.data, x.data_t) if isinstance(x, QuantizedTensorPair) else (x, None)
    if isinstance(x, QuantizedTensorPair):
        if not isinstance(data, QuantizedTensor) or not (data_t is None or isinstance(data_t, QuantizedTensor)):
            raise TypeError(f"{op}: argument '{name}' is a QuantizedTensorPair whose members are not QuantizedTensors")
        if data_t is not None and (data_t.shape != data.shape or data_t.device != data.device):
            raise ValueError(
                f"{op}: argument '{name}': data_t has shape {tuple(data_t.shape)} on {data_t.device}; expected data's "
                f"{tuple(data.shape)} on {data.device} (the same tensor quantized along its other dim, not transposed)"
            )
    if config is not None:
        for what, q in (("", data), (".data_t", data_t)):
            if isinstance(q, QuantizedTensor) and (q.granularity != config.granularity or q.block_size != config.block_size):
                raise ValueError(
                    f"{op}: pre-quantized '{name}{what}' is {q.granularity.name} (block_size {q.block_size}) but config is "
                    f"{config.granularity.name} (block_size {config.block_size}): quantize it as the config says"
                )
    return data, data_t


def dense_operands(op: str, a, b, trans_a: bool, trans_b: bool, out_dtype, config):
    """The checks of a dense low-precision GEMM (``gemm_fp8``, ``gemm_fp4``) whose operands may be
    QuantizedTensors / pairs: 2-D, high-precision dtypes, inner dims, M, K and N multiples of 16
    (the transposed copies are FP8 rows of length M and N), one CUDA device. Returns
    ``(a, a_t, b, b_t, out_dtype)``; out_dtype defaults to the operands' promoted dtype."""
    (a, a_t), (b, b_t) = split_pair(op, "a", a, config), split_pair(op, "b", b, config)
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor or QuantizedTensor, got {type(x).__name__}")
        if x.dim() != 2:
            raise ValueError(f"{op}: argument '{name}' must be 2-D, got shape {tuple(x.shape)}")
        if x.dtype not in _IN_DTYPES:  # a QuantizedTensor's dtype is the one it stands for
            raise TypeError(f"{op}: argument '{name}' has dtype {x.dtype}; expected float16, bfloat16 or float32")
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    if k != kb:
        raise ValueError(f"{op}: inner dimensions do not match: op(a) is [{m}, {k}] but op(b) is [{kb}, {n}]")
    if k % 16 or m % 16 or n % 16 or k == 0:
        raise ValueError(f"{op}: with pre-quantized operands M, K and N must be multiples of 16 (K > 0), got {m}, {k}, {n}")
    out_dtype = torch.promote_types(a.dtype, b.dtype) if out_dtype is None else out_dtype
    if out_dtype not in _IN_DTYPES:
        raise TypeError(f"{op}: out_dtype {out_dtype} is not supported; expected float32, float16 or bfloat16")
    check_cuda_tensors(op, a=a, b=b)
    return a, a_t, b, b_t, out_dtype


def _restated_mx(q: torch.Tensor, s: torch.Tensor, two_d: bool, rows: int):
    if two_d:  # 32x32 blocks: each row's scales are its block row's
        s = s.repeat_interleave(32, dim=0)[:rows].contiguous()
    q, s = _mx_blocks.mx_fp8_to_1x128(q.contiguous(), s.contiguous())
    return q, s, BLOCK_1x128


def transposed_qdata(x: QuantizedTensor) -> torch.Tensor:
    """x's FP8 data with its last two dims swapped (per matrix of a stack), made once per
    QuantizedTensor, or the copy the op that quantized x wrote beside it (``keep_transposed_qdata``)."""
    return x.memoized(("transposed_qdata",), lambda: transpose_last2(x.qdata))


def keep_transposed_qdata(x: QuantizedTensor, q_t: torch.Tensor) -> None:
    """Records ``q_t`` (x's data with its last two dims swapped, e.g. written by the optimizer
    step with the copy) as x's transposed data: the restatements below read it instead of
    transposing."""
    x.memoized(("transposed_qdata",), lambda: q_t)


def fp8_matrix(op: str, name: str, x: QuantizedTensor, reduce_dim: int):
    """``(q, scale_inv, scaling code)`` of a 2-D FP8 QuantizedTensor as a GEMM operand whose
    reduction runs over ``reduce_dim`` (0 or 1) of x, or None when x is quantized along the other
    dim (the caller re-quantizes or refuses). Kept with x (``QuantizedTensor.memoized``): a weight
    quantized once a step is transposed for its dgrad once, not per call."""
    if _is_fp4(x.real_dtype) or x.qdata.dim() != 2:
        raise TypeError(f"{op}: argument '{name}' must be a 2-D FP8 QuantizedTensor, got {x!r}")
    if x.is_grouped_tensor and x.granularity in (ScalingGranularity.BLOCKWISE, ScalingGranularity.MX_BLOCKWISE):
        raise ValueError(f"{op}: argument '{name}' is a grouped (padded) QuantizedTensor; pass it to grouped_gemm_fp8")
    return x.memoized(("fp8_matrix", reduce_dim), lambda: _fp8_matrix(op, name, x, reduce_dim))


def _fp8_matrix(op: str, name: str, x: QuantizedTensor, reduce_dim: int):
    g, two_d = x.granularity, _two_d(x.granularity, x.scaling_recipe)
    any_axis = g == ScalingGranularity.TENSORWISE or two_d
    if not any_axis and x.quantized_axis != reduce_dim:
        return None
    q, s = x.qdata, x.scale_inv
    if reduce_dim == 0:
        q = transposed_qdata(x)
        s = s if s.dim() < 2 else s.t().contiguous()
    rows = q.shape[0]
    if g == ScalingGranularity.TENSORWISE:
        return q, s.float().reshape(()), TENSOR
    if g == ScalingGranularity.ROWWISE:
        return q, s.float().reshape(rows, 1), ROW
    if g == ScalingGranularity.MX_BLOCKWISE:
        return _restated_mx(q, s, two_d, rows)
    if x.block_size != 128:
        raise ValueError(f"{op}: argument '{name}' has BLOCKWISE block_size {x.block_size}; the FP8 GEMM reads 128")
    return q, s.float(), BLOCK_128x128 if two_d else BLOCK_1x128


def _expanded(s: torch.Tensor, shape) -> torch.Tensor:
    return s.float().expand(*shape).contiguous()


def grouped_weight(op: str, name: str, x: QuantizedTensor, k_dim: int):
    """``(q [G, N, K], scale, b_scale_rows)`` of a 3-D FP8 QuantizedTensor ``[G, X, Y]`` as the
    grouped FP8 kernel's B, reducing over ``k_dim`` (1 or 2), or None when x is quantized along
    the other dim. Scales: ``[G, N, ceil(K/128)]`` per row (rows 1) or ``[G, ceil(N/128),
    ceil(K/128)]`` per 128x128 block (rows 128). Kept with x (``QuantizedTensor.memoized``): a
    weight quantized once a step is transposed and restated once, not per micro-batch."""
    if _is_fp4(x.real_dtype) or x.qdata.dim() != 3:
        raise TypeError(f"{op}: argument '{name}' must be a 3-D FP8 QuantizedTensor [G, N, K], got {x!r}")
    return x.memoized(("grouped_weight", k_dim), lambda: _grouped_weight(op, name, x, k_dim))


def _grouped_weight(op: str, name: str, x: QuantizedTensor, k_dim: int):
    g, two_d = x.granularity, _two_d(x.granularity, x.scaling_recipe)
    groups, dx, dy = x.qdata.shape
    transpose = k_dim == 1
    q = transposed_qdata(x) if transpose else x.qdata
    n, k = q.shape[1], q.shape[2]
    kb = -(-k // 128)
    s = x.scale_inv
    if g == ScalingGranularity.TENSORWISE:
        return q, _expanded(s.reshape(1, 1, 1), (groups, -(-n // 128), kb)), 128
    if g == ScalingGranularity.MX_BLOCKWISE:
        if two_d:
            raise NotImplementedError(f"{op}: argument '{name}': MX_BLOCKWISE 32x32 blocks are not supported for a "
                                      "grouped weight; quantize it along K (1-D blocks of 32)")
        if x.quantized_axis != k_dim:
            return None
        s = s.reshape(groups, *s.shape[-2:])
        s = s.transpose(1, 2) if transpose else s  # [G, N, ceil(K/32)]
        q8, s8 = _mx_blocks.mx_fp8_to_1x128(q.reshape(groups * n, k).contiguous(),
                                            s.reshape(groups * n, -1).contiguous())
        return q8.view(groups, n, k), s8.view(groups, n, kb), 1
    if two_d:
        if x.block_size != 128 or dx % 128:
            raise ValueError(f"{op}: a 2-D-block '{name}' needs 128x128 blocks within each expert ({dx} rows a group)")
        s = s.float().reshape(groups, dx // 128, -(-dy // 128))
        return q, (s.transpose(1, 2).contiguous() if transpose else s.contiguous()), 128
    if x.quantized_axis != k_dim:
        return None
    s = s.float().reshape(groups, *(s.shape[-2:]))
    s = s.transpose(1, 2) if transpose else s  # now [G, N, groups along K]
    if g == ScalingGranularity.ROWWISE:
        return q, _expanded(s, (groups, n, kb)), 1
    if x.block_size != 128:
        raise ValueError(f"{op}: argument '{name}' has BLOCKWISE block_size {x.block_size}; the kernel reads 128")
    return q, s.contiguous(), 1


def grouped_activation(op: str, name: str, x: QuantizedTensor):
    """``(q [M, K], scale [M, ceil(K/128)])`` of a 2-D FP8 QuantizedTensor quantized along K in the
    tight token layout (TENSORWISE, ROWWISE, BLOCKWISE 1x128, MX restated as 1x128)."""
    if _is_fp4(x.real_dtype) or x.qdata.dim() != 2:
        raise TypeError(f"{op}: argument '{name}' must be a 2-D FP8 QuantizedTensor [M, K], got {x!r}")
    g = x.granularity
    if _two_d(g, x.scaling_recipe):
        raise NotImplementedError(f"{op}: argument '{name}': 2-D blocks are not supported for a grouped activation")
    if g != ScalingGranularity.TENSORWISE and x.quantized_axis != 1:
        raise ValueError(f"{op}: argument '{name}' must be quantized along K (axis -1), got axis {x.quantized_axis}")
    if x.is_grouped_tensor and g in (ScalingGranularity.BLOCKWISE, ScalingGranularity.MX_BLOCKWISE):
        raise ValueError(f"{op}: argument '{name}' is in a padded per-group layout; quantize the tokens with quantize_fp8")
    m, k = x.qdata.shape
    kb = -(-k // 128)
    if g == ScalingGranularity.MX_BLOCKWISE:
        return _mx_blocks.mx_fp8_to_1x128(x.qdata, x.scale_inv)
    if g == ScalingGranularity.BLOCKWISE:
        if x.block_size != 128:
            raise ValueError(f"{op}: argument '{name}' has BLOCKWISE block_size {x.block_size}; the kernel reads 128")
        return x.qdata, x.scale_inv.float().reshape(m, kb).contiguous()
    return x.qdata, _expanded(x.scale_inv.reshape(-1, 1), (m, kb))
