"""Warm the JIT kernel cache ahead of time, e.g. on a build node or before a training job.

    python -m primus_turbo.precompile --dtype bf16                  # every GEMM config, all layouts
    python -m primus_turbo.precompile --dtype bf16 --layouts AkBk --configs 0 3 -j 8
    python -m primus_turbo.precompile --gemm 8192x28672x8192 --dtype bf16 --autotune   # what these shapes use
    python -m primus_turbo.precompile --defaults            # every op's default modules (what install builds)

A CUTLASS GEMM module depends on dtypes, operand layouts and the tile configuration, not on
M/N/K, so this compiles per (dtype, layout, config). Layout codes name the contiguous dimension of
each operand: AkBk is a Linear forward (x @ w^T), AkBn its dgrad, AmBn its wgrad. No GPU is needed.

    python -m primus_turbo.precompile --op grouped_gemm --dtype bf16   # MoE grouped GEMM modules

Grouped GEMM layouts: AkBn is the forward with b [G, K, N] (and the dgrad of trans_b=True), AkBk
the forward with trans_b=True (and the dgrad of trans_b=False), AmBn every wgrad.

    python -m primus_turbo.precompile --op gemm_fp8 --fp8-format hybrid --out-dtype bf16 fp32

Dense FP8 modules are the CUTLASS block-scaled kernels (1x128 / 128x128 scales; the default backend,
cuBLASLt, needs none); default config 0, the one used without autotune.

    python -m primus_turbo.precompile --op grouped_gemm_fp8 --fp8-format hybrid   # FP8 MoE modules

FP8 grouped GEMM modules depend on the two FP8 dtypes, the output dtype, the weight's scale
granularity (1-row: TENSORWISE/ROWWISE, 128-row: BLOCKWISE) and the config; its wgrad uses the
bf16 grouped GEMM's AmBn modules.
"""

import argparse
import glob
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import List, Sequence, Tuple

import ctypes

from primus_turbo._core import PtTensor, check, lib
from primus_turbo._core.lib import PtGroupedGemmArgs, string_out

BACKEND_CUTLASS = 2
_DTYPES = {"fp32": 0, "fp16": 1, "bf16": 2}
# Layout code -> (trans_a, trans_b) on row-major storage.
LAYOUTS = {"AkBk": (0, 1), "AkBn": (0, 0), "AmBn": (1, 0), "AmBk": (1, 1)}
_FAKE_PTR = 1 << 20  # a 16-byte aligned address: descriptors are inspected, never dereferenced


def _tensor(shape: Sequence[int], dtype: int) -> PtTensor:
    """A contiguous descriptor at a fake address."""
    t = PtTensor()
    t.data = _FAKE_PTR
    t.dtype = dtype
    t.ndim = len(shape)
    stride = 1
    for i in reversed(range(len(shape))):
        t.shape[i], t.strides[i] = shape[i], stride
        stride *= shape[i]
    return t


def _matrix(rows: int, cols: int, dtype: int) -> PtTensor:
    return _tensor((rows, cols), dtype)


# Grouped GEMM layout code -> (wgrad, trans_b) of a call that uses it.
GROUPED_LAYOUTS = {"AkBn": (0, 0), "AkBk": (0, 1), "AmBn": (1, 0)}
_INT64 = 8


def _grouped_args(dtype: int, layout: str, g: int = 4, size: int = 256):
    wgrad, trans_b = GROUPED_LAYOUTS[layout]
    parts = [
        _tensor((size, size), dtype),
        _tensor((size, size) if wgrad else (g, size, size), dtype),
        _tensor((g,), _INT64),
        None,
        _tensor((g, size, size) if wgrad else (size, size), dtype),
    ]
    ptrs = [ctypes.pointer(t) if t is not None else None for t in parts]
    args = PtGroupedGemmArgs(*ptrs, wgrad, trans_b)
    args._keep = parts  # the descriptors must outlive the struct that points at them
    return args


def num_grouped_configs() -> int:
    return lib.pt_grouped_gemm_num_configs(BACKEND_CUTLASS)


def grouped_config_name(dtype: str, layout: str, config: int) -> str:
    args = _grouped_args(_DTYPES[dtype], layout)
    name = string_out(lib.pt_grouped_gemm_config_name, ctypes.byref(args), BACKEND_CUTLASS, config, size=256)
    return f"grouped_gemm {dtype} {layout} {name}"


