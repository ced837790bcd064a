"""MX (E8M0 per 32) and MXFP4 operands restated as 1x128 block-scaled FP8 for Hopper.

Hopper has no MX or FP4 tensor cores, and its FP8 block-scaled GEMM (CUTLASS's sm90 collective,
cuBLASLt's VEC128 mode) promotes the tensor-core partial sums into FP32 once per 128-deep K
block, so it takes one FP32 scale per row and 128-block. An MX operand has four E8M0 scales
there, one per 32. They are powers of two, so the four sub-blocks are re-expressed in the
largest of them, emax:

    q' = q * 2^(e - emax)  (in the operand's FP8 format),   scale' = 2^emax

Multiplying by a power of two is exact in floating point, so q' * scale' == q * 2^e bit for bit
unless q * 2^(e - emax) falls below the format's smallest normal (2^-6 for E4M3, 2^-14 for E5M2):
then it is rounded (to nearest even) to the subnormal grid, an error of at most half a subnormal
step. The block's largest value sits at >= 2^8 (E4M3) or >= 2^15 (E5M2) in these units (the E8M0
rule puts each sub-block's amax in [2^emax_fmt, 2^(emax_fmt+1))), so that error is below 2^-18
(E4M3) or 2^-32 (E5M2) of the block's largest magnitude: far below the format's own rounding of
2^-4 / 2^-3 relative. FP4 (E2M1) values are first written as E4M3 times 2^6 (every E2M1 value
times 64 is an E4M3 normal, 32 ... 384, with at most two significant bits), so an FP4 sub-block
is restated exactly as long as its scale is at most 2^14 below the block's largest.

The restated operand feeds the existing 1x128 x 1x128 FP8 GEMM (both operands K-major with per-
row 1x128 scales). On CUDA the restatement is one kernel (``pt_mx_to_blocks``, kernels/gemm/
mx_to_blocks.cuh: reads the FP8 / packed FP4 data once, writes FP8 + scales), registered as
``primus_turbo::mx_to_blocks`` with a fake implementation; the plain-torch functions below compute
the same bits (a few elementwise passes) and serve CPU tensors, tests, and
``PRIMUS_TURBO_MX_RESTATE=torch``. No host synchronization either way.
"""

import os

import torch
import torch.nn.functional as F

from primus_turbo._core import check, lib
from primus_turbo.pytorch.core import library
from primus_turbo.pytorch.core.low_precision import float4_e2m1fn_x2
from primus_turbo.pytorch.core.tensor_bridge import current_stream_handle, device_guard, to_pt

MX_BLOCK = 32
_E8M0_BIAS = 127
_FP4_TO_E4M3_SHIFT = 6  # E2M1 value * 2^6 as E4M3

# E4M3 bit pattern of (E2M1 nibble value) * 2^6, indexed by the nibble (bit 3 = sign).
_FP4_E4M3_BITS = (0x00, 0x60, 0x68, 0x6C, 0x70, 0x74, 0x78, 0x7C)
_FP4_E4M3_LUT = _FP4_E4M3_BITS + tuple(v | 0x80 for v in _FP4_E4M3_BITS)
# E2M1 nibble -> value (for references and tests).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

_luts = {}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def e8m0_exponents(s: torch.Tensor) -> torch.Tensor:
    """E8M0 scales (torch.float8_e8m0fnu or uint8 bits) -> int32 biased exponents."""
    return s.view(torch.uint8).to(torch.int32)


def row_scales(s: torch.Tensor, rows: int) -> torch.Tensor:
    """MX scales [rows, kb32], or 2-D 32x32 block scales [ceil(rows/32), kb32] (a weight
    quantized with use_2d_block), as per-row [rows, kb32]."""
    if s.shape[0] == rows:
        return s
    return s.repeat_interleave(MX_BLOCK, 0)[:rows]


