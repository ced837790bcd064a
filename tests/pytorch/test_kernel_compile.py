"""Every CUTLASS GEMM template point the dispatcher can choose compiles for sm_90a (no GPU needed).

A representative set covers each axis: every tile/cluster/schedule config on the forward layout,
every operand layout, both 16-bit input types, and the float32 output used for main_grad
accumulation. The disassembly must contain Hopper warpgroup MMA (HGMMA) instructions.
"""

import glob
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from primus_turbo import precompile
from primus_turbo._core.lib import check, lib, string_out

pytestmark = pytest.mark.compile_check


def _jobs():
    n = precompile.num_cutlass_configs()
    jobs = [("bf16", "bf16", "AkBk", c) for c in range(n)]
    jobs += [("bf16", "bf16", layout, 0) for layout in ("AkBn", "AmBn", "AmBk")]
    jobs += [("fp16", "fp16", "AkBk", 3), ("bf16", "fp32", "AmBn", 3)]
    return jobs


def _cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton

        cand = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        return cand if os.path.exists(cand) else None
    except ImportError:
        return None


def _jit_modules(dir_glob):
    """module.so of every compiled module whose folder matches dir_glob, at any depth of the JIT
    cache (modules have lived both directly in it and in a jit/ subfolder)."""
    cache = string_out(lib.pt_jit_cache_dir)
    return glob.glob(os.path.join(cache, "**", dir_glob, "module.so"), recursive=True)


def _assert_compiled(*names):
    for name in names:
        assert _jit_modules(f"{name}-*"), f"no compiled module {name} in {string_out(lib.pt_jit_cache_dir)}"


def _prepare_all(jobs, prepare, label):
    """prepare(job) for every job, in parallel (each is an nvcc run); fails listing every job that
    did not compile, not just the first."""

    def build(job):
        try:
            prepare(job)
            return None
        except Exception as e:
            return f"{label} {job}: {e}"

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        errors = [e for e in pool.map(build, jobs) if e]
    assert not errors, "\n".join(errors)


def _cuobjdump_each(flag, dir_glob, min_modules=1, every_module=True):
    """(module, cuobjdump flag output) for the first (or every) compiled module matching dir_glob;
    skips where cuobjdump is missing."""
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not available")
    modules = _jit_modules(dir_glob)
    assert len(modules) >= min_modules, (
        f"no compiled module {dir_glob} in {string_out(lib.pt_jit_cache_dir)} (the compile tests run first)"
    )
    for module in modules if every_module else modules[:1]:
        yield module, subprocess.run([tool, flag, module], capture_output=True, text=True).stdout


def _assert_sass_contains(instruction, dir_glob, min_modules=1, every_module=False):
    """The disassembly of the first (or every) compiled module matching dir_glob contains
    instruction; skips where cuobjdump is missing."""
    for module, sass in _cuobjdump_each("--dump-sass", dir_glob, min_modules, every_module):
        assert instruction in sass, module


def _assert_wgmma_not_serialized(dir_glob, min_modules=1):
    """No compiled module matching dir_glob waits after every warpgroup MMA: ptxas serializes them
    (warning C7512, a wait after each wgmma) when their registers do not fit, which costs a warp-
    specialized kernel most of its overlap without failing anything. Unserialized kernels wait once
    per group of products."""
    for module, sass in _cuobjdump_each("--dump-sass", dir_glob, min_modules):
        mma = len(re.findall(r"\b[HQ]GMMA\.", sass))
        waits = sass.count("WARPGROUP.DEPBAR")
        assert mma and waits * 3 <= mma, f"{module}: {waits} wgmma waits for {mma} wgmma (serialized by ptxas?)"


def _assert_no_register_spills(dir_glob, kernel_marker="device_kernel", max_stack=0):
    """Every kernel whose name contains kernel_marker, in every compiled module matching dir_glob,
    uses no stack or local memory (a spilled accumulator costs more than half the speed); with
    max_stack, up to that many bytes of stack (a few values parked across a kernel's main loop)."""
    for module, usage in _cuobjdump_each("-res-usage", dir_glob):
        lines = usage.splitlines()
        kernels = [lines[i + 1] for i, name in enumerate(lines[:-1]) if kernel_marker in name]
        assert kernels, f"no {kernel_marker} in {module}"
        for res in kernels:
            spills = {k: int(v) for k, v in re.findall(r"\b(STACK|LOCAL):(\d+)", res)}
            assert spills["STACK"] <= max_stack and spills["LOCAL"] <= max_stack, f"{module}: {res.strip()}"


