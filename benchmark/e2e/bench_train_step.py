"""End-to-end training step of a dense decoder stack: our modules against the same model built from
torch layers, in eager mode and under torch.compile, bf16 and FP8.

    python benchmark/e2e/bench_train_step.py [--model Llama-3.1-8B] [--layers 4] [--tokens 8192]
        [--variants torch_eager torch_compile turbo_bf16 turbo_fp8_rowwise ...] [--steps 50]

The model: ``--layers`` Llama-style blocks (RMSNorm, QKV projection, RoPE, causal GQA attention,
output projection, RMSNorm, SwiGLU MLP) with the dimensions of ``--model``
(benchmark/ops/config.py, from shared/MODELS.md), a final norm and a loss on the hidden states (the
vocabulary head is left out: it is a GEMM of its own and dominates small stacks). Every variant
starts from the same weights and trains on the same data with AdamW.

Variants:
- ``torch_eager`` / ``torch_compile``: torch.nn.Linear, torch.nn.RMSNorm, torch RoPE and SwiGLU,
  attention through torch's scaled_dot_product_attention (its own backend choice);
- ``turbo_bf16``: the same model after ``turbo.convert_model`` (our Linear and RMSNorm), with
  ``turbo.ops.rope``, ``turbo.ops.swiglu`` and ``turbo.ops.flash_attn_func`` (on the attention
  backend ``--attn-backend`` names; unset, the library's choice);
- ``turbo_fp8_<granularity>``: ``turbo.convert_model(model, fp8_config=...)`` (Float8Linear,
  HYBRID) on top of that, for tensorwise, rowwise and blockwise;
- ``turbo_*_compile``: a turbo variant under torch.compile.

Per variant: median ms of a training step's forward+backward (the optimizer step timed apart),
model TFLOPS (6 x linear parameters x tokens + causal attention), the share of the step the GPU is
busy and a kernel-family breakdown from torch.profiler (GEMM, attention, quantization,
normalization/activation, other), the SNR of the stack's output at the shared initial weights
against torch eager's (a variant below 30 dB bf16 / 15 dB FP8 FAILs; the loss alone could not catch
wrong numerics), and the loss after ``--steps`` steps against torch's. Summary
entries ``e2e_dense_bf16`` and ``e2e_dense_fp8_<granularity>`` (ratio against torch eager),
CSV ``e2e_dense.csv``.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
import bench_utils as bu  # noqa: E402
import config as cfg  # noqa: E402


# ---- the model -----------------------------------------------------------------------------------


def rope_tables(seq: int, head_dim: int, device, theta: float = 500000.0):
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    ang = torch.arange(seq, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def torch_rope(x, cos, sin):
    """Rotate-half RoPE of x [B, S, H, D] with float32 tables [S, D/2]."""
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    x1, x2 = x.float().chunk(2, -1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, m: cfg.DenseModelConfig, turbo_ops=None):
        super().__init__()
        self.m, self.turbo_ops = m, turbo_ops
        self.attn_norm = nn.RMSNorm(m.hidden, eps=1e-5)
        self.qkv = nn.Linear(m.hidden, m.q_dim + 2 * m.kv_dim, bias=False)
        self.out = nn.Linear(m.q_dim, m.hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(m.hidden, eps=1e-5)
        self.gate_up = nn.Linear(m.hidden, 2 * m.intermediate, bias=False)
        self.down = nn.Linear(m.intermediate, m.hidden, bias=False)

    def forward(self, x, cos, sin):
        m, b, s = self.m, x.shape[0], x.shape[1]
        q, k, v = self.qkv(self.attn_norm(x)).split([m.q_dim, m.kv_dim, m.kv_dim], -1)
        q = q.view(b, s, m.num_heads_q, m.head_dim)
        k = k.view(b, s, m.num_heads_kv, m.head_dim)
        v = v.view(b, s, m.num_heads_kv, m.head_dim)
        if self.turbo_ops is not None:
            q, k = self.turbo_ops.rope(q, k, cos, sin)
        else:
            q, k = torch_rope(q, cos, sin), torch_rope(k, cos, sin)
        if self.turbo_ops is not None:
            attn = self.turbo_ops.flash_attn_func(q, k, v, causal=True)  # [B, S, H, D]
        else:
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
            ).transpose(1, 2)
        x = x + self.out(attn.reshape(b, s, m.q_dim))
        h = self.gate_up(self.mlp_norm(x))
        if self.turbo_ops is not None:
            h = self.turbo_ops.swiglu(h)
        else:
            gate, up = h.chunk(2, -1)
            h = F.silu(gate) * up
        return x + self.down(h)


class Stack(nn.Module):
    def __init__(self, m: cfg.DenseModelConfig, layers: int):
        super().__init__()
        self.layers = nn.ModuleList([Block(m) for _ in range(layers)])
        self.norm = nn.RMSNorm(m.hidden, eps=1e-5)

    def use_turbo_ops(self, ops) -> None:
        for layer in self.layers:
            layer.turbo_ops = ops

    def forward(self, x, cos, sin):
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


def model_flops(m: cfg.DenseModelConfig, layers: int, batch: int, seq: int) -> float:
    """Forward + backward FLOPs of one step: 6 x (linear weights) x tokens plus causal attention
    (forward 2·B·S²·H·(Dqk + Dv) halved for causality, backward 2.5x)."""
    linear = m.hidden * (m.q_dim + 2 * m.kv_dim) + m.q_dim * m.hidden + 3 * m.hidden * m.intermediate
    attn_fwd = 2 * batch * seq * seq * m.num_heads_q * (2 * m.head_dim) / 2
    return layers * (6 * linear * batch * seq + 3.5 * attn_fwd)


# ---- variants ------------------------------------------------------------------------------------

GRANULARITIES = ("tensorwise", "rowwise", "blockwise")
ALL_VARIANTS = ("torch_eager", "torch_compile", "turbo_bf16", "turbo_bf16_compile") + tuple(
    f"turbo_fp8_{g}" for g in GRANULARITIES
)


def build(variant: str, base_state: dict, m, layers: int, device, dtype):
    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity

    model = Stack(m, layers).to(device=device, dtype=dtype)
    model.load_state_dict(base_state)
    if variant.startswith("turbo"):
        fp8 = None
        if "_fp8_" in variant:
            g = variant.split("_fp8_")[1].split("_")[0]
            gran = {"tensorwise": ScalingGranularity.TENSORWISE, "rowwise": ScalingGranularity.ROWWISE,
                    "blockwise": ScalingGranularity.BLOCKWISE}[g]
            fp8 = Float8QuantConfig(format=Format.HYBRID, granularity=gran,
                                    block_size=128 if gran == ScalingGranularity.BLOCKWISE else None)
        turbo.convert_model(model, fp8_config=fp8)
        model.use_turbo_ops(turbo.ops)
    step_model = torch.compile(model) if variant.endswith("compile") else model
    return model, step_model


# ---- profiling -----------------------------------------------------------------------------------

# First match wins: GEMM before quantization, since block-scaled GEMM kernels name their scales.
FAMILIES = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|cublas|xmma|nvjet|matmul|sm90_", re.I)),
    ("quantization", re.compile(r"quant|amax|fp8_cast", re.I)),
    ("norm/activation", re.compile(r"norm|swiglu|silu|rope|gated|glu", re.I)),
)


def kernel_breakdown(run_step, reset, steps: int = 3) -> tuple[dict, float]:
    """(ms per step per kernel family, GPU-busy ms per step) from torch.profiler; reset() runs
    between steps (outside the profile) so each step is what the timed one is."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run_step()
            torch.cuda.synchronize()
            with torch.profiler.record_function("reset"):
                reset()
        torch.cuda.synchronize()
    out = {name: 0.0 for name, _ in FAMILIES}
    out["other"] = 0.0
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        ms = evt.device_time_total / 1000.0 if hasattr(evt, "device_time_total") else evt.cuda_time_total / 1000.0
        for name, pattern in FAMILIES:
            if pattern.search(evt.name):
                out[name] += ms
                break
        else:
            out["other"] += ms
    per_step = {k: v / steps for k, v in out.items()}
    return per_step, sum(per_step.values())


