"""The quantization calls gemm_fp8 makes, following the turbo.ops.quantize_fp8 contract.

When the fused CUDA quantizer (``quantization.quantize_fp8_row_and_transposed``) is importable it is used;
otherwise these composite torch expressions of the same contract stand in for it (same outputs,
traceable, no host sync; slower: several passes over the input instead of one).
"""

import importlib

import torch

from primus_turbo.pytorch.core.low_precision import ScalingGranularity

_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_TINY = 1e-12


def _kernel_quantizer():
    try:
        mod = importlib.import_module("primus_turbo.pytorch.ops.quantization")
    except ImportError:
        return None
    return getattr(mod, "quantize_fp8_row_and_transposed", None)


_quantize_with_trans_kernel = _kernel_quantizer()


def _cast(x: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    fmax = _FP8_MAX[dtype]
    return (x / scale_inv).clamp(-fmax, fmax).to(dtype)


def _quantize_lastdim(x: torch.Tensor, dtype: torch.dtype, block: int):
    """x [R, C] in fp32 quantized along its last dim in blocks of `block` (block=0: whole row)."""
    r, c = x.shape
    fmax = _FP8_MAX[dtype]
    if block == 0:
        s = (x.abs().amax(dim=1, keepdim=True).clamp_min(_TINY) / fmax)
        return _cast(x, s, dtype), s
    nb = -(-c // block)
    xp = torch.nn.functional.pad(x, (0, nb * block - c)).view(r, nb, block)
    s = xp.abs().amax(dim=2).clamp_min(_TINY) / fmax
    q = _cast(xp, s.unsqueeze(2), dtype).view(r, nb * block)[:, :c]
    return q.contiguous(), s


def _quantize_2d(x: torch.Tensor, dtype: torch.dtype, block: int):
    r, c = x.shape
    rb, cb = -(-r // block), -(-c // block)
    xp = torch.nn.functional.pad(x, (0, cb * block - c, 0, rb * block - r)).view(rb, block, cb, block)
    s = xp.abs().amax(dim=(1, 3)).clamp_min(_TINY) / _FP8_MAX[dtype]
    q = _cast(xp, s[:, None, :, None], dtype).view(rb * block, cb * block)[:r, :c]
    return q.contiguous(), s


def quantize_with_trans(x: torch.Tensor, dtype: torch.dtype, granularity: ScalingGranularity, block_size, two_d: bool):
    """(q_row, s_row, q_col, s_col): x [R, C] quantized along C (row-major [R, C]) and x^T
    quantized along R (row-major [C, R]); see quantization.quantize_fp8_row_and_transposed."""
    if _quantize_with_trans_kernel is not None:
        return _quantize_with_trans_kernel(x, dtype, granularity, block_size=block_size, two_d=two_d)
    return reference_quantize_with_trans(x, dtype, granularity, block_size, two_d)


def reference_quantize_with_trans(x: torch.Tensor, dtype: torch.dtype, granularity, block_size, two_d: bool):
    """The same contract in plain torch (fp32 math): the stand-in without the CUDA quantizer, and
    an independent source of quantized operands for GEMM kernel tests."""
    xf = x.float()
    if granularity == ScalingGranularity.TENSORWISE:
        s = xf.abs().amax().clamp_min(_TINY) / _FP8_MAX[dtype]
        q = _cast(xf, s, dtype)
        return q, s, q.t().contiguous(), s
    if granularity == ScalingGranularity.BLOCKWISE and two_d:
        q, s = _quantize_2d(xf, dtype, block_size)
        return q, s, q.t().contiguous(), s.t().contiguous()
    block = 0 if granularity == ScalingGranularity.ROWWISE else block_size
    q_row, s_row = _quantize_lastdim(xf, dtype, block)
    q_col, s_col = _quantize_lastdim(xf.t(), dtype, block)
    return q_row, s_row, q_col, s_col