def compile_grouped_one(dtype: str, layout: str, config: int) -> float:
    args = _grouped_args(_DTYPES[dtype], layout)
    start = time.time()
    check(lib.pt_grouped_gemm_prepare(ctypes.byref(args), BACKEND_CUTLASS, config))
    return time.time() - start


def _problem(dtype: int, out_dtype: int, layout: str, size: int = 256):
    trans_a, trans_b = LAYOUTS[layout]
    a = _matrix(size, size, dtype)
    b = _matrix(size, size, dtype)
    d = _matrix(size, size, out_dtype)
    return a, b, d, trans_a, trans_b


def _parse_shape(text: str) -> Tuple[int, int, int]:
    try:
        m, n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--gemm takes MxNxK shapes, got {text!r}") from None
    return m, n, k


# The three GEMMs of a Linear layer y = x @ w^T with x [M, K], w [N, K]: (layout, out rows, out cols,
# reduction) of the forward, the dgrad and the wgrad.
def _linear_gemms(m: int, n: int, k: int):
    return [("AkBk", m, n, k), ("AkBn", m, k, n), ("AmBn", n, k, m)]


def shape_jobs(shapes: Sequence[str], dtypes: Sequence[str], out_dtypes, autotune: bool) -> Tuple[List[Tuple], List[str]]:
    """The CUTLASS modules the forward and backward GEMMs of these Linear shapes can use: what the
    resolved backend setting needs (CUTLASS: its default config), or with autotune every candidate
    the backend accepts for the problem. cuBLASLt (the default backend) needs none. Returns (jobs,
    notes)."""
    b, t = ctypes.c_int32(), ctypes.c_int32()
    check(lib.pt_backend_resolve(0, 0, ctypes.byref(b), ctypes.byref(t)))  # GEMM, bf16/fp16/fp32
    autotune = autotune or bool(t.value)
    jobs, notes = [], []
    for text in shapes:
        m, n, k = _parse_shape(text)
        for dt in dtypes:
            for out in out_dtypes or [dt]:
                for layout, rows, cols, red in _linear_gemms(m, n, k):
                    ta, tb = LAYOUTS[layout]
                    a = _matrix(red, rows, _DTYPES[dt]) if ta else _matrix(rows, red, _DTYPES[dt])
                    bb = _matrix(cols, red, _DTYPES[dt]) if tb else _matrix(red, cols, _DTYPES[dt])
                    d = _matrix(rows, cols, _DTYPES[out])
                    accepted, count = ctypes.c_int32(), ctypes.c_int32()
                    reason = ctypes.create_string_buffer(512)
                    status = lib.pt_gemm_query(a, bb, d, ta, tb, 0.0, BACKEND_CUTLASS, ctypes.byref(accepted),
                                               ctypes.byref(count), reason, len(reason))
                    if status:  # no GPU on a build host: the fixed candidate list, all of it
                        accepted.value, count.value = 1, num_cutlass_configs()
                    if not accepted.value:
                        notes.append(f"{text} {layout}: CUTLASS does not take it ({reason.value.decode()})")
                    elif autotune:
                        jobs.extend((dt, out, layout, c) for c in range(count.value))
                    elif b.value == BACKEND_CUTLASS:
                        # The default depends on the SM count (gemm_cutlass_configs.cpp:
                        # cutlass_default_config): both configs it can pick.
                        jobs.extend((dt, out, layout, c) for c in (0, 3))
    if not autotune and b.value != BACKEND_CUTLASS:
        notes.append("the default GEMM backend (cuBLASLt) needs no kernel modules; pass --autotune to build "
                     "the CUTLASS candidates autotune would time")
    return sorted(set(jobs), key=str), notes


def num_cutlass_configs() -> int:
    return lib.pt_gemm_num_configs(BACKEND_CUTLASS)


def config_name(dtype: str, out_dtype: str, layout: str, config: int) -> str:
    a, b, d, ta, tb = _problem(_DTYPES[dtype], _DTYPES[out_dtype], layout)
    name = string_out(lib.pt_gemm_config_name, a, b, d, ta, tb, 0.0, BACKEND_CUTLASS, config, size=256)
    return f"gemm {dtype}->{out_dtype} {layout} {name}"


def compile_one(dtype: str, out_dtype: str, layout: str, config: int) -> float:
    a, b, d, ta, tb = _problem(_DTYPES[dtype], _DTYPES[out_dtype], layout)
    start = time.time()
    check(lib.pt_gemm_prepare(a, b, d, ta, tb, 0.0, BACKEND_CUTLASS, config))
    return time.time() - start


