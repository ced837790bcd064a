"""One small, odd-shaped case of every op family, forward and backward, for compute-sanitizer:

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 -P tools/sanitize_cases.py [family ...]

Each case runs once and checks nothing but that it completes: memcheck reports any out-of-bounds or
misaligned access, racecheck (--tool racecheck) shared-memory races. Families: gemm, norm, rope,
grouped, gemm_fp8, grouped_fp8, fp4, activation, quantize, moe, attention, attention_turbo,
attention_fp8, optim.
"""

import sys

import torch

import primus_turbo.pytorch as turbo
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, Format, ScalingGranularity

dev, bf16 = "cuda", torch.bfloat16


def t(*shape, dtype=bf16, grad=True):
    return torch.randn(*shape, device=dev, dtype=dtype).requires_grad_(grad)


def step(out, *inputs):
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum(o.float().sum() for o in outs)
    torch.autograd.grad(loss, inputs)


def gemm():
    a, b = t(37, 72), t(24, 72)
    step(turbo.ops.gemm(a, b, trans_b=True), a, b)


def norm():
    x, w, bias = t(3, 13, 200), t(200), t(200)
    step(turbo.ops.rmsnorm(x, w), x, w)
    step(turbo.ops.layernorm(x, w, bias), x, w, bias)
    r = t(3, 13, 200)
    step(turbo.ops.rmsnorm_residual(x, r, w), x, r, w)
    # Rows wider than a warp's: the block path, whose backward adds its sums in a cluster (16 rows:
    # two clusters of 8 blocks).
    x, w, bias = t(16, 1040), t(1040), t(1040)
    step(turbo.ops.rmsnorm(x, w), x, w)
    step(turbo.ops.layernorm(x, w, bias), x, w, bias)
    # LayerNorm's backward at a model width: two vectors a thread under its 128-register cap.
    x, w, bias = t(9, 4096), t(4096), t(4096)
    step(turbo.ops.layernorm(x, w, bias), x, w, bias)


def rope():
    q, k = t(2, 17, 4, 64), t(2, 17, 2, 64)
    step(turbo.ops.rope(q, k), q, k)


def grouped():
    a, b = t(100, 64), t(3, 48, 64)
    lens = torch.tensor([30, 0, 20], device=dev, dtype=torch.int64)  # rows 50..99 uncovered
    step(turbo.ops.grouped_gemm(a, b, lens, trans_b=True), a, b)


def fp8_configs():
    G = ScalingGranularity
    for g in (G.TENSORWISE, G.ROWWISE, G.BLOCKWISE):
        yield Float8QuantConfig(format=Format.HYBRID, granularity=g, block_size=128 if g == G.BLOCKWISE else None)


def gemm_fp8():
    for cfg in fp8_configs():
        a, b = t(48, 160), t(32, 160)
        step(turbo.ops.gemm_fp8(a, b, trans_b=True, config=cfg), a, b)
        with torch.no_grad():  # inference: every quantized copy is transient
            turbo.ops.gemm_fp8(a, b, trans_b=True, config=cfg)
        # A layer's per-step weight copies read by the native op (gemm_fp8_fwd_qb), twice a step.
        layer = turbo.modules.Float8Linear(160, 32, config=cfg, device=dev, dtype=bf16, cache_quantized_weight=True)
        for _ in range(2):
            x = t(48, 160)
            step(layer(x), x, layer.weight)
    # The fused MLP reading two such layers' TENSORWISE copies (swiglu_mlp_fp8_fwd_qw).
    cfg = next(fp8_configs())
    gate_up, down = (turbo.modules.Float8Linear(i, o, bias=False, config=cfg, device=dev, dtype=bf16,
                                                cache_quantized_weight=True) for i, o in ((80, 2 * 48), (48, 80)))
    x = t(32, 80)
    step(turbo.ops.swiglu_mlp_fp8(x, gate_up.weight_operand(), down.weight_operand(), cfg), x, gate_up.weight,
         down.weight)


