"""Choosing a backend and configuration for one problem: the machinery every operator shares.

An operator describes its problem through :class:`TunableProblem`; :func:`select` applies the
priority order (code > environment > autotune > operator default > any backend that accepts),
and :func:`tune` profiles every accepted (backend, config) pair with CUDA events on first sight
of a key, keeps the winner in memory and in the core's on-disk cache, and makes every rank of a
``torch.distributed`` job take the same choice.
"""

import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from primus_turbo._core import TurboNotSupportedError, check, lib
from primus_turbo._core.lib import string_out
from primus_turbo.pytorch.core.backend import BackendType, OpFamily, PrecisionType, resolve

Choice = Tuple[BackendType, int]  # (backend, config index; -1 = the backend's own default)

_decided: Dict[str, Choice] = {}
_lock = threading.Lock()
_warned: set = set()
_process_group = None


class TunableProblem:
    """What an operator tells the dispatcher about one call."""

    op: OpFamily
    precision: PrecisionType
    default_backend: BackendType
    backends: Sequence[BackendType]  # every backend registered for the op, in fallback order

    def key(self) -> str:
        raise NotImplementedError

    def query(self, backend: BackendType) -> Tuple[bool, int, str]:
        """(accepted, number of configs, reason when not accepted)."""
        raise NotImplementedError

    def prepare(self, backend: BackendType, config: int) -> None:
        """Compile what the config needs; called from worker threads."""

    def run(self, backend: BackendType, config: int, for_tuning: bool = False) -> None:
        """Launch on the current stream. for_tuning: write to scratch if the op accumulates."""
        raise NotImplementedError


def warn_once(message: str) -> None:
    with _lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, stacklevel=3)


def clear_memory() -> None:
    """Forgets this process's decisions and re-arms the once-only warnings."""
    with _lock:
        _decided.clear()
        _warned.clear()
    lib.pt_settings_touch()  # native plans chosen from the forgotten decisions are re-planned


def set_process_group(group) -> None:
    """The group whose ranks must agree on autotune choices (default: the world group)."""
    global _process_group
    _process_group = group


_gpu_names: Dict[int, str] = {}


def gpu_name(device: torch.device) -> str:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _gpu_names:
        _gpu_names[index] = torch.cuda.get_device_name(index).replace("|", "_").replace("\t", " ")
    return _gpu_names[index]


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def select(problem: TunableProblem, device: torch.device) -> Choice:
    choice = resolve(problem.op, problem.precision)
    if choice.backend is not None:
        accepted, _, why = problem.query(choice.backend)
        if accepted:
            return choice.backend, -1
        warn_once(
            f"{problem.op.name}: backend {choice.backend.name} was requested but does not accept "
            f"this problem ({why}); falling back to the next choice"
        )
    if choice.auto_tune:
        tuned = tune(problem, device)
        if tuned is not None:
            return tuned
    accepted, _, why_default = problem.query(problem.default_backend)
    if accepted:
        return problem.default_backend, -1
    reasons = [f"{problem.default_backend.name}: {why_default}"]
    for backend in problem.backends:
        if backend == problem.default_backend:
            continue
        accepted, _, why = problem.query(backend)
        if accepted:
            warn_once(
                f"{problem.op.name}: default backend {problem.default_backend.name} does not accept "
                f"this problem ({why_default}); using {backend.name}"
            )
            return backend, -1
        reasons.append(f"{backend.name}: {why}")
    raise TurboNotSupportedError(f"{problem.op.name}: no backend accepts this problem: " + "; ".join(reasons))


def _encode(choice: Choice) -> str:
    return f"{choice[0].name}:{choice[1]}"


def _decode(value: str) -> Optional[Choice]:
    try:
        name, config = value.rsplit(":", 1)
        return BackendType[name], int(config)
    except (KeyError, ValueError):
        return None


def _candidates(problem: TunableProblem) -> List[Choice]:
    out = []
    for backend in problem.backends:
        accepted, n, _ = problem.query(backend)
        if accepted:
            out.extend((backend, c) for c in range(n))
    return out


