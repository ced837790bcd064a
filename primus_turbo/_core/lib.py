"""Loads libprimus_turbo and declares its C API (csrc/include/primus_turbo/primus_turbo.h).

The core is reached through ctypes rather than a compiled Python extension: nothing here is built
against a Python or framework version, so one install keeps working across torch releases, and
ctypes releases the GIL during calls, which lets several threads compile JIT kernels at once.
"""

import ctypes
import os
import sys
from pathlib import Path

PT_MAX_DIMS = 8

# pt_status codes.
PT_SUCCESS = 0
PT_ERROR_INVALID_ARGUMENT = 1
PT_ERROR_NOT_SUPPORTED = 2
PT_ERROR_CUDA = 3
PT_ERROR_CUBLAS = 4
PT_ERROR_JIT = 5
PT_ERROR_INTERNAL = 6


class TurboError(RuntimeError):
    """A failure inside a Primus-Turbo kernel, library call or the JIT compiler."""


class TurboNotSupportedError(TurboError, NotImplementedError):
    """The inputs are valid, but the chosen backend or configuration does not implement them."""


class PtTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * PT_MAX_DIMS),
        ("strides", ctypes.c_int64 * PT_MAX_DIMS),
    ]


class PtQuantizeJob(ctypes.Structure):
    """pt_quantize_job (csrc/include/primus_turbo/quantization.h)."""

    _fields_ = [
        ("x", ctypes.POINTER(PtTensor)),
        ("q_row", ctypes.POINTER(PtTensor)),
        ("s_row", ctypes.POINTER(PtTensor)),
        ("q_col", ctypes.POINTER(PtTensor)),
        ("s_col", ctypes.POINTER(PtTensor)),
        ("granularity", ctypes.c_int32),
        ("block_size", ctypes.c_int32),
        ("col_transposed", ctypes.c_int32),
        ("flags", ctypes.c_int32),
        ("amax", ctypes.POINTER(PtTensor)),
    ]


class PtGroupedGemmArgs(ctypes.Structure):
    """pt_grouped_gemm_args (csrc/include/primus_turbo/grouped_gemm.h)."""

    _fields_ = [
        ("a", ctypes.POINTER(PtTensor)),
        ("b", ctypes.POINTER(PtTensor)),
        ("group_lens", ctypes.POINTER(PtTensor)),
        ("group_offs", ctypes.POINTER(PtTensor)),
        ("d", ctypes.POINTER(PtTensor)),
        ("wgrad", ctypes.c_int32),
        ("trans_b", ctypes.c_int32),
        ("num_sms", ctypes.c_int32),
    ]


class PtGroupedGemmFp8Args(ctypes.Structure):
    """pt_grouped_gemm_fp8_args (csrc/include/primus_turbo/grouped_gemm_fp8.h)."""

    _fields_ = [
        ("a", ctypes.POINTER(PtTensor)),
        ("a_scale", ctypes.POINTER(PtTensor)),
        ("b", ctypes.POINTER(PtTensor)),
        ("b_scale", ctypes.POINTER(PtTensor)),
        ("group_lens", ctypes.POINTER(PtTensor)),
        ("group_offs", ctypes.POINTER(PtTensor)),
        ("d", ctypes.POINTER(PtTensor)),
        ("b_scale_rows", ctypes.c_int32),
        ("num_sms", ctypes.c_int32),
        ("wgrad", ctypes.c_int32),
        ("tokens", ctypes.c_int64),
        ("flags", ctypes.c_int32),
    ]


def _library_path() -> Path:
    override = os.environ.get("PRIMUS_TURBO_LIBRARY")
    if override:
        return Path(override)
    own = Path(__file__).resolve().parent.parent / "lib" / "libprimus_turbo.so"
    if own.exists():
        return own
    # Python started in a source checkout (e.g. `python -m primus_turbo.precompile` from the
    # repository root) imports the tree, which has no built library: use the installed package's.
    for entry in sys.path:
        installed = Path(entry or ".").resolve() / "primus_turbo" / "lib" / "libprimus_turbo.so"
        if installed.exists():
            return installed
    return own


_P = ctypes.POINTER
_i32, _i64, _f32, _sz = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_size_t
_vp, _cp = ctypes.c_void_p, ctypes.c_char_p
_T = _P(PtTensor)