# FP8 grouped GEMM: (operand A, operand B) dtype codes per format's forward and dgrad GEMMs.
_FP8_CODES = {"e4m3": 3, "e5m2": 4}
FP8_GROUPED_PAIRS = {"e4m3": [("e4m3", "e4m3")], "e5m2": [("e5m2", "e5m2")], "hybrid": [("e4m3", "e4m3"), ("e5m2", "e4m3")]}


def num_grouped_fp8_configs() -> int:
    return lib.pt_grouped_gemm_fp8_num_configs(BACKEND_CUTLASS)


# The kinds of FP8 grouped kernel a job names: block scales (b_scale_rows 1 or 128), row scales in the
# epilogue (ROWWISE; "rows_fast" with fast accumulation), and the experimental FP8 wgrad.
_GROUPED_FP8_KINDS = {1: "b-scales 1-row", 128: "b-scales 128-row", "rows": "row scales",
                      "rows_fast": "row scales, fast accumulation", "wgrad": "wgrad"}


def grouped_fp8_name(a: str, b: str, out_dtype: str, kind, config: int) -> str:
    return f"grouped_gemm_fp8 {a}x{b}->{out_dtype} {_GROUPED_FP8_KINDS[kind]} config {config}"


def compile_grouped_fp8_one(a: str, b: str, out_dtype: str, kind, config: int) -> float:
    """kind: a key of _GROUPED_FP8_KINDS."""
    start = time.time()
    codes = (_FP8_CODES[a], _FP8_CODES[b], _DTYPES[out_dtype])
    if kind == "wgrad":
        check(lib.pt_grouped_gemm_fp8_wgrad_prepare(*codes, config))
    elif kind == "rows_fast":
        check(lib.pt_grouped_gemm_fp8_fast_prepare(*codes, config))
    else:
        check(lib.pt_grouped_gemm_fp8_prepare(*codes, 0 if kind == "rows" else kind, config))
    return time.time() - start


# Dense FP8 GEMM (CUTLASS block-scaled kernels): operand dtype pairs per format (the forward, dgrad
# and wgrad GEMMs of gemm_fp8) and the scaling pairs (1x128 activations / gradients, 128x128 weights).
FP8_DENSE_PAIRS = {
    "e4m3": [("e4m3", "e4m3")],
    "e5m2": [("e5m2", "e5m2")],
    "hybrid": [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")],
}
_BLOCK_SCALINGS = {"1x128": 2, "128x128": 3}
FP8_DENSE_SCALINGS = [("1x128", "128x128"), ("1x128", "1x128"), ("128x128", "1x128")]


def gemm_fp8_name(a: str, b: str, out_dtype: str, sa: str, sb: str, config: int) -> str:
    return f"gemm_fp8 {a}x{b}->{out_dtype} scales {sa}/{sb} config {config}"


def compile_gemm_fp8_one(a: str, b: str, out_dtype: str, sa: str, sb: str, config: int) -> float:
    start = time.time()
    check(lib.pt_gemm_fp8_prepare(_FP8_CODES[a], _FP8_CODES[b], _DTYPES[out_dtype], _BLOCK_SCALINGS[sa],
                                  _BLOCK_SCALINGS[sb], config))
    return time.time() - start


# ---- the default modules: what each op uses without autotune, built ahead of time -------------
# Codes of the C API (primus_turbo.h): dtypes, norm kinds, quantized dtypes.
_F32, _F16, _BF16, _E4M3, _E5M2, _FP4 = 0, 1, 2, 3, 4, 6
_RMS, _RES, _LN = 0, 1, 2
# Hidden sizes of the model tables (shared/MODELS.md) get specialized norm modules; 1000 stands for
# every other 16-byte-aligned size (one runtime-hidden module), 4097 for unaligned rows.
DEFAULT_HIDDEN = (1000, 2048, 2880, 3584, 4096, 4097, 5120, 6144, 7168, 8192, 16384)
DEFAULT_FAMILIES = ("norm", "activation", "rope", "attention", "quantization", "moe", "fp8_fusion", "gemm_fp8",
                    "grouped_gemm", "grouped_gemm_fp8", "optim")
# (head dim of q/k, head dim of v) of the attention modules: the model tables' pairs, and the rest
# of what the kernel takes.
ATTENTION_HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256))
ATTENTION_FP8_HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 128))  # the FP8 forward's