def fp4_as_e4m3(q: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 [R, K/2] (low nibble = even element) -> E4M3 [R, K] holding value * 2^6."""
    bits = q.view(torch.uint8)
    lut = _luts.get(bits.device)
    if lut is None:
        lut = torch.tensor(_FP4_E4M3_LUT, dtype=torch.uint8, device=bits.device)
        if not torch.compiler.is_compiling():
            _luts[bits.device] = lut
    nib = torch.stack((bits & 15, bits >> 4), dim=-1).reshape(bits.shape[0], 2 * bits.shape[1])
    return lut[nib.to(torch.int32)].view(torch.float8_e4m3fn)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32 for integer e, exact down to the subnormals (exp2 may be an ulp off there,
    e.g. for the E8M0 code 0, 2^-127); 0 below 2^-149."""
    e = e.to(torch.int32)
    normal = (e + 127).clamp(min=1, max=254) << 23
    subnormal = torch.ones_like(e) << (e + 149).clamp(min=0, max=22)
    bits = torch.where(e >= -126, normal, torch.where(e >= -149, subnormal, torch.zeros_like(e)))
    return bits.view(torch.float32)


def to_1x128(q: torch.Tensor, exps: torch.Tensor, extra_shift: int = 0):
    """q [R, K] FP8 with per-32 biased E8M0 exponents exps [R, ceil(K/32)] (int32), each value
    meaning q * 2^(e - 127 - extra_shift), restated as (q' [R, K] same dtype, scale_inv
    [R, ceil(K/128)] fp32) with per-1x128 scales (see the module docstring)."""
    r, k = q.shape
    kb32 = exps.shape[1]
    kb = _cdiv(kb32, 4)
    # Pad the exponent list with 0 (the smallest E8M0): it never raises a block's maximum.
    e4 = F.pad(exps, (0, 4 * kb - kb32)).view(r, kb, 4)
    emax = e4.amax(dim=2)
    shift = pow2(e4 - emax.unsqueeze(2)).view(r, 4 * kb)[:, :kb32]
    # bf16 holds every FP8 value times a power of two exactly down to 2^-133, below anything an
    # FP8 subnormal can keep, so the one rounding is the final cast.
    x = F.pad(q.to(torch.bfloat16), (0, kb32 * MX_BLOCK - k)).view(r, kb32, MX_BLOCK)
    x = x * shift.to(torch.bfloat16).unsqueeze(2)
    q_out = x.view(r, kb32 * MX_BLOCK)[:, :k].to(q.dtype).contiguous()
    scale_inv = pow2(emax - (_E8M0_BIAS + extra_shift))
    return q_out, scale_inv


def reference_mx_fp8_to_1x128(q: torch.Tensor, s: torch.Tensor):
    return to_1x128(q, row_scales(e8m0_exponents(s), q.shape[0]))


def reference_mx_fp4_to_1x128(q: torch.Tensor, s: torch.Tensor):
    q8 = fp4_as_e4m3(q)
    return to_1x128(q8, row_scales(e8m0_exponents(s), q8.shape[0]), _FP4_TO_E4M3_SHIFT)


# ---- the CUDA kernel as a registered op -----------------------------------------------------------


def _out_shapes(q: torch.Tensor):
    rows = q.shape[0]
    k = 2 * q.shape[1] if is_fp4(q) else q.shape[1]
    dtype = torch.float8_e4m3fn if is_fp4(q) else q.dtype
    return rows, k, dtype


def _restate_cuda(q: torch.Tensor, s: torch.Tensor):
    rows, k, dtype = _out_shapes(q)
    q_out = torch.empty((rows, k), dtype=dtype, device=q.device)
    s_out = torch.empty((rows, _cdiv(k, 128)), dtype=torch.float32, device=q.device)
    if rows == 0 or k == 0:
        return q_out, s_out
    if q.data_ptr() % 16:  # a view at an odd offset: an aligned copy (bytes, whatever the dtype)
        q = q.view(torch.uint8).clone() if is_fp4(q) else q.clone()
    with device_guard(q.device):
        status = lib.pt_mx_to_blocks(to_pt(q), to_pt(s), to_pt(q_out), to_pt(s_out), current_stream_handle(q.device))
    if status:
        check(status, context="MX restatement")
    return q_out, s_out


def _restate_fake(q, s):
    rows, k, dtype = _out_shapes(q)
    return q.new_empty((rows, k), dtype=dtype), q.new_empty((rows, _cdiv(k, 128)), dtype=torch.float32)


_restate_op = library.define_op(
    "mx_to_blocks(Tensor q, Tensor scale) -> (Tensor, Tensor)", _restate_cuda, _restate_fake
)
_USE_TORCH = os.environ.get("PRIMUS_TURBO_MX_RESTATE", "").lower() == "torch"


def _restate(q: torch.Tensor, s: torch.Tensor, reference):
    if _USE_TORCH or q.device.type == "cpu":
        return reference(q, s)
    return _restate_op(q.contiguous(), s.contiguous())


def mx_fp8_to_1x128(q: torch.Tensor, s: torch.Tensor):
    """MX FP8 operand (q [R, K], E8M0 s [R, ceil(K/32)] or 2-D [ceil(R/32), ceil(K/32)]) ->
    (q' [R, K] same dtype, fp32 scale_inv [R, ceil(K/128)])."""
    return _restate(q, s, reference_mx_fp8_to_1x128)


def mx_fp4_to_1x128(q: torch.Tensor, s: torch.Tensor):
    """MXFP4 operand (packed q [R, K/2], E8M0 s [R, ceil(K/32)] or 2-D [ceil(R/32), ceil(K/32)])
    -> E4M3 [R, K] with 1x128 fp32 scales."""
    return _restate(q, s, reference_mx_fp4_to_1x128)


def is_fp4(t: torch.Tensor) -> bool:
    return t.dtype == torch.uint8 or (float4_e2m1fn_x2 is not None and t.dtype == float4_e2m1fn_x2)