def test_cutlass_gemm_configs_compile_for_sm90a():
    assert precompile.num_cutlass_configs() >= 4
    errors = precompile.compile_all(_jobs(), workers=os.cpu_count() or 1, quiet=True)
    assert not errors, "\n".join(errors)


def test_compiled_modules_use_hgmma():
    _assert_sass_contains("HGMMA", "gemm_cutlass_bf16_bf16_AkBk_*")


# RMSNorm: per dtype, the three module kinds a call can need (specialized hidden with 16-byte
# accesses, any hidden with 16-byte accesses, any hidden with scalar accesses), plus float32 gamma.
_RMSNORM_DTYPES = {"fp32": 0, "fp16": 1, "bf16": 2}
_RMSNORM_JOBS = [(dt, dt, h) for dt in _RMSNORM_DTYPES for h in (4096, 5000, 4097)]
_RMSNORM_JOBS += [("bf16", "fp32", 7168), ("fp16", "fp32", 1000), ("bf16", "bf16", 512)]


def test_rmsnorm_modules_compile_for_sm90a():
    def prepare(job):
        dt, gdt, hidden = job
        check(lib.pt_rmsnorm_prepare(_RMSNORM_DTYPES[dt], _RMSNORM_DTYPES[gdt], hidden))

    _prepare_all(_RMSNORM_JOBS, prepare, "rmsnorm (dtype, gamma dtype, hidden) =")
    _assert_compiled("rmsnorm_bf16_bf16_vec_h4096", "rmsnorm_f32_f32_vec_hany", "rmsnorm_f16_f16_scalar_hany",
                     "rmsnorm_bf16_f32_vec_h7168")


# RMSNorm + residual and LayerNorm: both module kinds of a common and an odd hidden size, float32
# parameters; gated activations: both activations, each dtype, vectorized and scalar.
_NORM_JOBS = [(kind, dt, dt, h) for kind in (1, 2) for dt in ("bf16", "fp32") for h in (4096, 4097)]
_NORM_JOBS += [(2, "fp16", "fp32", 1000), (1, "bf16", "fp32", 7168)]
_GATED_JOBS = [(act, dt, cols) for act in (0, 1) for dt in _RMSNORM_DTYPES for cols in (1408, 7)]


def test_norm_and_gated_modules_compile_for_sm90a():
    def prepare(job):
        if len(job) == 4:
            kind, dt, gdt, hidden = job
            check(lib.pt_norm_prepare(kind, _RMSNORM_DTYPES[dt], _RMSNORM_DTYPES[gdt], hidden))
        else:
            act, dt, cols = job
            check(lib.pt_gated_act_prepare(act, _RMSNORM_DTYPES[dt], cols))

    _prepare_all(_NORM_JOBS + _GATED_JOBS, prepare, "norm / gated")


# RoPE: every module a call can choose (dtype x 16-byte/scalar accesses x pair layout x cos/sin source).
_ROPE_JOBS = [(dt, vec, inter, table) for dt in (0, 1, 2) for vec in (0, 1) for inter in (0, 1) for table in (0, 1)]


def test_rope_modules_compile_for_sm90a():
    label = "rope (dtype, vectorized, interleaved, table) ="
    _prepare_all(_ROPE_JOBS, lambda job: check(lib.pt_rope_prepare(*job)), label)


def test_moe_permute_modules_compile_for_sm90a():
    """token_permute's and moe_permute's kernels (one module per dtype and access width; loading a
    module resolves every entry point, the routing-map builder and the index row movers included)."""
    for dtype in (0, 1, 2):
        for vectorized in (0, 1):
            check(lib.pt_moe_permute_prepare(dtype, vectorized))
# Quantization: one module per (input dtype, quantized format); each holds the tile quantizer, the
# amax reduction and the dequantizer.
_QUANT_IN = {"f32": 0, "f16": 1, "bf16": 2}
_QUANT_OUT = {"E4M3": 3, "E5M2": 4, "E2M1": 6}


