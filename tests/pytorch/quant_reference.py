"""Float64/float32 torch references of the quantization kernels' math (same scale rule, RNE,
saturation), shared by the quantization tests and the benchmark's correctness check."""

import torch

AMAX_EPS = 1e-30
FMT = {
    torch.float8_e4m3fn: (448.0, 8, 3, -6),  # max, emax, mantissa bits, min normal exponent
    torch.float8_e5m2: (57344.0, 15, 2, -14),
    "fp4": (6.0, 2, 1, 0),
}
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
RHT_SIGNS = torch.tensor([-1.0 if (0x9A5C >> i) & 1 else 1.0 for i in range(16)], dtype=torch.float64)


def cdiv(a, b):
    return (a + b - 1) // b


def group_amax(x: torch.Tensor, gm: int, gk: int) -> torch.Tensor:
    """amax over gm x gk groups of a 2-D tensor (partial groups at the ends): [ceil(M/gm), ceil(K/gk)]."""
    m, k = x.shape
    pm, pk = cdiv(m, gm) * gm, cdiv(k, gk) * gk
    xp = torch.zeros(pm, pk, dtype=x.dtype, device=x.device)
    xp[:m, :k] = x.abs()
    return xp.view(pm // gm, gm, pk // gk, gk).amax(dim=(1, 3))


def expand(s: torch.Tensor, gm: int, gk: int, m: int, k: int) -> torch.Tensor:
    return s.repeat_interleave(gm, 0).repeat_interleave(gk, 1)[:m, :k]


def fp32_scales(amax: torch.Tensor, fmax: float):
    """(mult, scale_inv) in float32 as the kernels compute them."""
    mult = torch.tensor(fmax, dtype=torch.float32, device=amax.device) / amax.float().clamp(min=AMAX_EPS)
    return mult, mult.reciprocal()


def mx_scales(amax: torch.Tensor, fmax: float):
    """(mult, scale_inv, e8m0 byte): exponent ceil(log2(amax / fmax)) with the quotient rounded to
    float32 as the kernels divide, clamped to E8M0's range; zero and tiny quotients give -127."""
    x = amax.float() / torch.tensor(fmax, dtype=torch.float32, device=amax.device)
    m, exp = torch.frexp(x.double())
    e = torch.where(m == 0.5, exp - 1, exp)
    e = torch.where(x >= 2.0**-126, e, torch.full_like(e, -127)).clamp(-127, 127)
    return torch.pow(2.0, -e.double()), torch.pow(2.0, e.double()), (e + 127).to(torch.uint8)


def fp8_cast(v: torch.Tensor, dtype) -> torch.Tensor:
    fmax = FMT[dtype][0]
    return v.clamp(-fmax, fmax).to(dtype)


def fp8_ulp(v: torch.Tensor, dtype) -> torch.Tensor:
    """Spacing of the FP8 grid at |v| (float64)."""
    _, _, mbits, emin = FMT[dtype]
    _, exp = torch.frexp(v.double().abs())
    e = torch.clamp(exp - 1, min=emin)
    return torch.pow(2.0, (e - mbits).double())


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    a = v.abs()
    c = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int() + (a > 2.5).int()
         + (a >= 3.5).int() + (a > 5.0).int())
    return (c + 8 * torch.signbit(v).int()).to(torch.uint8)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    return E2M1_VALUES.to(codes.device)[codes.long()]


def unpack_fp4(q: torch.Tensor) -> torch.Tensor:
    """[R, C/2] packed bytes -> [R, C] codes (low nibble = even element)."""
    b = q.view(torch.uint8)
    return torch.stack((b & 15, b >> 4), dim=-1).reshape(b.shape[0], -1)


def rht(x: torch.Tensor, dim: int) -> torch.Tensor:
    """y = H16 diag(s) x / 4 on each 16 consecutive elements along dim (float64)."""
    h = torch.tensor([[(-1.0) ** (i & j).bit_count() for j in range(16)] for i in range(16)], dtype=torch.float64,
                     device=x.device)
    xt = x.double().movedim(dim, -1)
    g = xt.reshape(*xt.shape[:-1], -1, 16) * RHT_SIGNS.to(x.device)
    y = (g @ h.T) / 4
    return y.reshape(xt.shape).movedim(-1, dim)


def inverse_rht(y: torch.Tensor, dim: int) -> torch.Tensor:
    h = torch.tensor([[(-1.0) ** (i & j).bit_count() for j in range(16)] for i in range(16)], dtype=torch.float64,
                     device=y.device)
    yt = y.double().movedim(dim, -1)
    g = (yt.reshape(*yt.shape[:-1], -1, 16) @ h.T) / 4 * RHT_SIGNS.to(y.device)
    return g.reshape(yt.shape).movedim(-1, dim)
