"""Backend selection and autotuning, as the original library exposes it.

Priority, highest first: code settings (``GlobalBackendManager.set_*_backend``) > environment
variables (``PRIMUS_TURBO_*_BACKEND``) > autotune (``set_auto_tune`` / ``PRIMUS_TURBO_AUTO_TUNE``)
> the operator's default > any registered backend that accepts the inputs (warned once).
The state lives in the C++ core, so every binding sees the same settings.
"""

import ctypes
import os
from enum import Enum
from typing import Optional, Union

from primus_turbo._core import check, lib


class BackendType(Enum):
    """Implementations available on NVIDIA GPUs. Values mirror pt_backend in the C API."""

    CUBLASLT = 1
    CUTLASS = 2
    CUDNN = 3
    TURBO = 4
    NCCL = 5
    DEEP_EP = 6
    # The original library's AMD names, where a natural equivalent exists (Enum aliases).
    HIPBLASLT = 1
    CK = 2
    RCCL = 5

    @classmethod
    def _missing_(cls, value):
        if isinstance(value, str):
            return cls.from_name(value)
        return None

    @classmethod
    def from_name(cls, name: str) -> "BackendType":
        """Parses a name as the environment variables do (case-insensitive, AMD aliases)."""
        code = ctypes.c_int32()
        check(lib.pt_backend_from_name(name.encode(), ctypes.byref(code)))
        return cls(code.value)


class _AmdOnlyBackend:
    """Class attribute for an AMD backend with no NVIDIA equivalent: reading it explains why."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, owner):
        BackendType.from_name(self.name)  # raises ValueError naming the NVIDIA choices


for _name in ("AITER", "TRITON", "FLYDSL", "HIPKITTENS"):
    setattr(BackendType, _name, _AmdOnlyBackend(_name))


class PrecisionType(Enum):
    """Precision classes a backend setting can target. Values mirror pt_precision."""

    BF16_FP16_FP32 = 0
    FP8 = 1
    FP4 = 2


class OpFamily(Enum):
    GEMM = 0
    GROUPED_GEMM = 1
    ATTN = 2
    MOE_DISPATCH_COMBINE = 3


_ENV_VARS = {
    OpFamily.GEMM: "PRIMUS_TURBO_GEMM_BACKEND",
    OpFamily.GROUPED_GEMM: "PRIMUS_TURBO_GROUPED_GEMM_BACKEND",
    OpFamily.ATTN: "PRIMUS_TURBO_ATTN_BACKEND",
    OpFamily.MOE_DISPATCH_COMBINE: "PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND",
}


# What each family can be set to (a backend with no kernel for one op of the family falls back to
# another, warned, when the op runs).
_FAMILY_BACKENDS = {
    OpFamily.GEMM: (BackendType.CUBLASLT, BackendType.CUTLASS),
    OpFamily.GROUPED_GEMM: (BackendType.CUBLASLT, BackendType.CUTLASS),
    OpFamily.ATTN: (BackendType.TURBO, BackendType.CUDNN),
    OpFamily.MOE_DISPATCH_COMBINE: (BackendType.NCCL, BackendType.DEEP_EP, BackendType.TURBO),
}


def _check_flag(name: str, value, allow_none: bool = False) -> None:
    if not (isinstance(value, bool) or (allow_none and value is None)):
        raise TypeError(f"{name} must be a bool{' or None' if allow_none else ''}, got {value!r}")


# The original library's attention kernels (composable-kernel, AITER and Triton flash attention)
# stand for our own attention kernel here, as in PRIMUS_TURBO_ATTN_BACKEND. BackendType.CK is
# BackendType.CUTLASS, so for attention CUTLASS selects TURBO too (a CuTe kernel).
_ATTN_ALIASES = ("CK", "AITER", "TRITON", "CUTLASS")


def _attention_alias(backend):
    if isinstance(backend, str) and backend.strip().upper() in _ATTN_ALIASES:
        return BackendType.TURBO
    return BackendType.TURBO if backend is BackendType.CUTLASS else backend


class BackendChoice:
    """A resolved setting: a fixed backend, autotune, or neither."""

    __slots__ = ("backend", "auto_tune")

    def __init__(self, backend: Optional[BackendType] = None, auto_tune: bool = False):
        self.backend = backend
        self.auto_tune = auto_tune

    def __repr__(self) -> str:
        return f"BackendChoice(backend={self.backend}, auto_tune={self.auto_tune})"

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, BackendChoice)
            and self.backend == other.backend
            and self.auto_tune == other.auto_tune
        )


def _to_backend(backend: Union[None, str, BackendType]) -> int:
    if backend is None:
        return 0
    if isinstance(backend, str):
        backend = BackendType.from_name(backend)
    if not isinstance(backend, BackendType):
        raise TypeError(f"backend must be a BackendType, a name or None, got {type(backend).__name__}")
    return backend.value


def _to_precision(precision: Union[None, str, PrecisionType]) -> int:
    if precision is None:
        return -1
    if isinstance(precision, str):
        key = precision.strip().upper()
        words = {"BF16": 0, "FP16": 0, "FP32": 0, "BF16_FP16_FP32": 0, "FP8": 1, "FP4": 2}
        if key not in words:
            raise ValueError(f"unknown precision '{precision}'; expected bf16, fp16, fp32, fp8 or fp4")
        return words[key]
    if not isinstance(precision, PrecisionType):
        raise TypeError(f"precision must be a PrecisionType, a name or None, got {type(precision).__name__}")
    return precision.value


def _choice(fn, op: OpFamily, precision) -> Optional[BackendChoice]:
    b, t = ctypes.c_int32(), ctypes.c_int32()
    check(fn(op.value, _to_precision(precision), ctypes.byref(b), ctypes.byref(t)))
    if b.value == 0 and not t.value:
        return None
    return BackendChoice(BackendType(b.value) if b.value else None, bool(t.value))


def settings_token(op: OpFamily) -> tuple:
    """Changes whenever the resolved choice for op could change: the core's settings epoch (a code
    setting, the autotune switch, a reset, a cleared autotune memory: the same counter the native
    ops key their plans on), the op's backend variable or PRIMUS_TURBO_AUTO_TUNE."""
    env = os.environ
    return (lib.pt_settings_epoch(), env.get(_ENV_VARS[op]), env.get("PRIMUS_TURBO_AUTO_TUNE"))


