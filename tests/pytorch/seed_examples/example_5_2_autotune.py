import torch
import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.backend import GlobalBackendManager

GlobalBackendManager.set_auto_tune(True)  # or set PRIMUS_TURBO_AUTO_TUNE=1

# First call may be slower due to profiling; later calls hit the cache.
# Use fixed shapes for best results.
device = "cuda:0"
dtype = torch.bfloat16
G, M, N, K = 4, 128, 256, 512
group_lens = torch.tensor([32, 16, 48, 32], dtype=torch.long, device=device)
a = torch.randn(M, K, device=device, dtype=dtype)
b = torch.randn(G, K, N, device=device, dtype=dtype)
out = turbo.ops.grouped_gemm(a, b, group_lens, trans_b=False)
print(out.shape)

# Clear backend settings + all AutoTune caches.
GlobalBackendManager.reset()