def grouped_fp8():
    for cfg in fp8_configs():
        a, b = t(100, 160), t(3, 128, 160)
        lens = torch.tensor([30, 0, 20], device=dev, dtype=torch.int64)  # rows 50..99 uncovered
        step(turbo.ops.grouped_gemm_fp8(a, b, lens, trans_b=True, config=cfg), a, b)
        a, b = t(100, 256), t(3, 256, 48)  # [G, K, N]: the forward reads each expert transposed
        step(turbo.ops.grouped_gemm_fp8(a, b, lens, trans_b=False, config=cfg), a, b)
    # Expert rows not a multiple of 128: TENSORWISE transposed after, ROWWISE quantized again in the backward
    for cfg in list(fp8_configs())[:2]:
        a, b = t(100, 160), t(3, 144, 160)
        step(turbo.ops.grouped_gemm_fp8(a, b, lens, trans_b=True, config=cfg), a, b)
    # ROWWISE and TENSORWISE on the row-scaled kernel with fast accumulation, and from a layer's
    # per-step weight copies.
    for g in (ScalingGranularity.ROWWISE, ScalingGranularity.TENSORWISE):
        cfg = Float8QuantConfig(format=Format.HYBRID, granularity=g, fast_accum=True)
        a, b = t(100, 160), t(3, 128, 160)
        step(turbo.ops.grouped_gemm_fp8(a, b, lens, trans_b=True, config=cfg), a, b)
        layer = turbo.modules.GroupedLinear(3, 160, 128, device=dev, dtype=bf16, config=cfg, cache_quantized_weight=True)
        for _ in range(2):
            x = t(100, 160)
            step(layer(x, lens), x, layer.weight)


def fp4():
    a, b = t(64, 160), t(96, 160)
    step(turbo.ops.gemm_fp4(a, b, trans_b=True), a, b)
    a, b = t(128, 128), t(3, 64, 128)
    lens = torch.tensor([64, 0, 32], device=dev, dtype=torch.int64)  # rows 96..127 uncovered
    step(turbo.ops.grouped_gemm_fp4(a, b, lens, trans_b=True), a, b)


def activation():
    x = t(7, 2 * 96)
    step(turbo.ops.swiglu(x), x)
    # The FP8 MLP's fused TENSORWISE path: the SwiGLU kernels' amaxes handed to the quantizations.
    x, wgu, wd = t(32, 64), t(2 * 96, 64), t(64, 96)
    step(turbo.ops.swiglu_mlp_fp8(x, wgu, wd), x, wgu, wd)


def quantize():
    G = ScalingGranularity
    x = t(33, 160, grad=False)
    turbo.ops.quantize_fp8(x, torch.float8_e4m3fn, G.ROWWISE, axis=-1)
    # More than the batched launch takes (128 tiles), odd in both dims: the register-tile kernels
    # (quantize and amax) and the one-read rowwise kernel.
    x = t(1040, 2056, grad=False)
    turbo.ops.quantize_fp8(x, torch.float8_e4m3fn, G.ROWWISE, axis=-1)
    turbo.ops.quantize_fp8(x, torch.float8_e4m3fn, G.BLOCKWISE, block_size=128, axis=-1)
    for g in (G.TENSORWISE, G.ROWWISE, G.BLOCKWISE):
        turbo.ops.quantize_fp8_with_trans(x, torch.float8_e4m3fn, g, block_size=128 if g == G.BLOCKWISE else None)
    # Grouped tokens (an empty and a one-row group, rows of 14 bytes): the native group padding
    # both ways around the blockwise quantization.
    x, lens = t(75, 7, grad=False), torch.tensor([3, 0, 71, 1], device=dev)
    q, s, _, poffs = turbo.ops.grouped_quantize_fp8(x, torch.float8_e4m3fn, G.BLOCKWISE, lens, block_size=128, axis=0)
    offs = torch.tensor([0, 3, 3, 74, 75], device=dev)
    turbo.ops.grouped_dequantize_fp8(q, bf16, G.BLOCKWISE, offs, poffs, block_size=128, axis=0, scale_inv=s,
                                     total_M=75)


