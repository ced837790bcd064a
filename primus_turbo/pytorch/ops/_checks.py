"""Argument checks shared by the operators: raised on the host, before any launch."""

from typing import Optional, Tuple

import torch


def check_cuda_tensors(op: str, **tensors: torch.Tensor) -> None:
    """Every tensor is on one CUDA device (fake/meta tensors pass: they only carry shapes)."""
    device = None
    for name, t in tensors.items():
        if t.device.type == "meta":
            continue
        if t.device.type != "cuda":
            raise ValueError(f"{op}: argument '{name}' is on {t.device}; expected a CUDA device")
        if device is None:
            device = t.device
        elif t.device != device:
            raise ValueError(f"{op}: argument '{name}' is on {t.device} but the other inputs are on {device}")


def flag(op: str, name: str, value) -> bool:
    """A bool argument as a bool: True / False (or the ints 0 / 1); anything else (a tensor, a
    string, 2) is a TypeError naming it, never read as truthy."""
    if value is True or value is False:
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{op}: argument '{name}' must be a bool, got {value!r}")


def matrix_operand(t: torch.Tensor, trans: bool) -> Tuple[torch.Tensor, bool]:
    """Returns t unchanged when it is row- or column-major (any leading dimension); otherwise a
    contiguous copy. The core reads either major order directly, so views cost nothing."""
    rows, cols = t.shape
    s0, s1 = t.stride()
    if s1 == 1 or s0 == 1 or rows <= 1 or cols <= 1:
        return t, trans
    return t.contiguous(), trans


def check_main_grad_pattern(pattern: Optional[str]) -> None:
    if pattern is not None and pattern != "megatron":
        raise ValueError(f"fuse_bgrad_accum_pattern must be None or 'megatron', got {pattern!r}")


def check_main_grad(weight: torch.Tensor, pattern: Optional[str]) -> Optional[torch.Tensor]:
    """For fuse_bgrad_accum_pattern="megatron": validates weight.main_grad, marks the weight so
    Megatron skips its own accumulation, and returns the buffer the wgrad GEMM adds into."""
    check_main_grad_pattern(pattern)
    if pattern is None:
        return None
    main_grad = getattr(weight, "main_grad", None)
    if not isinstance(main_grad, torch.Tensor):
        raise ValueError("fuse_bgrad_accum_pattern='megatron' needs the weight to carry a 'main_grad' tensor")
    if main_grad.shape != weight.shape:
        raise ValueError(
            f"weight.main_grad has shape {tuple(main_grad.shape)}; expected the weight's shape {tuple(weight.shape)}"
        )
    if main_grad.dtype not in (torch.float32, weight.dtype):
        raise TypeError(f"weight.main_grad has dtype {main_grad.dtype}; expected float32 or {weight.dtype}")
    if main_grad.stride(-1) != 1:
        raise ValueError("weight.main_grad must be row-major (unit stride on its last dimension)")
    if main_grad.device != weight.device:
        raise ValueError(f"weight.main_grad is on {main_grad.device}; expected the weight's device {weight.device}")
    weight.grad_added_to_main_grad = True
    return main_grad


def check_num_cu(op: str, num_cu) -> int:
    """num_cu as the kernels take it (0: all SMs); ValueError unless None or a positive int."""
    if num_cu is not None and (isinstance(num_cu, bool) or not isinstance(num_cu, int) or num_cu < 1):
        raise ValueError(f"{op}: num_cu must be a positive int or None, got {num_cu!r}")
    return int(num_cu or 0)


def check_schedule(op: str, schedule) -> None:
    """The grouped GEMMs' persistent tile schedule: "static" is the one this library has."""
    if schedule == "static":
        return
    if schedule == "work_steal":
        raise NotImplementedError(
            f"{op}: schedule='work_steal' (the AMD library's work-stealing kernel) is not implemented here; "
            "use schedule='static'"
        )
    raise ValueError(f"{op}: schedule must be 'static', got {schedule!r}")


# ---- fuse_bgrad_accum_pattern="megatron": the weight gradient goes into weight.main_grad --------

_dummy_wgrads = {}


def dummy_wgrad(shape, dtype, device) -> torch.Tensor:
    """Stand-in weight gradient when wgrad went into main_grad: Megatron expects a tensor (its
    hooks stand down because grad_added_to_main_grad is set) and never reads it. One per shape."""
    key = (tuple(shape), dtype, device)
    if key not in _dummy_wgrads:
        _dummy_wgrads[key] = torch.empty(shape, dtype=dtype, device=device)
    return _dummy_wgrads[key]


class _IntoMainGrad(torch.autograd.Function):
    """Identity on the weight whose backward adds the weight's gradient into main_grad."""

    @staticmethod
    def forward(ctx, weight, main_grad):
        ctx.main_grad = main_grad
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        ctx.main_grad.add_(grad)
        return dummy_wgrad(grad.shape, grad.dtype, grad.device), None


def route_wgrad_to_main_grad(weight: torch.Tensor, pattern: Optional[str]) -> torch.Tensor:
    """For ops whose wgrad kernel cannot accumulate in place (the grouped GEMMs): with pattern
    "megatron", weight as seen by autograd, its gradient added into weight.main_grad right after
    the wgrad GEMM (one add, not fused into the GEMM's epilogue). Else weight unchanged."""
    main_grad = check_main_grad(weight, pattern)
    if main_grad is None or not (torch.is_grad_enabled() and weight.requires_grad):
        return weight
    return _IntoMainGrad.apply(weight, main_grad)