def _prepare_jobs(family: str) -> List[Tuple]:
    """("prepare", label, C function, args) jobs of the elementwise families."""
    jobs = []
    if family == "norm":
        for dt in (_BF16, _F16):
            for h in DEFAULT_HIDDEN:
                for kind, name in ((_RMS, "rmsnorm"), (_RES, "rmsnorm_residual"), (_LN, "layernorm")):
                    jobs.append(("prepare", f"{name} dtype {dt} hidden {h}", "pt_norm_prepare", (kind, dt, dt, h)))
            jobs.append(("prepare", f"rmsnorm dtype {dt}, fp32 gamma", "pt_norm_prepare", (_RMS, dt, _F32, 4096)))
    elif family == "activation":
        for act in (0, 1):  # SwiGLU, GeGLU
            for dt in (_BF16, _F16):
                for cols in (128, 127):  # vectorized rows, unaligned rows
                    jobs.append(("prepare", f"gated act {act} dtype {dt} cols {cols}", "pt_gated_act_prepare",
                                 (act, dt, cols)))
    elif family == "rope":
        for dt in (_BF16, _F16):
            for interleaved in (0, 1):
                for table in (0, 1):
                    jobs.append(("prepare", f"rope dtype {dt} interleaved {interleaved} table {table}",
                                 "pt_rope_prepare", (dt, 1, interleaved, table)))
    elif family == "attention":
        for dt in (_BF16, _F16):
            for d, dv in ATTENTION_HEAD_DIMS:
                jobs.append(("prepare", f"attention dtype {dt} head dims {d}/{dv}", "pt_attention_prepare", (dt, d, dv)))
            for d, dv in ATTENTION_FP8_HEAD_DIMS:
                jobs.append(("prepare", f"FP8 attention dtype {dt} head dims {d}/{dv}", "pt_attention_fp8_prepare",
                             (dt, d, dv)))
    elif family == "quantization":
        for dt in (_BF16, _F16, _F32):
            for q in (_E4M3, _E5M2, _FP4):
                jobs.append(("prepare", f"quantize dtype {dt} -> {q}", "pt_quantize_prepare", (dt, q)))
        jobs += [("prepare", f"transpose {n}-byte", "pt_transpose_prepare", (n,)) for n in (1, 2, 4)]
        jobs.append(("prepare", "group rows", "pt_group_rows_prepare", ()))
    elif family == "moe":
        jobs += [("prepare", f"moe routing dtype {dt}", "pt_moe_routing_prepare", (dt,)) for dt in (-1, _BF16, _F32)]
        jobs += [("prepare", f"moe permute dtype {dt} vec {v}", "pt_moe_permute_prepare", (dt, v))
                 for dt in (_BF16, _F16) for v in (1, 0)]
    elif family == "optim":
        jobs.append(("prepare", "fused adamw", "pt_adamw_prepare", ()))
    elif family == "fp8_fusion":
        for g in (1, 2):  # rowwise, 1x128 blocks
            for h in (2048, 4096, 7168, 8192):
                jobs.append(("prepare", f"rmsnorm_fp8 hidden {h} granularity {g}", "pt_rmsnorm_fp8_prepare",
                             (0, _BF16, _BF16, h, g, _E4M3)))
            for act in (0, 1):
                jobs.append(("prepare", f"gated_fp8 act {act} granularity {g}", "pt_gated_act_fp8_prepare",
                             (act, _BF16, 128, g, _E4M3)))
    return jobs


