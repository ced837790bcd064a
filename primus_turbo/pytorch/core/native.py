"""The PyTorch binding's native ops (``libprimus_turbo_torch.so``, csrc/bindings/torch/).

Those ops are registered with torch's dispatcher in C++: one call from Python checks the
arguments, allocates the outputs, finds the plan and launches on torch's current stream. This
module loads the library, registers what stays in Python (the GEMM planner: backend settings,
autotune and its distributed agreement, run once per new problem) and turns the native layer's
tagged errors back into the Python exception classes the fake implementations raise.
"""

import ctypes
import functools
import re
from pathlib import Path

import torch

from primus_turbo._core import TurboError, TurboNotSupportedError
from primus_turbo._core.lib import PtTensor

_PATH = Path(__file__).resolve().parent.parent.parent / "lib" / "libprimus_turbo_torch.so"
if not _PATH.exists():
    raise ImportError(
        f"Primus-Turbo's PyTorch ops are missing at {_PATH}; install the package with torch present: "
        "'pip install --no-build-isolation .'"
    )
torch.ops.load_library(str(_PATH))
handle = ctypes.CDLL(str(_PATH))

ops = torch.ops.primus_turbo

_TAG = re.compile(r"\[primus_turbo:(\w+)\] ")
_KINDS = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "NotImplementedError": TurboNotSupportedError,
    "RuntimeError": TurboError,
}


def translate(error: RuntimeError) -> Exception:
    """The Python exception a native op's error stands for (the error itself if it is not ours)."""
    message = str(error)
    m = _TAG.search(message)
    if m is None:
        return error
    return _KINDS.get(m.group(1), TurboError)(message[m.end():].split("\n", 1)[0])


def raises_python_errors(fn):
    """Decorates a public op: native errors surface as ValueError / TypeError /
    NotImplementedError / TurboError, as from the fake (meta) implementation. A try block costs
    nothing until something raises."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            translated = translate(e)
            if translated is e:
                raise
            raise translated from None

    return wrapper


# int32 (const pt_tensor* a, const pt_tensor* b, const pt_tensor* d, int32 trans_a, int32 trans_b,
#        float beta, int32 device, int32* backend, int32* config, char* message, size_t len)
_P = ctypes.POINTER
GEMM_PLANNER = ctypes.CFUNCTYPE(
    ctypes.c_int32, _P(PtTensor), _P(PtTensor), _P(PtTensor), ctypes.c_int32, ctypes.c_int32, ctypes.c_float,
    ctypes.c_int32, _P(ctypes.c_int32), _P(ctypes.c_int32), ctypes.c_void_p, ctypes.c_size_t,
)
handle.pt_torch_set_gemm_planner.argtypes = [GEMM_PLANNER]
handle.pt_torch_set_gemm_planner.restype = None
handle.pt_torch_clear_gemm_plans.argtypes = []
handle.pt_torch_clear_gemm_plans.restype = None

# Status codes a planner returns (pt_status, plus one for TypeError).
PLANNER_CODES = {ValueError: 1, NotImplementedError: 2, TypeError: 100}


def planner_status(error: BaseException) -> int:
    for cls, code in PLANNER_CODES.items():
        if isinstance(error, cls):
            return code
    return 6  # PT_ERROR_INTERNAL


def write_message(buf: int, size: int, message: str) -> None:
    data = message.encode(errors="replace")[: max(size - 1, 0)]
    ctypes.memmove(buf, data + b"\0", len(data) + 1)