def _family_accessors(op: OpFamily):
    """GlobalBackendManager's set_<family>_backend and get_<family>_backend for one operator family
    (the original library's per-family names), as classmethods over _set and get_backend."""
    family = op.name.lower()

    def set_backend(cls, backend=None, precision=None, auto_tune: bool = False) -> None:
        cls._set(op, backend, precision, auto_tune)

    def get_backend(cls, precision) -> Optional[BackendChoice]:
        return cls.get_backend(op, precision)

    for fn, verb in ((set_backend, "set"), (get_backend, "get")):
        fn.__name__ = f"{verb}_{family}_backend"
        fn.__qualname__ = f"GlobalBackendManager.{fn.__name__}"
    return classmethod(set_backend), classmethod(get_backend)


class GlobalBackendManager:
    """Process-wide backend settings for every operator family."""

    @staticmethod
    def _set(op: OpFamily, backend, precision, auto_tune: bool) -> None:
        if op is OpFamily.ATTN:
            backend = _attention_alias(backend)
        code = _to_backend(backend)
        _check_flag("auto_tune", auto_tune)
        allowed = _FAMILY_BACKENDS[op]
        if code and BackendType(code) not in allowed:
            words = {OpFamily.GEMM: "GEMM", OpFamily.GROUPED_GEMM: "grouped GEMM", OpFamily.ATTN: "attention",
                     OpFamily.MOE_DISPATCH_COMBINE: "MoE dispatch/combine"}[op]
            article = "an" if words[0] in "aeiou" else "a"
            raise ValueError(
                f"set_{op.name.lower()}_backend: {BackendType(code).name} is not {article} {words} backend; "
                f"expected one of {', '.join(b.name for b in allowed)} or None"
            )
        check(lib.pt_backend_set(op.value, _to_precision(precision), code, int(auto_tune)))

    @staticmethod
    def get_backend(op: OpFamily, precision) -> Optional[BackendChoice]:
        """The code setting, else the environment's, for one precision (None when neither)."""
        if _to_precision(precision) < 0:
            raise ValueError("precision is required to read a backend setting")
        return _choice(lib.pt_backend_get_code, op, precision) or _choice(
            lib.pt_backend_get_env, op, precision
        )

    set_gemm_backend, get_gemm_backend = _family_accessors(OpFamily.GEMM)
    set_grouped_gemm_backend, get_grouped_gemm_backend = _family_accessors(OpFamily.GROUPED_GEMM)
    set_attn_backend, get_attn_backend = _family_accessors(OpFamily.ATTN)
    set_moe_dispatch_combine_backend, get_moe_dispatch_combine_backend = _family_accessors(
        OpFamily.MOE_DISPATCH_COMBINE
    )

    @staticmethod
    def set_auto_tune(enabled: Optional[bool]) -> None:
        """True/False overrides PRIMUS_TURBO_AUTO_TUNE; None returns control to it."""
        _check_flag("set_auto_tune: enabled", enabled, allow_none=True)
        check(lib.pt_autotune_set_enabled(-1 if enabled is None else int(enabled)))

    @staticmethod
    def auto_tune_enabled() -> bool:
        return bool(lib.pt_autotune_enabled())

    @staticmethod
    def reset() -> None:
        """Clears every code setting and the in-memory autotune results (the disk cache stays)."""
        from primus_turbo.pytorch.core import autotune

        check(lib.pt_backend_reset())
        check(lib.pt_autotune_clear(0))
        autotune.clear_memory()


def resolve(op: OpFamily, precision: PrecisionType) -> BackendChoice:
    """Code > environment > autotune, as the core resolves it."""
    b, t = ctypes.c_int32(), ctypes.c_int32()
    check(lib.pt_backend_resolve(op.value, precision.value, ctypes.byref(b), ctypes.byref(t)))
    return BackendChoice(BackendType(b.value) if b.value else None, bool(t.value))