def default_jobs(families: Sequence[str] = DEFAULT_FAMILIES) -> List[Tuple]:
    """The modules the ops use without autotune on bf16/fp16 models: norms at the model tables'
    hidden sizes, gated activations, RoPE, quantizers, MoE routing and permutation, the FP8-emitting
    fusions, the fused optimizer, the dense FP8 block-scaled GEMMs (E4M3 and HYBRID), and the grouped GEMMs' default
    configs (bf16/fp16, FP8) plus every bf16 grouped autotune candidate. The dense bf16/fp16 GEMM's default, cuBLASLt, needs none."""
    unknown = sorted(set(families) - set(DEFAULT_FAMILIES))
    if unknown:
        raise SystemExit(f"unknown default families {unknown}; choose from {list(DEFAULT_FAMILIES)}")
    jobs = []
    for family in families:
        jobs += _prepare_jobs(family)
    if "gemm_fp8" in families:
        pairs = sorted({pair for fmt in ("e4m3", "hybrid") for pair in FP8_DENSE_PAIRS[fmt]})
        jobs += [("gemm_fp8", a, b, "bf16", sa, sb, 0) for a, b in pairs for sa, sb in FP8_DENSE_SCALINGS]
    # The grouped defaults depend on the problem and the SM count (grouped_gemm_configs.cpp,
    # grouped_gemm_fp8.cpp: default_config): both configs either heuristic can pick. For bf16, every
    # autotune candidate too, so a first autotuned MoE call measures instead of compiling (four
    # more modules per layout; about 30 s of the install on 16 cores).
    if "grouped_gemm" in families:
        jobs += [("grouped_gemm", "fp16", layout, c) for layout in GROUPED_LAYOUTS for c in (0, 3)]
        jobs += [("grouped_gemm", "bf16", layout, c) for layout in GROUPED_LAYOUTS
                 for c in range(num_grouped_configs())]
    if "grouped_gemm_fp8" in families:  # ROWWISE takes the row-scaled kernel; its fast form the forward pair only
        jobs += [("grouped_gemm_fp8", a, b, "bf16", kind, c)
                 for a, b in FP8_GROUPED_PAIRS["hybrid"] for kind in (1, 128, "rows") for c in (0, 1)]
        jobs += [("grouped_gemm_fp8", "e4m3", "e4m3", "bf16", "rows_fast", c) for c in (0, 1, 2)]
    return jobs


def _compile_prepared(label: str, fn: str, args: Tuple) -> float:
    start = time.time()
    check(getattr(lib, fn)(*args))
    return time.time() - start


def _job_fns(job: Tuple):
    """GEMM jobs are (dtype, out_dtype, layout, config); grouped ones ("grouped_gemm", dtype,
    layout, config); FP8 grouped ones ("grouped_gemm_fp8", a, b, out_dtype, kind, config);
    elementwise ones ("prepare", label, C function, args)."""
    if job[0] == "prepare":
        return _compile_prepared, lambda label, fn, args: label, job[1:]
    if job[0] == "grouped_gemm_fp8":
        return compile_grouped_fp8_one, grouped_fp8_name, job[1:]
    if job[0] == "gemm_fp8":
        return compile_gemm_fp8_one, gemm_fp8_name, job[1:]
    if job[0] == "grouped_gemm":
        return compile_grouped_one, grouped_config_name, job[1:]
    return compile_one, config_name, job