# ---- main ----------------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="Llama-3.1-8B", choices=sorted(cfg.DENSE_MODELS))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=8192, help="tokens per step (batch = tokens // seq)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: min(model's, tokens))")
    p.add_argument("--variants", nargs="+", default=list(ALL_VARIANTS), choices=ALL_VARIANTS)
    p.add_argument("--steps", type=int, default=50, help="training steps for the loss comparison")
    p.add_argument("--timed", type=int, default=10, help="timed steps per variant")
    p.add_argument("--device", default="cuda")
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--no-summary", action="store_true")
    p.add_argument("--attn-backend", choices=("auto", "TURBO", "CUDNN"), default="auto",
                   help="attention backend of the turbo variants (auto: unset, the library's choice)")
    args = p.parse_args()
    if args.attn_backend != "auto":
        from primus_turbo.pytorch.core.backend import GlobalBackendManager

        GlobalBackendManager.set_attn_backend(args.attn_backend)

    m = cfg.DENSE_MODELS[args.model]
    seq = args.seq or min(m.seq, args.tokens)
    batch = max(1, args.tokens // seq)
    device, dtype = torch.device(args.device), torch.bfloat16
    torch.manual_seed(1234)
    base_state = Stack(m, args.layers).to(dtype=dtype).state_dict()
    x = torch.randn(batch, seq, m.hidden, device=device, dtype=dtype)
    target = torch.randn(batch, seq, m.hidden, device=device, dtype=dtype)
    cos, sin = rope_tables(seq, m.head_dim, device)
    flops = model_flops(m, args.layers, batch, seq)
    on_gpu = device.type == "cuda"

    rows = []
    reference_out = None  # torch eager's output at the initial weights (run it first)
    variants = sorted(args.variants, key=lambda v: v != "torch_eager")
    for variant in variants:
        row = {"variant": variant, "model": args.model, "layers": args.layers, "batch": batch, "seq": seq,
               "attn_backend": "sdpa" if variant.startswith("torch") else args.attn_backend}
        try:
            model, step_model = build(variant, base_state, m, args.layers, device, dtype)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def fwd_bwd():
                loss = F.mse_loss(step_model(x, cos, sin).float(), target.float())
                loss.backward()
                return loss

            def step():
                loss = fwd_bwd()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss

            # Numerics first: the output at the shared initial weights against torch eager's.
            with torch.no_grad():
                out0 = step_model(x, cos, sin).float()
            if reference_out is None and variant == "torch_eager":
                reference_out = out0
            if reference_out is not None:
                row["out_snr_db"] = bu.snr_db(out0, reference_out)
            del out0
            losses = [step().item() for _ in range(args.steps)]
            row["loss_first"], row["loss_final"] = losses[0], losses[-1]
            times, opt_times = [], []
            for _ in range(args.timed):
                if on_gpu:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fwd_bwd()
                if on_gpu:
                    torch.cuda.synchronize()
                t1 = time.perf_counter()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if on_gpu:
                    torch.cuda.synchronize()
                times.append((t1 - t0) * 1e3)
                opt_times.append((time.perf_counter() - t1) * 1e3)
            row["step_ms"] = statistics.median(times)
            row["optimizer_ms"] = statistics.median(opt_times)
            row["tflops"] = flops / (row["step_ms"] * 1e-3) / 1e12
            if on_gpu:
                families, busy = kernel_breakdown(fwd_bwd, lambda: opt.zero_grad(set_to_none=True))
                row["gpu_busy_ms"] = busy
                row["gpu_busy_share"] = busy / row["step_ms"]
                for name, ms in families.items():
                    row[f"{name}_ms"] = ms
                opt.zero_grad(set_to_none=True)
            gate = 30.0 if "fp8" not in variant else 15.0  # SNR of the stack's output vs torch eager, dB
            if not all(math.isfinite(v) for v in losses):
                row["status"] = "FAIL (non-finite loss)"
            elif row.get("out_snr_db", float("inf")) < gate:
                row["status"] = f"FAIL (output SNR {row['out_snr_db']:.1f} dB < {gate} dB vs torch eager)"
            else:
                row["status"] = "OK"
        except Exception as e:  # a variant that breaks is reported, the others still run
            row["status"] = f"ERROR {type(e).__name__}: {e}"[:300]
        rows.append(row)
        print(
            f"{variant:24s} step {row.get('step_ms', float('nan')):8.2f} ms  {row.get('tflops', float('nan')):7.1f} TFLOPS"
            f"  busy {row.get('gpu_busy_share', float('nan')):.2f}  loss {row.get('loss_final', float('nan')):.4f}"
            f"  {row['status']}",
            flush=True,
        )

    base = next((r for r in rows if r["variant"] == "torch_eager" and r["status"] == "OK"), None)
    for r in rows:
        if base is not None and "step_ms" in r:
            r["speedup_vs_torch_eager"] = base["step_ms"] / r["step_ms"]
            r["loss_rel_diff"] = abs(r["loss_final"] - base["loss_final"]) / max(abs(base["loss_final"]), 1e-12)
    gpu = bu.gpu_short_name() if on_gpu else "cpu"
    out_dir = bu.results_dir_for(args.output_dir, gpu)
    rows = [{**bu.run_stamp(gpu), **r} for r in rows]
    columns = ["gpu", "date", "commit", "variant", "attn_backend", "model", "layers", "batch", "seq", "step_ms", "optimizer_ms", "tflops", "speedup_vs_torch_eager",
               "gpu_busy_ms", "gpu_busy_share"] + [f"{n}_ms" for n, _ in FAMILIES] + [
               "other_ms", "out_snr_db", "loss_first", "loss_final", "loss_rel_diff", "status"]
    bu.write_csv(out_dir / "e2e_dense.csv", rows, columns)
    if base is not None and not args.no_summary and on_gpu:
        for r in rows:
            if r["status"] != "OK" or not r["variant"].startswith("turbo") or r["variant"].endswith("compile"):
                continue
            name = "e2e_dense_bf16" if r["variant"] == "turbo_bf16" else "e2e_dense_fp8_" + r["variant"].split("_fp8_")[1]
            entry = bu.summary_entry(
                [r["tflops"]], [base["tflops"]], [r["loss_rel_diff"] <= (0.02 if "bf16" in name else 0.05)],
                out_snr_db=r.get("out_snr_db"),
                metric="model TFLOPS (fwd+bwd)", baseline="torch bf16 eager", gpu=gpu,
                gpu_busy_share=r.get("gpu_busy_share"), loss_rel_diff=r["loss_rel_diff"],
                attn_backend=r["attn_backend"],
            )
            bu.update_summary(args.output_dir, gpu, name, entry)
    return 0 if all(r["status"] == "OK" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
