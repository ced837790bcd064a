"""Binding-independent access to the C++ core (ctypes over its C API)."""

from primus_turbo._core.lib import (  # noqa: F401
    PtTensor,
    TurboError,
    TurboNotSupportedError,
    check,
    lib,
)