def compile_all(jobs: Sequence[Tuple], workers: int, quiet: bool = False) -> List[str]:
    """Compiles jobs in parallel; returns the error messages (empty when all succeeded)."""
    errors = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {}
        for job in jobs:
            fn, _, args = _job_fns(job)
            futures[pool.submit(fn, *args)] = job
        for done, fut in enumerate(as_completed(futures), 1):
            job = futures[fut]
            _, namer, args = _job_fns(job)
            label = namer(*args)
            try:
                seconds = fut.result()
                status = f"ok ({seconds:.1f} s)"
            except Exception as e:  # report every failure, keep compiling the rest
                errors.append(f"{label}: {e}")
                status = "FAILED"
            if not quiet:
                bar = "#" * (30 * done // len(jobs))
                print(f"[{bar:<30}] {done}/{len(jobs)} {label}: {status}", flush=True)
    return errors


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", nargs="+", default=["gemm"], choices=["gemm", "gemm_fp8", "grouped_gemm", "grouped_gemm_fp8"])
    p.add_argument("--fp8-format", nargs="+", default=["hybrid"], choices=sorted(FP8_GROUPED_PAIRS),
                   help="gemm_fp8 / grouped_gemm_fp8: the formats to build the kernels of")
    p.add_argument("--fp8-wgrad", action="store_true",
                   help="grouped_gemm_fp8: also the experimental FP8 wgrad kernels")
    p.add_argument("--dtype", nargs="+", default=["bf16"], choices=["bf16", "fp16"])
    p.add_argument("--out-dtype", nargs="+", default=None, choices=["bf16", "fp16", "fp32"],
                   help="output dtypes (default: same as the input; add fp32 for main_grad accumulation)")
    p.add_argument("--layouts", nargs="+", default=None, choices=sorted(set(LAYOUTS) | set(GROUPED_LAYOUTS)),
                   help="default: every layout of the op")
    p.add_argument("--configs", nargs="+", type=int, default=None, help="config indices (default: all)")
    p.add_argument("--gemm", nargs="+", default=None,
                   help="MxNxK Linear shapes (x [M, K] @ w[N, K]^T): build only the modules their forward and "
                   "backward GEMMs use (with --autotune: every candidate autotune would time)")
    p.add_argument("--autotune", action="store_true", help="with --gemm: the autotune candidates")
    p.add_argument("--defaults", nargs="*", default=None, metavar="FAMILY",
                   help="the modules every op uses without autotune (all families, or the ones named: "
                   + ", ".join(DEFAULT_FAMILIES) + ")")
    p.add_argument("--cache-dir", default=None,
                   help="write the modules here (a folder the runtime reads as PRIMUS_TURBO_CACHE_DIR or "
                   "PRIMUS_TURBO_PREBUILT_DIR) instead of the user's cache")
    p.add_argument("--list", action="store_true", help="print the modules that would be built, build none")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    if args.cache_dir:
        os.environ["PRIMUS_TURBO_CACHE_DIR"] = os.path.abspath(args.cache_dir)  # read at each build
        # Build into it even what a prebuilt folder (the installed package's) already holds.
        os.environ["PRIMUS_TURBO_NO_PREBUILT"] = "1"
    jobs = []
    if args.defaults is not None:
        jobs.extend(default_jobs(args.defaults or DEFAULT_FAMILIES))
    elif args.gemm:
        shaped, notes = shape_jobs(args.gemm, args.dtype, args.out_dtype, args.autotune)
        for note in notes:
            print(note, flush=True)
        jobs.extend(shaped)
    elif "gemm" in args.op:
        configs = args.configs if args.configs is not None else list(range(num_cutlass_configs()))
        for dt in args.dtype:
            for out in args.out_dtype or [dt]:
                for layout in [x for x in args.layouts or LAYOUTS if x in LAYOUTS]:
                    jobs.extend((dt, out, layout, c) for c in configs)
    if "grouped_gemm" in args.op:
        configs = args.configs if args.configs is not None else list(range(num_grouped_configs()))
        for dt in args.dtype:
            for layout in [x for x in args.layouts or GROUPED_LAYOUTS if x in GROUPED_LAYOUTS]:
                jobs.extend(("grouped_gemm", dt, layout, c) for c in configs)
    if "gemm_fp8" in args.op:
        configs = args.configs if args.configs is not None else [0]
        pairs = sorted({pair for fmt in args.fp8_format for pair in FP8_DENSE_PAIRS[fmt]})
        for out in args.out_dtype or args.dtype:
            for a, b in pairs:
                jobs.extend(("gemm_fp8", a, b, out, sa, sb, c) for sa, sb in FP8_DENSE_SCALINGS for c in configs)
    if "grouped_gemm_fp8" in args.op:
        configs = args.configs if args.configs is not None else list(range(num_grouped_fp8_configs()))
        pairs = sorted({pair for fmt in args.fp8_format for pair in FP8_GROUPED_PAIRS[fmt]})
        for out in args.out_dtype or args.dtype:
            for a, b in pairs:
                jobs.extend(("grouped_gemm_fp8", a, b, out, kind, c) for kind in (1, 128, "rows") for c in configs)
                if a == b:  # a forward pair (the dgrad's never accumulates fast): its fast form's 128x256 tiles too
                    fast = args.configs if args.configs is not None else list(range(4))
                    jobs.extend(("grouped_gemm_fp8", a, b, out, "rows_fast", c) for c in fast)
            if args.fp8_wgrad:  # (grad, input) for trans_b=True and (input, grad) otherwise
                wpairs = sorted({p for (a, b) in pairs for p in ((a, b), (b, a))})
                jobs.extend(("grouped_gemm_fp8", a, b, out, "wgrad", c) for (a, b) in wpairs for c in configs)
    if args.list:
        for job in jobs:
            _, namer, job_args = _job_fns(job)
            print(namer(*job_args))
        print(f"{len(jobs)} kernel modules")
        return 0
    print(f"compiling {len(jobs)} kernel modules with {args.jobs} workers", flush=True)
    if not jobs:
        return 0
    errors = compile_all(jobs, args.jobs)
    if args.cache_dir:  # a folder to ship or read as prebuilt: no build locks left in it
        for lock in glob.glob(os.path.join(args.cache_dir, "jit", ".lock-*")):
            os.remove(lock)
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
