import torch
import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.backend import BackendType, GlobalBackendManager
from primus_turbo.pytorch.core.low_precision import (
    Float8QuantConfig,
    Format,
    ScalingGranularity,
)

device = "cuda:0"
dtype = torch.bfloat16

# Set GEMM backend to CK
GlobalBackendManager.set_gemm_backend(BackendType.CK)

M, N, K = 128, 256, 512
a = torch.randn((M, K), dtype=dtype, device=device)
b = torch.randn((N, K), dtype=dtype, device=device)  # [N, K] when trans_b=True

fp8_cfg = Float8QuantConfig(
    format=Format.E4M3,
    granularity=ScalingGranularity.TENSORWISE,
)

out = turbo.ops.gemm_fp8(a, b, trans_a=False, trans_b=True, out_dtype=dtype, config=fp8_cfg)
print(out.shape)

# Unset GEMM backend
GlobalBackendManager.set_gemm_backend(None)
