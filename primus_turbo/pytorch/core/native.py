"""The PyTorch binding's native ops (``libprimus_turbo_torch.so``, csrc/bindings/torch/).

Those ops are registered with torch's dispatcher in C++: one call from Python checks the
arguments, allocates the outputs, finds the plan and launches on torch's current stream. This
module loads the library, registers what stays in Python (the GEMM planner: backend settings,
autotune and its distributed agreement, run once per new problem) and turns the native layer's
tagged errors back into the Python exception classes the fake implementations raise.
"""

import ctypes
import functools
import os
import re

import torch

from primus_turbo._core import TurboError, TurboNotSupportedError
from primus_turbo._core.lib import LIBRARY_DIR

_PATH = LIBRARY_DIR / "libprimus_turbo_torch.so"
if not _PATH.exists():
    raise ImportError(
        f"Primus-Turbo's PyTorch ops are missing at {_PATH}; install the package with torch present: "
        "'pip install --no-build-isolation .'"
    )
torch.ops.load_library(str(_PATH))
handle = ctypes.CDLL(str(_PATH))

ops = torch.ops.primus_turbo


def _load_cpp_autograd() -> bool:
    """The C++ autograd of some ops (``libprimus_turbo_torch_autograd.so``, built against one torch
    version's full C++ API): True when it loaded. Missing, or built for another torch (a load
    error), the ops keep their Python ``autograd.Function``. PRIMUS_TURBO_CPP_AUTOGRAD=0 turns it off."""
    path = LIBRARY_DIR / "libprimus_turbo_torch_autograd.so"
    if os.environ.get("PRIMUS_TURBO_CPP_AUTOGRAD", "1") == "0" or not path.exists():
        return False
    try:
        torch.ops.load_library(str(path))
    except OSError:
        return False
    return True


# Whether the C++ autograd loaded (the ops that have it: ARCHITECTURE, "The boundary").
CPP_AUTOGRAD = _load_cpp_autograd()


def training_op(name: str, fake_impl):
    """``primus_turbo::<name>``, a training op of the C++ autograd (forward and backward without
    Python in between), after giving it its fake implementation; None when that library did not
    load (the op's Python ``autograd.Function`` serves)."""
    if not CPP_AUTOGRAD:
        return None
    from primus_turbo.pytorch.core import library

    library.register_fake(name, fake_impl)
    return getattr(ops, name).default


def eager_cpp_autograd() -> bool:
    """Whether a training call takes an op's C++ autograd: when it loaded, in eager mode
    (torch.compile traces the Python ``autograd.Function`` instead)."""
    return CPP_AUTOGRAD and not torch.compiler.is_compiling()

_TAG = re.compile(r"\[primus_turbo:(\w+)\] ")
_KINDS = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "NotImplementedError": TurboNotSupportedError,
    "RuntimeError": TurboError,
}


# torch's dispatcher refusing an argument of the wrong type before the op runs (e.g. out_dtype="bf16").
_SCHEMA_TYPE = re.compile(r"primus_turbo::(\w+)\(\) Expected a value of type '([^']+)' for argument '(\w+)' "
                          r"but instead found type '([^']+)'")


def translate(error: RuntimeError) -> Exception:
    """The Python exception a native op's error stands for (the error itself if it is not ours)."""
    message = str(error)
    m = _TAG.search(message)
    if m is not None:
        return _KINDS.get(m.group(1), TurboError)(message[m.end():].split("\n", 1)[0])
    m = _SCHEMA_TYPE.search(message)
    if m is not None:  # the value is of the wrong type, or an int out of the int64 range
        op, expected, arg, found = m.groups()
        return TypeError(f"{op}: argument '{arg}' must be {expected}, got {found}")
    return error


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


# The planner: on the first call of a problem, a native op with backends asks Python for the
# (backend, config) its plan binds. int32 (int32 op, const void* request, int32 device,
# int32* backend, int32* config, char* message, size_t message_len); op as PlannerOp in
# csrc/bindings/torch/plan_cache.h.
PLAN_GEMM = 0
PLAN_GROUPED_GEMM = 1
PLAN_GEMM_FP8 = 2
PLAN_GROUPED_GEMM_FP8 = 3
_P = ctypes.POINTER
_PLANNER = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, _P(ctypes.c_int32), _P(ctypes.c_int32),
    ctypes.c_void_p, ctypes.c_size_t,
)
_planners = {}


def register_planner(op: int, make_problem) -> None:
    """make_problem(request_address, device_index) -> an autotune.TunableProblem with a ``device``:
    the op's problem built from its request (whose descriptors live only during the call). The
    planner picks its (backend, config) by autotune.select: settings, autotune, fallbacks."""
    _planners[op] = make_problem


def _choose(op: int, request: int, device: int):
    from primus_turbo.pytorch.core import autotune  # autotune imports nothing of this module
    from primus_turbo.pytorch.core.tensor_bridge import device_guard

    problem = _planners[op](request, device)
    with device_guard(problem.device):
        backend, config = autotune.select(problem, problem.device)
    return backend.value, config


def _status(error: BaseException) -> int:
    if isinstance(error, TypeError):
        return 100
    if isinstance(error, NotImplementedError):
        return 2  # PT_ERROR_NOT_SUPPORTED
    if isinstance(error, ValueError):
        return 1  # PT_ERROR_INVALID_ARGUMENT
    return 6  # PT_ERROR_INTERNAL


@_PLANNER
def _plan(op, request, device, backend_out, config_out, message, message_len):
    try:
        backend_out[0], config_out[0] = _choose(op, request, device)
        return 0
    except BaseException as e:  # noqa: BLE001 - reported to the native caller, which raises it
        data = str(e).encode(errors="replace")[: max(message_len - 1, 0)]
        ctypes.memmove(message, data + b"\0", len(data) + 1)
        return _status(e)


handle.pt_torch_set_planner.argtypes = [_PLANNER]
handle.pt_torch_set_planner.restype = None
handle.pt_torch_set_planner(_plan)
