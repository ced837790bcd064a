"""End-to-end training step of a decoder stack: our modules against the same model built from
torch layers, in eager mode and under torch.compile, bf16 and FP8; dense and mixture-of-experts.

    python benchmark/e2e/bench_train_step.py [--model Llama-3.1-8B] [--layers 4] [--tokens 8192]
        [--variants torch_eager torch_compile turbo_bf16 turbo_fp8_rowwise ...] [--steps 50]
    python benchmark/e2e/bench_train_step.py --arch moe --model Qwen3-30B-A3B --layers 2

The models (benchmark/e2e/model.py, dimensions from benchmark/ops/config.py = shared/MODELS.md):
``--layers`` blocks, a final norm and a loss on the hidden states (the vocabulary head is left
out: it is a GEMM of its own and dominates small stacks). Dense: Llama-style blocks (RMSNorm, QKV
projection, RoPE, causal GQA attention, output projection, RMSNorm, SwiGLU MLP). MoE: the same
attention, then a softmax top-k router, token permutation, SwiGLU experts as grouped GEMMs and
shared experts where the model has them. Every variant starts from the same weights and trains on
the same data with AdamW.

Variants:
- ``torch_eager`` / ``torch_compile``: torch.nn.Linear, torch.nn.RMSNorm, torch RoPE and SwiGLU,
  attention through torch's scaled_dot_product_attention (its own backend choice), experts through
  ``torch._grouped_mm`` with argsort / index_add routing;
- ``turbo_bf16``: the same model after ``turbo.convert_model`` (our Linear and RMSNorm), with
  ``turbo.ops.rope``, ``swiglu``, ``flash_attn_func`` (on the attention backend
  ``--attn-backend`` names; unset, the library's choice; ``--autotune`` measures GEMM and attention
  backends per shape first) and, for MoE, ``token_permute``,
  ``grouped_gemm``, ``swiglu_with_probs`` and ``token_unpermute``;
- ``turbo_fp8_<granularity>``: ``turbo.convert_model(model, fp8_config=...)`` (Float8Linear,
  HYBRID; the router stays bf16) on top of that, and ``grouped_gemm_fp8`` experts, for
  tensorwise, rowwise and blockwise;
- ``turbo_fp8_<granularity>_fp8attn``: the same with FP8 attention too (``flash_attn_fp8_func``:
  q, k and v quantized in blocks of 64 rows inside the forward; the 16-bit backward);
- ``turbo_*_compile``: a turbo variant under torch.compile (by default ``turbo_bf16_compile`` and
  ``turbo_fp8_rowwise_compile``; the others by ``--variants``);
- ``torchao_fp8_<recipe>_compile``: the torch model with torchao's float8 training
  (``convert_to_float8_training``, recipe ``tensorwise`` or ``rowwise``; its Linear layers only, the
  router kept bf16) under torch.compile, the FP8 recipe a user would otherwise pick. In the default
  set where ``torchao`` is installed; asked for without it, the row reports the import error.

Per variant: median ms of a training step's forward+backward (the optimizer step timed apart),
model TFLOPS (6 x weights used per token x tokens + causal attention), the share of the step the
GPU is busy and a kernel-family breakdown from torch.profiler (GEMM, attention, quantization,
normalization/activation, MoE routing/permutation, other), ``shared_kernel_ratio`` (the time of
the kernels a variant shares by name with torch eager, e.g. cuBLAS's and cuDNN's, over torch eager's
time of them: above 1 when a denser step runs the GPU at lower clocks at its power limit), the SNR
of the stack's output at the shared initial weights against torch eager's (a variant below 30 dB
bf16 / 15 dB FP8 FAILs; the loss alone could not catch wrong numerics), and the loss after ``--steps`` steps against torch's
(AdamW at ``--lr``, by default small enough that run-to-run noise stays far below the 2% / 5% gate).
Summary entries ``e2e_<arch>_bf16`` and ``e2e_<arch>_fp8_<granularity>`` (ratio against torch
eager), ``e2e_<arch>_fp8_vs_torchao`` (our fastest FP8 variant against torchao's fastest), CSV
``e2e_<arch>.csv`` (``--tag`` adds a suffix to the CSV and the per-variant entries).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_utils as bu  # noqa: E402
import config as cfg  # noqa: E402
from model import Stack, rope_tables  # noqa: E402


# ---- variants ------------------------------------------------------------------------------------

GRANULARITIES = ("tensorwise", "rowwise", "blockwise")
# torchao's float8 training recipes (its Linear layers only), compiled as torchao intends them.
TORCHAO_RECIPES = ("tensorwise", "rowwise")
ALL_VARIANTS = (
    ("torch_eager", "torch_compile", "turbo_bf16", "turbo_bf16_compile")
    + tuple(f"turbo_fp8_{g}" for g in GRANULARITIES)
    + tuple(f"turbo_fp8_{g}_compile" for g in GRANULARITIES)
    + tuple(f"torchao_fp8_{r}_compile" for r in TORCHAO_RECIPES)
    + tuple(f"turbo_fp8_{g}_fp8attn" for g in GRANULARITIES)
)
# What a plain run measures: one compiled FP8 variant of ours (rowwise) beside the eager ones, and
# torchao's where it is installed.
DEFAULT_VARIANTS = tuple(
    v for v in ALL_VARIANTS
    if not (v.startswith("turbo_fp8") and v.endswith("compile"))
    and (not v.startswith("torchao") or importlib.util.find_spec("torchao") is not None)
) + ("turbo_fp8_rowwise_compile",)


def fp8_granularity(variant: str) -> str | None:
    """The FP8 granularity (or torchao recipe) a variant names, else None."""
    return variant.split("_fp8_")[1].split("_")[0] if "_fp8_" in variant else None


def build(variant: str, base_state: dict, m, layers: int, arch: str, device, dtype, weight_cache=None,
          fast_accum: bool = False, fused_routing: bool = True):
    """weight_cache: None, "all" (every FP8 layer keeps its quantized weight for the step) or
    "experts" (the MoE expert stacks only; the other Linear layers quantize per call). fast_accum:
    our FP8 configs let the forward GEMMs accumulate in the fast mode (as torchao's recipes do).
    fused_routing: our MoE variants route with turbo's fused softmax top-k (else torch's ops)."""
    import primus_turbo.pytorch as turbo
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity

    with device:
        model = Stack(m, layers, arch).to(dtype=dtype)
    model.load_state_dict(base_state)
    if variant.startswith("torchao"):
        # torchao's float8 Linear (dynamic scaling, its recipe by name) on the torch model; its MoE
        # experts stay bf16 torch._grouped_mm (torchao's float8 training converts nn.Linear only).
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(fp8_granularity(variant)),
                                   module_filter_fn=lambda mod, fqn: not fqn.endswith("router"))
    if variant.startswith("turbo"):
        fp8 = None
        if "_fp8_" in variant:
            g = fp8_granularity(variant)
            gran = {"tensorwise": ScalingGranularity.TENSORWISE, "rowwise": ScalingGranularity.ROWWISE,
                    "blockwise": ScalingGranularity.BLOCKWISE}[g]
            fp8 = Float8QuantConfig(format=Format.HYBRID, granularity=gran,
                                    block_size=128 if gran == ScalingGranularity.BLOCKWISE else None,
                                    fast_accum=fast_accum)
        # The router stays in bf16 (a tiny GEMM whose rounding would move tokens between experts).
        turbo.convert_model(model, fp8_config=fp8, module_filter_fn=lambda mod, fqn: not fqn.endswith("router"))
        cache = bool(weight_cache) and fp8 is not None
        if cache and weight_cache == "all":  # FP8 weights quantized once per optimizer step, reused by every micro-batch
            for mod in model.modules():
                if isinstance(mod, turbo.modules.Float8Linear):
                    mod._init_weight_cache(True)
        model.use_turbo(turbo, fp8_config=fp8, cache_fp8_weights=cache, fused_routing=fused_routing,
                        fp8_attention=variant.endswith("_fp8attn"))
    if variant.endswith("compile"):
        torch._dynamo.reset()  # each compiled variant from scratch: no recompile limit across variants
    step_model = torch.compile(model) if variant.endswith("compile") else model
    return model, step_model


# ---- profiling -----------------------------------------------------------------------------------

# First match wins: GEMM before quantization, since block-scaled GEMM kernels name their scales.
# Our norm kernels name an FP8 format type (quant::...) in every instantiation; the argument before
# it (kFp8) is 0 where the kernel writes no FP8 output, so those are norms, not quantization.
FAMILIES = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|cublas|xmma|nvjet|matmul|sm90_", re.I)),
    ("norm/activation", re.compile(r"::norm::\w+<.*, 0, primus_turbo::kernels::quant::")),
    ("quantization", re.compile(r"quant|amax|fp8_cast", re.I)),
    ("norm/activation", re.compile(r"norm|swiglu|silu|rope|gated|glu", re.I)),
    ("moe routing", re.compile(r"permute|route|routing|topk|sort|index_add|scatter|bincount|gather", re.I)),
)


def shared_kernel_ratio(kernels: dict, base: dict) -> float:
    """Time of the kernels ``kernels`` shares by name with ``base`` (e.g. torch eager's cuBLAS and
    cuDNN kernels), over base's time of the same kernels (each dict: name -> ms per step). Above 1
    the same kernels ran slower in this variant's step: lower clocks at the power limit, or
    contention. NaN when nothing is shared."""
    shared = kernels.keys() & base.keys()
    base_ms = sum(base[name] for name in shared)
    return sum(kernels[name] for name in shared) / base_ms if base_ms > 0 else float("nan")


def kernel_breakdown(run_step, reset, steps: int = 3, top: int = 0) -> tuple[dict, float, dict]:
    """(ms per step per kernel family, GPU-busy ms per step, ms per step per kernel name) from
    torch.profiler; reset() runs between steps (outside the profile) so each step is what the timed
    one is. ``top`` > 0 also prints the kernels that take the most time per step, with their family
    and launch count."""
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
    kernels = {}  # name -> [ms, launches, family]
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        ms = evt.device_time_total / 1000.0 if hasattr(evt, "device_time_total") else evt.cuda_time_total / 1000.0
        family = next((name for name, pattern in FAMILIES if pattern.search(evt.name)), "other")
        out[family] += ms
        entry = kernels.setdefault(evt.name, [0.0, 0, family])
        entry[0] += ms
        entry[1] += 1
    for name, (ms, count, family) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"    {ms / steps:8.3f} ms/step {count // steps:5d} launches  {family:16s} {name[:110]}")
    per_step = {k: v / steps for k, v in out.items()}
    return per_step, sum(per_step.values()), {name: v[0] / steps for name, v in kernels.items()}


# ---- main ----------------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=("dense", "moe"), default="dense")
    p.add_argument("--model", default=None, help="default: Llama-3.1-8B (dense), Qwen3-30B-A3B (moe)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=8192, help="tokens per step (batch = tokens // seq)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: min(model's, tokens))")
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=ALL_VARIANTS)
    p.add_argument("--tag", default="", help="suffix of the CSV and summary entries (a partial run kept apart)")
    p.add_argument("--steps", type=int, default=50, help="training steps for the loss comparison")
    # 2e-5 keeps the 50 steps in the smooth part of the fit. At 1e-4 the loss falls ~20% every 5 steps by
    # step 50, and two torch eager runs (cuDNN's attention backward is not deterministic) already end
    # 2.5% apart, more than the bf16 gate; at 2e-5 they agree to 4 digits and FP8 is 0.1-0.2% off.
    p.add_argument("--lr", type=float, default=2e-5, help="AdamW learning rate of the loss comparison")
    p.add_argument("--print-losses", action="store_true", help="print every 5th step's loss per variant")
    p.add_argument("--timed", type=int, default=10, help="timed steps per variant")
    p.add_argument("--device", default="cuda")
    p.add_argument("--output-dir", default=str(bu.DEFAULT_RESULTS_DIR))
    p.add_argument("--no-summary", action="store_true")
    p.add_argument("--top-kernels", type=int, default=0, help="print each variant's N most expensive kernels")
    p.add_argument("--microbatches", type=int, default=1,
                   help="forward+backward passes per optimizer step (gradient accumulation); step_ms is per step")
    p.add_argument("--fp8-weight-cache", nargs="?", const="all", default=None, choices=("all", "experts"),
                   help="the FP8 variants keep their layers' quantized weights for the step (cache_quantized_weight): "
                   "every FP8 layer (all, the default when given) or the MoE expert stacks only (experts)")
    p.add_argument("--optimizer", choices=("torch", "turbo"), default="torch",
                   help="the turbo variants' optimizer: torch.optim.AdamW (as every variant, the default) or "
                   "turbo.optim.FusedAdamW (with --fp8-weight-cache it also makes the TENSORWISE layers' FP8 "
                   "weights from the update's max |weight|)")
    p.add_argument("--fp8-fast-accum", action="store_true",
                   help="our FP8 variants with Float8QuantConfig(fast_accum=True): the forward GEMMs may skip the "
                   "FP32 promotion of partial sums, as torchao's float8 recipes do in their forward (its "
                   "use_fast_accum); the backward GEMMs keep full accumulation")
    p.add_argument("--routing", choices=("fused", "torch"), default="fused",
                   help="the MoE router of our variants: turbo's fused softmax top-k, or torch's softmax / topk / "
                   "scatter (as before it was used, for an A/B)")
    p.add_argument("--attn-backend", choices=("auto", "TURBO", "CUDNN"), default="auto",
                   help="attention backend of the turbo variants (auto: unset, the library's choice)")
    p.add_argument("--autotune", action="store_true",
                   help="our variants with autotune on: GEMM, grouped GEMM and (fixed-length) attention backends "
                   "measured per shape at first use, which happens before the timed steps")
    args = p.parse_args()
    from primus_turbo.pytorch.core.backend import GlobalBackendManager

    if args.attn_backend != "auto":
        GlobalBackendManager.set_attn_backend(args.attn_backend)
    if args.autotune:
        GlobalBackendManager.set_auto_tune(True)

    models = cfg.DENSE_MODELS if args.arch == "dense" else cfg.MOE_MODELS
    args.model = args.model or ("Llama-3.1-8B" if args.arch == "dense" else "Qwen3-30B-A3B")
    if args.model not in models:
        p.error(f"--model {args.model}: not a {args.arch} model; choose from {sorted(models)}")
    m = models[args.model]
    seq = args.seq or min(getattr(m, "seq", 4096), args.tokens)
    batch = max(1, args.tokens // seq)
    device, dtype = torch.device(args.device), torch.bfloat16
    torch.manual_seed(1234)
    with device:  # parameters initialized where they train (an MoE stack is billions of values)
        base_state = Stack(m, args.layers, args.arch).to(dtype=dtype).state_dict()
    x = torch.randn(batch, seq, m.hidden, device=device, dtype=dtype)
    target = torch.randn(batch, seq, m.hidden, device=device, dtype=dtype)
    with torch.device("meta"):
        shape_only = Stack(m, args.layers, args.arch)
    cos, sin = rope_tables(seq, shape_only.rope_dim, device)
    flops = shape_only.flops(batch, seq)
    on_gpu = device.type == "cuda"

    rows = []
    base_kernels = {}  # torch eager's kernel name -> ms per step (it runs first)
    reference_out = None  # torch eager's output at the initial weights (run it first)
    reference_routes = None  # and, for MoE, its routing
    variants = sorted(args.variants, key=lambda v: v != "torch_eager")
    for variant in variants:
        row = {"variant": variant, "model": args.model, "layers": args.layers, "batch": batch, "seq": seq,
               "attn_backend": "sdpa" if variant.startswith("torch") else (
                   "autotune" if args.autotune and args.attn_backend == "auto" else args.attn_backend)}
        try:
            model, step_model = build(variant, base_state, m, args.layers, args.arch, device, dtype,
                                      args.fp8_weight_cache, args.fp8_fast_accum, args.routing == "fused")
            if args.optimizer == "turbo" and variant.startswith("turbo"):
                import primus_turbo.pytorch as turbo

                opt = turbo.optim.FusedAdamW(model.parameters(), lr=args.lr)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

            def fwd_bwd():
                for _ in range(args.microbatches):  # gradient accumulation: the same batch again
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
            # MoE: top-k routing can flip on near-tied router logits, and a token sent to another
            # expert differs by far more than rounding. The share of tokens routed as torch eager
            # routes them in every layer, and the SNR over those tokens alone.
            routes = model.record_routes(x, cos, sin)
            if variant == "torch_eager":
                reference_routes = routes
            if routes is not None and reference_routes is not None and reference_out is not None:
                same = torch.stack([(r == q).all(-1) for r, q in zip(routes, reference_routes)]).all(0)
                row["route_agreement"] = same.float().mean().item()
                rows_out, rows_ref = out0.reshape(-1, out0.shape[-1]), reference_out.reshape(-1, out0.shape[-1])
                if bool(same.any()):
                    row["out_snr_same_routes_db"] = bu.snr_db(rows_out[same], rows_ref[same])
            del out0
            losses = [step().item() for _ in range(args.steps)]
            row["loss_first"], row["loss_final"] = losses[0], losses[-1]
            if args.print_losses:
                print(f"  {variant} losses:", " ".join(f"{v:.4f}" for v in losses[::5] + losses[-1:]), flush=True)
            times, opt_times = [], []
            clocks = bu.GpuClockSampler() if on_gpu else contextlib.nullcontext()
            # Allocations the caching allocator could only serve after freeing its cached blocks
            # (each a device synchronization: the GPU drains and the host's lead is lost).
            retries0 = torch.cuda.memory_stats().get("num_alloc_retries", 0) if on_gpu else 0
            with clocks:
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
            if on_gpu:
                row["sm_clock_mhz"], row["power_w"] = clocks.median_clock_mhz, clocks.median_power_w
                row["alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries0
            row["step_ms"] = statistics.median(times)
            row["optimizer_ms"] = statistics.median(opt_times)
            row["tflops"] = flops / (row["step_ms"] * 1e-3) / 1e12
            if on_gpu:
                families, busy, kernel_ms = kernel_breakdown(fwd_bwd, lambda: opt.zero_grad(set_to_none=True),
                                                             top=args.top_kernels)
                if variant == "torch_eager":
                    base_kernels = kernel_ms
                elif base_kernels:
                    row["shared_kernel_ratio"] = shared_kernel_ratio(kernel_ms, base_kernels)
                row["gpu_busy_ms"] = busy
                row["gpu_busy_share"] = busy / row["step_ms"]
                for name, ms in families.items():
                    row[f"{name}_ms"] = ms
                opt.zero_grad(set_to_none=True)
            gate = 30.0 if "fp8" not in variant else 15.0  # SNR of the stack's output vs torch eager, dB
            # MoE: over the tokens routed as torch eager routes them. Rounding alone flips some
            # routes (torch.compile of the torch model: 6% of tokens, 29.3 dB over all of them,
            # 30.2 dB over the rest; H100, f37ca27), and a flipped token's output is a different one.
            snr_key = "out_snr_same_routes_db" if "out_snr_same_routes_db" in row else "out_snr_db"
            if not all(math.isfinite(v) for v in losses):
                row["status"] = "FAIL (non-finite loss)"
            elif row.get(snr_key, float("inf")) < gate:
                over = " over the tokens routed alike" if snr_key != "out_snr_db" else ""
                row["status"] = f"FAIL (output SNR{over} {row[snr_key]:.1f} dB < {gate} dB vs torch eager)"
            else:
                row["status"] = "OK"
        except Exception as e:  # a variant that breaks is reported, the others still run
            row["status"] = f"ERROR {type(e).__name__}: {e}"[:300]
        rows.append(row)
        print(
            f"{variant:24s} step {row.get('step_ms', float('nan')):8.2f} ms  {row.get('tflops', float('nan')):7.1f} TFLOPS"
            f"  busy {row.get('gpu_busy_share', float('nan')):.2f}"
            f"  same kernels x{row.get('shared_kernel_ratio', 1.0):.3f}  loss {row.get('loss_final', float('nan')):.4f}"
            f"  SM {row.get('sm_clock_mhz') or float('nan'):.0f} MHz {row.get('power_w') or float('nan'):.0f} W"
            f"  alloc retries {row.get('alloc_retries', 0)}"
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
               "gpu_busy_ms", "gpu_busy_share", "shared_kernel_ratio", "sm_clock_mhz", "power_w", "alloc_retries"] + list(dict.fromkeys(f"{n}_ms" for n, _ in FAMILIES)) + [
               "other_ms", "out_snr_db", "route_agreement", "out_snr_same_routes_db", "loss_first", "loss_final", "loss_rel_diff", "status"]
    # Accumulation and weight-cache runs are variants of the configuration, kept apart from it.
    config_tag = ((f"_mb{args.microbatches}" if args.microbatches > 1 else "") + ({"all": "_wcache", "experts": "_wcache_experts"}.get(args.fp8_weight_cache, ""))
                  + ("_fusedopt" if args.optimizer == "turbo" else "") + ("_fastacc" if args.fp8_fast_accum else "")
                  + ("_torchrouting" if args.routing == "torch" and args.arch == "moe" else ""))
    tag = config_tag + (f"_{args.tag}" if args.tag else "")
    rows = [{**r, "microbatches": args.microbatches, "fp8_weight_cache": args.fp8_weight_cache or False,
             "optimizer": "FusedAdamW" if args.optimizer == "turbo" and r["variant"].startswith("turbo") else "AdamW",
             "fp8_fast_accum": args.fp8_fast_accum and r["variant"].startswith("turbo_fp8")}
            for r in rows]
    columns[columns.index("step_ms"):columns.index("step_ms")] = ["microbatches", "fp8_weight_cache", "optimizer",
                                                                  "fp8_fast_accum"]
    bu.write_csv(out_dir / f"e2e_{args.arch}{tag}.csv", rows, columns)
    from plot_breakdown import plot

    plot(out_dir / f"e2e_{args.arch}{tag}.csv")
    if base is not None and not args.no_summary and on_gpu:
        for r in rows:
            if r["status"] != "OK" or not r["variant"].startswith("turbo") or r["variant"].endswith("compile"):
                continue
            prefix = f"e2e_{args.arch}_"
            name = prefix + ("bf16" if r["variant"] == "turbo_bf16" else "fp8_" + fp8_granularity(r["variant"]))
            name += ("_fp8attn" if r["variant"].endswith("_fp8attn") else "") + tag
            entry = bu.summary_entry(
                [r["tflops"]], [base["tflops"]], [r["loss_rel_diff"] <= (0.02 if "bf16" in name else 0.05)],
                out_snr_db=r.get("out_snr_db"),
                metric="model TFLOPS (fwd+bwd)", baseline="torch bf16 eager", gpu=gpu,
                gpu_busy_share=r.get("gpu_busy_share"), loss_rel_diff=r["loss_rel_diff"],
                attn_backend=r["attn_backend"],
            )
            bu.update_summary(args.output_dir, gpu, name, entry)
        # Ours against torchao's float8 + torch.compile, each side's fastest FP8 variant: FP8 GEMMs only
        # (as torchao's recipes), and, where run, with FP8 attention too (entry "_fp8attn").
        theirs = [r for r in rows if r["status"] == "OK" and r["variant"].startswith("torchao")]
        for suffix in ("", "_fp8attn"):
            ours = [r for r in rows if r["status"] == "OK" and r["variant"].startswith("turbo_fp8")
                    and r["variant"].endswith("_fp8attn") == bool(suffix)]
            if not (ours and theirs):
                continue
            best, ref = max(ours, key=lambda r: r["tflops"]), max(theirs, key=lambda r: r["tflops"])
            gate = best.get("loss_rel_diff", float("inf")) <= 0.05  # the FP8 loss gate
            entry = bu.summary_entry([best["tflops"]], [ref["tflops"]], [gate], metric="model TFLOPS (fwd+bwd)",
                                     baseline=f"torchao float8 + torch.compile ({ref['variant']})", gpu=gpu,
                                     variant=best["variant"])
            # Named by the configuration only: the runs that include torchao are what this entry measures.
            bu.update_summary(args.output_dir, gpu, f"e2e_{args.arch}_fp8_vs_torchao{suffix}{config_tag}", entry)
    return 0 if all(r["status"] == "OK" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