def _time_rounds(fns: List[Callable[[], None]], rounds: int = 3, target_ms: float = 1.0) -> List[float]:
    """Per-call milliseconds of each fn: the best of `rounds` round-robin rounds, each long enough
    (about target_ms) to swamp launch overhead. Interleaving the candidates keeps clock and
    thermal drift from favouring whichever ran first; the minimum discards one-off stalls."""
    per_call = []
    for fn in fns:  # warm-up, and a first estimate that sizes each round
        fn()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        per_call.append(max(start.elapsed_time(end), 1e-3))
    iters = [min(50, max(2, int(target_ms / t))) for t in per_call]
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters[i]):
                fn()
            end.record()
            end.synchronize()
            best[i] = min(best[i], start.elapsed_time(end) / iters[i])
    return best


def _sync_group():
    if os.environ.get("PRIMUS_TURBO_AUTO_TUNE_SYNC", "1") == "0":
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return _process_group if _process_group is not None else dist.group.WORLD


def _profile(problem: TunableProblem, candidates: List[Choice]) -> List[float]:
    def compile_one(c: Choice):
        try:
            problem.prepare(*c)
            return None
        except Exception as e:  # a config that fails to build is skipped, not fatal
            return e

    workers = max(1, min(len(candidates), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        errors = list(pool.map(compile_one, candidates))
    runnable = []
    for c, err in zip(candidates, errors):
        if err is not None:
            warn_once(f"{problem.op.name}: autotune skips {c[0].name} config {c[1]}: {err}")
            continue
        try:
            problem.run(*c, for_tuning=True)  # a config that fails to launch is skipped too
            runnable.append(c)
        except Exception as e:
            warn_once(f"{problem.op.name}: autotune skips {c[0].name} config {c[1]}: {e}")
    measured = _time_rounds([lambda c=c: problem.run(*c, for_tuning=True) for c in runnable]) if runnable else []
    by_candidate = dict(zip(runnable, measured))
    return [by_candidate.get(c, float("inf")) for c in candidates]


def tune(problem: TunableProblem, device: torch.device, agree: bool = True) -> Optional[Choice]:
    """The measured choice for problem (measured now on first sight of its key). agree=False skips
    the ranks' agreement, for ops that not every rank calls at the same point of a step."""
    key = f"{problem.op.name}|{gpu_name(device)}|{problem.key()}"
    with _lock:
        if key in _decided:
            return _decided[key]
    cached = None
    buf_value = _lookup(key)
    if buf_value is not None:
        cached = _decode(buf_value)
    if _capturing():
        return cached  # never profile inside a graph capture
    candidates = _candidates(problem)
    if not candidates:
        return None
    group = _sync_group() if agree else None
    if cached is not None and cached not in candidates:
        cached = None
    if group is None:
        winner = cached if cached is not None else _fastest(problem, candidates, None)
    else:
        winner = _agree(problem, candidates, cached, group)
    if winner is None:
        return None
    if buf_value is None or _decode(buf_value) != winner:
        check(lib.pt_autotune_store(key.encode(), _encode(winner).encode()))
    with _lock:
        _decided[key] = winner
    return winner


def _lookup(key: str) -> Optional[str]:
    import ctypes

    buf = ctypes.create_string_buffer(256)
    if lib.pt_autotune_lookup(key.encode(), buf, len(buf)):
        return buf.value.decode()
    return None


def _fastest(problem, candidates, group) -> Optional[Choice]:
    times = _profile(problem, candidates)
    if group is not None:
        import torch.distributed as dist

        t = torch.tensor(times, dtype=torch.float64, device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)  # slowest rank's view decides
        times = t.tolist()
    best = min(range(len(times)), key=lambda i: times[i])
    return None if times[best] == float("inf") else candidates[best]


def _agree(problem, candidates, cached, group) -> Optional[Choice]:
    """Every rank of the group ends with the same choice: if all ranks have a cached entry, rank
    0's wins; otherwise all ranks profile together and the smallest worst-rank time wins."""
    import torch.distributed as dist

    flag = torch.tensor([1 if cached is not None else 0], dtype=torch.int32, device="cuda")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    if flag.item() == 1:
        index = torch.tensor([candidates.index(cached)], dtype=torch.int64, device="cuda")
        dist.broadcast(index, src=dist.get_global_rank(group, 0), group=group)
        return candidates[index.item()]
    return _fastest(problem, candidates, group)


def cache_file() -> str:
    return string_out(lib.pt_autotune_cache_file)