_PROTOTYPES = {
    "pt_last_error": (_cp, []),
    "pt_version": (_cp, []),
    "pt_backend_from_name": (_i32, [_cp, _P(_i32)]),
    "pt_backend_name": (_cp, [_i32]),
    "pt_backend_set": (_i32, [_i32, _i32, _i32, _i32]),
    "pt_backend_get_code": (_i32, [_i32, _i32, _P(_i32), _P(_i32)]),
    "pt_backend_get_env": (_i32, [_i32, _i32, _P(_i32), _P(_i32)]),
    "pt_autotune_set_enabled": (_i32, [_i32]),
    "pt_autotune_enabled": (_i32, []),
    "pt_backend_resolve": (_i32, [_i32, _i32, _P(_i32), _P(_i32)]),
    "pt_backend_reset": (_i32, []),
    "pt_settings_epoch": (ctypes.c_uint64, []),
    "pt_settings_touch": (None, []),
    "pt_autotune_lookup": (_i32, [_cp, _cp, _sz]),
    "pt_autotune_store": (_i32, [_cp, _cp]),
    "pt_autotune_clear": (_i32, [_i32]),
    "pt_autotune_cache_file": (_i32, [_cp, _sz]),
    "pt_jit_set_cutlass_include": (_i32, [_cp]),
    "pt_jit_cache_dir": (_i32, [_cp, _sz]),
    "pt_jit_stats": (_i32, [_P(_i64), _P(_i64)]),
    "pt_gemm": (_i32, [_T, _T, _T, _i32, _i32, _f32, _f32, _i32, _i32, _vp, _sz, _vp]),
    "pt_gemm_query": (_i32, [_T, _T, _T, _i32, _i32, _f32, _i32, _P(_i32), _P(_i32), _cp, _sz]),
    "pt_gemm_num_configs": (_i32, [_i32]),
    "pt_gemm_config_name": (_i32, [_T, _T, _T, _i32, _i32, _f32, _i32, _i32, _cp, _sz]),
    "pt_gemm_prepare": (_i32, [_T, _T, _T, _i32, _i32, _f32, _i32, _i32]),
    "pt_gemm_problem_key": (_i32, [_T, _T, _T, _i32, _i32, _f32, _cp, _sz]),
    "pt_gemm_workspace_bytes": (_sz, []),
    "pt_gemm_plan_create": (_i32, [_T, _T, _T, _i32, _i32, _f32, _f32, _i32, _i32, _P(_vp)]),
    "pt_gemm_plan_run": (_i32, [_vp, _vp, _vp, _vp, _vp, _sz, _vp]),
    "pt_gemm_plan_needs_workspace": (_i32, [_vp]),
    "pt_gemm_plan_destroy": (None, [_vp]),
    "pt_grouped_gemm": (_i32, [_P(PtGroupedGemmArgs), _i32, _i32, _vp, _sz, _vp]),
    "pt_grouped_gemm_query": (_i32, [_P(PtGroupedGemmArgs), _i32, _P(_i32), _P(_i32), _cp, _sz]),
    "pt_grouped_gemm_workspace_size": (_i32, [_P(PtGroupedGemmArgs), _i32, _i32, _P(_sz)]),
    "pt_grouped_gemm_prepare": (_i32, [_P(PtGroupedGemmArgs), _i32, _i32]),
    "pt_grouped_gemm_config_name": (_i32, [_P(PtGroupedGemmArgs), _i32, _i32, _cp, _sz]),
    "pt_grouped_gemm_problem_key": (_i32, [_P(PtGroupedGemmArgs), _cp, _sz]),
    "pt_grouped_gemm_num_configs": (_i32, [_i32]),
    # grouped_gemm_fp8.h
    "pt_grouped_gemm_fp8": (_i32, [_P(PtGroupedGemmFp8Args), _i32, _i32, _vp, _sz, _vp]),
    "pt_grouped_gemm_fp8_query": (_i32, [_P(PtGroupedGemmFp8Args), _i32, _P(_i32), _P(_i32), _cp, _sz]),
    "pt_grouped_gemm_fp8_workspace_size": (_i32, [_P(PtGroupedGemmFp8Args), _i32, _i32, _P(_sz)]),
    "pt_grouped_gemm_fp8_config_name": (_i32, [_P(PtGroupedGemmFp8Args), _i32, _i32, _cp, _sz]),
    "pt_grouped_gemm_fp8_problem_key": (_i32, [_P(PtGroupedGemmFp8Args), _cp, _sz]),
    "pt_grouped_gemm_fp8_prepare": (_i32, [_i32, _i32, _i32, _i32, _i32]),
    "pt_grouped_gemm_fp8_num_configs": (_i32, [_i32]),
    "pt_grouped_gemm_fp8_wgrad_prepare": (_i32, [_i32, _i32, _i32, _i32]),
    "pt_grouped_gemm_fp8_fast_prepare": (_i32, [_i32, _i32, _i32, _i32]),
    "pt_gemm_fp8": (_i32, [_T, _T, _i32, _T, _T, _i32, _T, _f32, _i32, _i32, _i32, _vp, _sz, _vp]),
    "pt_gemm_fp8_query": (_i32, [_T, _T, _i32, _T, _T, _i32, _T, _f32, _i32, _i32, _P(_i32), _P(_i32), _cp, _sz]),
    "pt_gemm_fp8_prepare": (_i32, [_i32, _i32, _i32, _i32, _i32, _i32]),
    "pt_gemm_fp8_num_configs": (_i32, [_i32]),
    "pt_gemm_fp8_problem_key": (_i32, [_T, _T, _i32, _T, _T, _i32, _T, _f32, _i32, _cp, _sz]),
    # gemm_mx.h
    "pt_mx_to_blocks": (_i32, [_T, _T, _T, _T, _vp]),
    "pt_mx_to_blocks_prepare": (_i32, [_i32]),
    # layout.h
    "pt_transpose_last2": (_i32, [_T, _T, _vp]),
    "pt_transpose_prepare": (_i32, [_i32]),
    "pt_group_pad_rows": (_i32, [_T, _T, _T, _i64, _T, _T, _T, _vp]),
    "pt_group_gather_rows": (_i32, [_T, _T, _T, _T, _T, _vp]),
    "pt_group_rows_prepare": (_i32, []),
    # optim.h (pt_adamw_step is called from the torch binding)
    "pt_adamw_prepare": (_i32, []),
    "pt_rmsnorm_fwd": (_i32, [_T, _T, _T, _T, _f32, _i32, _vp]),
    "pt_rmsnorm_bwd": (_i32, [_T, _T, _T, _T, _T, _T, _vp, _sz, _i32, _vp]),
    "pt_rmsnorm_bwd_workspace_bytes": (_sz, [_i64, _i64]),
    "pt_rmsnorm_prepare": (_i32, [_i32, _i32, _i64]),
    # normalization.h, activation.h
    "pt_rmsnorm_residual_fwd": (_i32, [_T, _T, _T, _T, _T, _T, _f32, _i32, _vp]),
    "pt_rmsnorm_residual_bwd": (_i32, [_T, _T, _T, _T, _T, _T, _T, _vp, _sz, _i32, _vp]),
    "pt_layernorm_fwd": (_i32, [_T, _T, _T, _T, _T, _T, _f32, _vp]),
    "pt_layernorm_bwd": (_i32, [_T, _T, _T, _T, _T, _T, _T, _T, _vp, _sz, _vp]),
    "pt_layernorm_bwd_workspace_bytes": (_sz, [_i64, _i64]),
    "pt_norm_prepare": (_i32, [_i32, _i32, _i32, _i64]),
    "pt_gated_act_fwd": (_i32, [_i32, _T, _T, _T, _T, _T, _vp]),
    "pt_gated_act_bwd": (_i32, [_i32, _T, _T, _T, _T, _T, _T, _T, _vp]),
    "pt_gated_act_prepare": (_i32, [_i32, _i32, _i64]),
    # rope.h
    "pt_rope": (_i32, [_T, _T, _T, _T, _T, _T, _T, _T, _i32, ctypes.c_double, _i32, _i32, _i32, _vp]),
    "pt_rope_prepare": (_i32, [_i32, _i32, _i32, _i32]),
    "pt_attention_prepare": (_i32, [_i32, _i32, _i32]),
    "pt_attention_fp8_prepare": (_i32, [_i32, _i32, _i32]),
    # moe_permute.h
    "pt_moe_permute": (_i32, [_T, _T, _T, _T, _T, _T, _T, _vp]),
    "pt_moe_unpermute": (_i32, [_T, _T, _T, _T, _T, _T, _vp]),
    "pt_moe_unpermute_bwd": (_i32, [_T, _T, _T, _T, _T, _T, _T, _vp]),
    "pt_moe_permute_prepare": (_i32, [_i32, _i32]),
    # moe_routing.h
    "pt_moe_routing_fwd": (_i32, [_T, _T, _T, _T, _i32, _i32, _i32, _i32, _f32, _vp]),
    "pt_moe_routing_bwd": (_i32, [_T, _T, _T, _T, _T, _i32, _i32, _f32, _vp]),
    "pt_indices_to_multihot_fwd": (_i32, [_T, _T, _T, _T, _vp]),
    "pt_indices_to_multihot_bwd": (_i32, [_T, _T, _T, _vp]),
    "pt_tokens_per_expert_to_mask": (_i32, [_T, _T, _vp]),
    "pt_moe_routing_prepare": (_i32, [_i32]),
    "pt_moe_route_workspace_ints": (_i64, [_i64, _i32]),
    "pt_moe_route_build": (_i32, [_T, _i32, _i32, _i64, _i32, _T, _T, _T, _T, _T, _vp]),
    "pt_moe_rows_scatter": (_i32, [_T, _T, _i32, _T, _T, _T, _i32, _T, _T, _T, _vp]),
    "pt_moe_rows_gather": (_i32, [_T, _T, _i32, _T, _T, _T, _vp]),
    # quantization (csrc/include/primus_turbo/quantization.h)
    "pt_quantize": (_i32, [_T, _T, _T, _T, _T, _i32, _i32, _i32, _i32, ctypes.c_uint64, _vp, _sz, _vp]),
    "pt_quantize_workspace_bytes": (_sz, [_i64, _i64, _i32]),
    "pt_quantize_jobs": (_i32, [_P(PtQuantizeJob), _i32, _vp, _sz, _vp]),
    "pt_quantize_jobs_workspace_bytes": (_sz, [_P(PtQuantizeJob), _i32]),
    "pt_dequantize": (_i32, [_T, _T, _T, _i32, _i32, _i32, _i32, _vp]),
    "pt_quantize_prepare": (_i32, [_i32, _i32]),
    # fp8_fusion.h
    "pt_rmsnorm_fp8_fwd": (_i32, [_T, _T, _T, _T, _T, _T, _T, _T, _i32, _f32, _i32, _vp]),
    "pt_gated_act_fp8_fwd": (_i32, [_i32, _T, _T, _T, _T, _T, _T, _i32, _vp]),
    "pt_rmsnorm_fp8_prepare": (_i32, [_i32, _i32, _i32, _i64, _i32, _i32]),
    "pt_gated_act_fp8_prepare": (_i32, [_i32, _i32, _i64, _i32, _i32]),
}