def test_quantization_modules_compile_for_sm90a():
    jobs = [(i, o) for i in _QUANT_IN for o in _QUANT_OUT]
    _prepare_all(jobs, lambda io: check(lib.pt_quantize_prepare(_QUANT_IN[io[0]], _QUANT_OUT[io[1]])), "quantization")
    _assert_compiled(*(f"quant_{i}_{o}" for i, o in jobs))
# Attention (our kernels): per (dtype, head dim of q/k, head dim of v), the mma.sync module (forward
# and backward kernels, HMMA), the warp-specialized sm90 forward and, at head dims 64, 96, 128 and
# 192/128, the sm90 backward (HGMMA).
_ATTN_DTYPES = {"bf16": 2, "f16": 1}


def test_attention_modules_compile_for_sm90a():
    jobs = [(dt, d, dv) for dt in _ATTN_DTYPES for d, dv in precompile.ATTENTION_HEAD_DIMS]
    _prepare_all(jobs, lambda j: check(lib.pt_attention_prepare(_ATTN_DTYPES[j[0]], j[1], j[2])), "attention")
    _assert_compiled(*(f"attention_{dt}_d{d}_dv{dv}" for dt, d, dv in jobs), "attention_ragged_offsets")
    _assert_compiled(*(f"attention_fwd_sm90_{dt}_d{d}_dv{dv}" for dt, d, dv in jobs))
    for dt in _ATTN_DTYPES:
        _assert_sass_contains("HMMA", f"attention_{dt}_d*", min_modules=len(jobs) // 2, every_module=True)
    _assert_sass_contains("HGMMA", "attention_fwd_sm90_*", min_modules=len(jobs), every_module=True)
    for d in (64, 96, 128):
        _assert_no_register_spills(f"attention_fwd_sm90_*_d{d}_dv{d}-*", kernel_marker="attn_fwd_sm90")
    # 192/128 and 256: two or four values parked on the stack in the prologue, not in the loop.
    _assert_no_register_spills("attention_fwd_sm90_*_d[12]*", kernel_marker="attn_fwd_sm90", max_stack=64)
    bwd = [(dt, d, dv) for dt, d, dv in jobs if (d, dv) in ((64, 64), (96, 96), (128, 128), (192, 128))]
    _assert_compiled(*(f"attention_bwd_sm90_{dt}_d{d}_dv{dv}" for dt, d, dv in bwd))
    _assert_sass_contains("HGMMA", "attention_bwd_sm90_*", min_modules=len(bwd), every_module=True)
    _assert_no_register_spills("attention_bwd_sm90_*", kernel_marker="_sm90_kernel")
    _assert_wgmma_not_serialized("attention_fwd_sm90_*", min_modules=len(jobs))
    _assert_wgmma_not_serialized("attention_bwd_sm90_*", min_modules=len(bwd))


def test_fp8_attention_modules_compile_for_sm90a():
    """The FP8 forward (quantization and the warp-specialized kernel) for every head-dim pair it
    takes, and the FP8 backward for its head dims, with FP8 warpgroup MMA (QGMMA) in their SASS and
    no spills."""
    jobs = [("bf16", d, dv) for d, dv in precompile.ATTENTION_FP8_HEAD_DIMS] + [("f16", 128, 128)]
    _prepare_all(jobs, lambda j: check(lib.pt_attention_fp8_prepare(_ATTN_DTYPES[j[0]], j[1], j[2])), "FP8 attention")
    _assert_compiled(*(f"attention_fp8_{dt}_d{d}_dv{dv}" for dt, d, dv in jobs))
    _assert_compiled(*(f"attention_fp8_bwd_{dt}_d{d}_dv{dv}" for dt, d, dv in jobs if d == dv))
    _assert_sass_contains("QGMMA", "attention_fp8_*", min_modules=len(jobs), every_module=True)
    _assert_no_register_spills("attention_fp8_*", kernel_marker="fp8")
    _assert_wgmma_not_serialized("attention_fp8_*", min_modules=len(jobs))


# Grouped GEMM: every config on the forward layout, the other two layouts (trans_b forward/dgrad
# and wgrad) on their usual configs, and float16.
def _grouped_jobs():
    n = precompile.num_grouped_configs()
    jobs = [("grouped_gemm", "bf16", "AkBn", c) for c in range(n)]
    jobs += [("grouped_gemm", "bf16", "AkBk", 3), ("grouped_gemm", "bf16", "AmBn", 3)]
    jobs += [("grouped_gemm", "fp16", "AmBn", 0)]
    return jobs


def test_cutlass_grouped_gemm_configs_compile_for_sm90a():
    assert 3 <= precompile.num_grouped_configs() <= 4  # each config costs a compile per layout
    errors = precompile.compile_all(_grouped_jobs(), workers=os.cpu_count() or 1, quiet=True)
    assert not errors, "\n".join(errors)


def test_grouped_gemm_modules_use_hgmma():
    _assert_sass_contains("HGMMA", "grouped_gemm_cutlass_bf16_AmBn_*")


# FP8 GEMM (CUTLASS, block-scaled): every config on the forward point (1x128 activations x 128x128
# weights), plus the wgrad point (1x128 x 1x128), E5M2 operands and float32 output. Codes: pt_dtype
# and pt_fp8_scaling.
_E4M3, _E5M2, _F32, _BF16 = 3, 4, 0, 2
_B1, _B128 = 2, 3


def _fp8_jobs():
    jobs = [(_E4M3, _E4M3, _BF16, _B1, _B128, c) for c in range(lib.pt_gemm_fp8_num_configs(2))]
    jobs += [(_E4M3, _E5M2, _BF16, _B1, _B1, 0), (_E5M2, _E5M2, _F32, _B1, _B128, 0)]
    return jobs


def test_cutlass_fp8_gemm_compiles_for_sm90a_with_fp8_wgmma():
    jobs = _fp8_jobs()
    assert len(jobs) >= 4
    _prepare_all(jobs, lambda job: check(lib.pt_gemm_fp8_prepare(*job)), "gemm_fp8")
    # FP8 warpgroup MMA disassembles as QGMMA (HGMMA is the 16-bit one).
    _assert_sass_contains("QGMMA", "gemm_fp8_cutlass_*")


def test_moe_routing_modules_compile_for_sm90a():
    """The routing module of every logits dtype (forward + backward, all expert widths) and the
    dtype-generic helpers' module (indices <-> multihot, tokens mask)."""
    _prepare_all((-1, 0, 1, 2), lambda dtype: check(lib.pt_moe_routing_prepare(dtype)), "moe routing dtype")
# FP8-output fusions (kernels/quantization/fused_fp8.cuh in the norm and gated modules): both
# granularities and formats, each input dtype, a specialized and an any-hidden RMSNorm module, the
# residual variant; (kind, dtype, gamma dtype, hidden, granularity, fp8 dtype), kind 0/1 = plain/residual.
_E4M3, _E5M2 = 3, 4
_NORM_FP8_JOBS = [(0, "bf16", "bf16", 4096, g, _E4M3) for g in (1, 2)]
_NORM_FP8_JOBS += [(0, "bf16", "fp32", 4104, 2, _E5M2), (0, "fp16", "fp16", 7168, 1, _E5M2),
                   (0, "fp32", "fp32", 4096, 2, _E4M3), (1, "bf16", "bf16", 4096, 2, _E4M3)]
_GATED_FP8_JOBS = [(0, "bf16", 1408, g, _E4M3) for g in (1, 2)]
_GATED_FP8_JOBS += [(1, "fp16", 4096, 2, _E5M2), (0, "fp32", 4096, 1, _E4M3)]


def test_fp8_fusion_modules_compile_for_sm90a():
    def prepare(job):
        if len(job) == 6:
            res, dt, gdt, hidden, g, f8 = job
            check(lib.pt_rmsnorm_fp8_prepare(res, _RMSNORM_DTYPES[dt], _RMSNORM_DTYPES[gdt], hidden, g, f8))
        else:
            act, dt, cols, g, f8 = job
            check(lib.pt_gated_act_fp8_prepare(act, _RMSNORM_DTYPES[dt], cols, g, f8))

    _prepare_all(_NORM_FP8_JOBS + _GATED_FP8_JOBS, prepare, "fp8 fusion")
    _assert_compiled("rmsnorm_bf16_bf16_vec_h4096_fp8row_e4m3", "rmsnorm_bf16_f32_vec_hany_fp8blk128_e5m2",
                     "rmsnorm_residual_bf16_bf16_vec_h4096_fp8blk128_e4m3", "gated_silu_bf16_vec_fp8row_e4m3",
                     "gated_gelu_f16_vec_fp8blk128_e5m2")
# FP8 grouped GEMM (CUTLASS ptr-array, block-scaled): the forward point of BLOCKWISE (1x128 x
# 128x128, 1x2 cluster) and the HYBRID dgrad point of ROWWISE (E5M2 x E4M3, 1x128 x 1x128, 1x1
# cluster). Codes: pt_dtype; the fourth field is b_scale_rows.
def _grouped_fp8_jobs():
    return [(_E4M3, _E4M3, _BF16, 128, 0), (_E5M2, _E4M3, _BF16, 1, 1)]


def test_cutlass_grouped_gemm_fp8_compiles_for_sm90a_with_fp8_wgmma():
    _prepare_all(_grouped_fp8_jobs(), lambda job: check(lib.pt_grouped_gemm_fp8_prepare(*job)), "grouped_gemm_fp8")
    _assert_sass_contains("QGMMA", "grouped_gemm_fp8_cutlass_*", min_modules=2, every_module=True)
    _assert_no_register_spills("grouped_gemm_fp8_cutlass_*_128x128x128_*")


def test_cutlass_grouped_gemm_fp8_row_scaled_compiles_for_sm90a_with_fp8_wgmma():
    """The ROWWISE kernel (scales in the epilogue): the forward point with fast accumulation at a
    128x128 and a 128x256 tile (one accumulator, so the wide tile fits without spilling), and the
    promoted HYBRID dgrad point."""
    jobs = [("fast", 0), ("fast", 2), ("promoted", 0)]
    _prepare_all(jobs, lambda j: check(lib.pt_grouped_gemm_fp8_fast_prepare(_E4M3, _E4M3, _BF16, j[1]) if j[0] == "fast"
                                       else lib.pt_grouped_gemm_fp8_prepare(_E5M2, _E4M3, _BF16, 0, j[1])), "rows")
    _assert_sass_contains("QGMMA", "grouped_gemm_fp8_rowwise_cutlass_*", every_module=True)
    _assert_no_register_spills("grouped_gemm_fp8_rowwise_cutlass_*")


def test_cutlass_grouped_gemm_fp8_wgrad_compiles_for_sm90a_with_fp8_wgmma():
    """The reduction-split (variable-K) FP8 grouped kernel: HYBRID wgrad point, E5M2 x E4M3."""
    check(lib.pt_grouped_gemm_fp8_wgrad_prepare(_E5M2, _E4M3, _BF16, 0))
    _assert_sass_contains("QGMMA", "grouped_gemm_fp8_cutlass_*_wgrad_*")
# Batched transpose (grouped FP8 dgrad weights): one module per element size.
def test_transpose_modules_compile_for_sm90a():
    _prepare_all((1, 2, 4), lambda size: check(lib.pt_transpose_prepare(size)), "transpose element bytes")
    _assert_compiled("transpose_1byte", "transpose_2byte", "transpose_4byte")


# Grouped rows to and from the per-group padded layout (grouped quantization, FP8 wgrad tokens).
def test_group_rows_module_compiles_for_sm90a():
    check(lib.pt_group_rows_prepare())
    _assert_compiled("group_rows")


# The fused AdamW step (turbo.optim.FusedAdamW): one module, every param / moment dtype pair.
def test_adamw_module_compiles_for_sm90a():
    check(lib.pt_adamw_prepare())
    _assert_compiled("adamw")


# MX -> 1x128 restatement (MX gemm_fp8, gemm_fp4): one module per input format (E4M3, E5M2, FP4).
def test_mx_to_blocks_modules_compile_for_sm90a():
    dtypes = (3, 4, 6)  # PT_FLOAT8_E4M3, PT_FLOAT8_E5M2, PT_FLOAT4_E2M1_X2
    _prepare_all(dtypes, lambda dtype: check(lib.pt_mx_to_blocks_prepare(dtype)), "mx_to_blocks dtype")