def attention():
    q, k, v = t(2, 77, 4, 64), t(2, 130, 2, 64), t(2, 130, 2, 64)
    step(turbo.ops.flash_attn_func(q, k, v, causal=True), q, k, v)
    # Packed documents (cuDNN's ragged path) with bad offsets: clamped, no stray access.
    pq, pk, pv = t(200, 4, 128), t(200, 2, 128), t(200, 2, 128)
    bad = torch.tensor([0, 150, 90, 260, 300], device=dev, dtype=torch.int32)
    step(turbo.ops.flash_attn_varlen_func(pq, pk, pv, bad, bad, 64, 64, causal=True), pq, pk, pv)


def attention_turbo():
    """Our kernels (backend TURBO): the warp-specialized forward on Hopper, odd lengths, GQA, a
    window with sinks, MLA's head dims, packed sequences with an empty one."""
    from primus_turbo.pytorch.core.backend import GlobalBackendManager

    GlobalBackendManager.set_attn_backend("TURBO")
    try:
        q, k, v = t(2, 77, 4, 64), t(2, 130, 2, 64), t(2, 130, 2, 64)
        step(turbo.ops.flash_attn_func(q, k, v, causal=True), q, k, v)
        sink = torch.randn(4, device=dev, requires_grad=True)
        step(turbo.ops.flash_attn_func(q, k, v, window_size=(33, 5), sink=sink), q, k, v, sink)
        q, k, v = t(1, 150, 2, 192), t(1, 150, 2, 192), t(1, 150, 2, 128)
        step(turbo.ops.flash_attn_func(q, k, v, causal=True), q, k, v)
        cu = torch.tensor([0, 5, 5, 150, 200], device=dev, dtype=torch.int32)
        pq, pk, pv = t(200, 4, 128), t(200, 2, 128), t(200, 2, 128)
        step(turbo.ops.flash_attn_varlen_func(pq, pk, pv, cu, cu, 145, 145, causal=True), pq, pk, pv)
        # Bad offsets (decreasing, past the 200 rows, longer than max_seqlen): clamped, no stray access.
        bad = torch.tensor([0, 150, 90, 260, 300], device=dev, dtype=torch.int32)
        step(turbo.ops.flash_attn_varlen_func(pq, pk, pv, bad, bad, 64, 64, causal=True), pq, pk, pv)
        # head dim 128: dQ fused into the dK/dV kernel (default), and the separate dQ kernel
        q, k, v = t(2, 77, 4, 128), t(2, 130, 2, 128), t(2, 130, 2, 128)
        for det in (False, True):
            step(turbo.ops.flash_attn_func(q, k, v, causal=True, deterministic=det), q, k, v)
    finally:
        GlobalBackendManager.set_attn_backend(None)


def attention_fp8():
    from primus_turbo.pytorch.ops import attention_fp8 as fp8

    fp8._FP8_BWD = True  # the backward on our FP8 kernels (opt-in), not the 16-bit one
    q, k, v = t(2, 77, 4, 128), t(2, 200, 2, 128), t(2, 200, 2, 128)
    turbo.ops.flash_attn_fp8_func(q.detach(), k.detach(), v.detach(), causal=True)
    step(turbo.ops.flash_attn_fp8_func(q, k, v, causal=True), q, k, v)  # the FP8 backward
    cu = torch.tensor([0, 5, 5, 150, 200], device=dev, dtype=torch.int32)
    pq, pk, pv = t(200, 4, 64), t(200, 2, 64), t(200, 2, 64)
    step(turbo.ops.flash_attn_varlen_fp8_func(pq, pk, pv, cu, cu, 145, 145, window_size=(33, 0)), pq, pk, pv)
    q96, k96, v96 = t(1, 130, 2, 96), t(1, 70, 1, 96), t(1, 70, 1, 96)
    step(turbo.ops.flash_attn_fp8_func(q96, k96, v96), q96, k96, v96)