LIBRARY_DIR: Path = Path(".")  # where the loaded core library lives (its siblings: the native ops)


def _load():
    path = _library_path()
    if not path.exists():
        raise ImportError(
            f"Primus-Turbo's core library is missing at {path}; install the package with "
            "'pip install .' (or set PRIMUS_TURBO_LIBRARY to a built libprimus_turbo.so)"
        )
    handle = ctypes.CDLL(str(path))
    global LIBRARY_DIR
    LIBRARY_DIR = path.resolve().parent
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(handle, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return handle


lib = _load()


def last_error() -> str:
    return lib.pt_last_error().decode(errors="replace")


def check(status: int, context: str = "") -> None:
    """Raises the Python exception matching a pt_status, with the core's message."""
    if status == PT_SUCCESS:
        return
    message = last_error()
    if context:
        message = f"{context}: {message}"
    if status == PT_ERROR_INVALID_ARGUMENT:
        raise ValueError(message)
    if status == PT_ERROR_NOT_SUPPORTED:
        raise TurboNotSupportedError(message)
    raise TurboError(message)


def string_out(fn, *args, size: int = 4096) -> str:
    """Calls a C function that fills (char* buf, size_t len) as its last two arguments."""
    buf = ctypes.create_string_buffer(size)
    check(fn(*args, buf, size))
    return buf.value.decode()


def _configure_cutlass() -> None:
    if os.environ.get("PRIMUS_TURBO_CUTLASS_INCLUDE"):
        return
    import importlib.util

    # Locate the package without importing it: only its headers are needed.
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.origin:
        return  # reported by the JIT runtime only if a CUTLASS kernel is needed
    include = Path(spec.origin).resolve().parent / "source" / "include"
    if include.is_dir():
        check(lib.pt_jit_set_cutlass_include(str(include).encode()))


_configure_cutlass()