def moe():
    # token_permute / token_unpermute with spare output rows (the backward zeroes the rows the map
    # does not reference) and dropped routes; moe_permute / moe_unpermute with padding and probs.
    tokens, experts, topk = 37, 6, 2
    top = torch.rand(tokens, experts, device=dev).topk(topk, -1).indices
    mask = torch.zeros(tokens, experts, dtype=torch.bool, device=dev).scatter_(1, top, True)
    x = t(tokens, 40)
    merging = torch.rand(tokens, experts, device=dev, requires_grad=True)
    for num_out in (tokens * topk + 9, tokens * topk - 5):
        for probs in (None, merging):  # the backward with merging probabilities zero-fills differently
            out, _, rmap = turbo.ops.token_permute(x, routing_map=mask, num_out_tokens=num_out)
            step(turbo.ops.token_unpermute(out, rmap, probs), x, *([] if probs is None else [probs]))
    p = torch.rand(tokens, topk, device=dev, requires_grad=True)
    out, rmap, _, _, nd, _, pp = turbo.ops.moe_permute(x, top.int(), num_local_experts=experts, num_topk=topk,
                                                       pad_multiple=8, num_permuted_tokens=tokens * topk + 40, probs=p)
    back, up = turbo.ops.moe_unpermute(out, rmap, nd, restore_shape=x.shape, num_local_experts=experts,
                                       permuted_probs=pp, probs_topk_stride=topk, pad_multiple=8)
    step((back, up), x, p)


def optim():
    # FusedAdamW over odd sizes, a misaligned view (scalar path), float32 moments beside bf16
    # params, the max |param| a TENSORWISE FP8 layer's weight copy is made from, and a BLOCKWISE
    # layer's copy written by the update.
    buf = torch.randn(3 * 1001 + 1, device=dev, dtype=bf16)
    params = [torch.nn.Parameter(buf[1:1002]), torch.nn.Parameter(t(2049, grad=False)),
              torch.nn.Parameter(t(7, 5, dtype=torch.float32, grad=False))]
    cfg = Float8QuantConfig(format=Format.HYBRID, granularity=ScalingGranularity.TENSORWISE)
    layer = turbo.modules.Float8Linear(48, 32, bias=False, config=cfg, device=dev, dtype=bf16,
                                       cache_quantized_weight=True)
    blocks = Float8QuantConfig(format=Format.HYBRID, granularity=ScalingGranularity.BLOCKWISE, block_size=128)
    block_layer = turbo.modules.Float8Linear(272, 208, bias=False, config=blocks, device=dev, dtype=bf16,
                                             cache_quantized_weight=True)  # partial tiles at both edges
    experts = turbo.modules.GroupedLinear(2, 64, 128, device=dev, dtype=bf16, config=blocks,
                                          cache_quantized_weight=True)  # each expert's transposed copy too
    lens = torch.tensor([48, 16], device=dev)
    opt = turbo.optim.FusedAdamW(params + list(layer.parameters()) + list(block_layer.parameters())
                                 + list(experts.parameters()))
    block_layer(t(16, 272)).float().sum().backward()
    experts(t(64, 64), lens).float().sum().backward()
    for p in params:
        p.grad = torch.randn_like(p)
    layer(t(16, 48)).float().sum().backward()
    opt.step()
    layer(t(16, 48)).float().sum().backward()  # the step's copy and its transposed one, one pass
    block_layer(t(16, 272)).float().sum().backward()  # the forward reads the step's FP8 copy
    experts(t(64, 64), lens).float().sum().backward()  # and the grouped dgrad its transposed one
    opt.step()
    state = opt.state[params[1]]
    state["exp_avg"], state["exp_avg_sq"] = state["exp_avg"].float(), state["exp_avg_sq"].float()
    opt.step()


CASES = {
    f.__name__: f
    for f in (gemm, norm, rope, grouped, gemm_fp8, grouped_fp8, fp4, activation, quantize, moe, attention,
              attention_turbo, attention_fp8, optim)
}

if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        CASES[name]()
        torch.cuda.synchronize()
        print(f"{name}: ok", flush=True)
