"""Helpers shared by every benchmark under benchmark/ops.

- correctness: ``snr_db``, ``check_close`` (the gates of shared/ACCURACY.md), ``check_matmul``
  (a float64 reference computed tile by tile, so a 30 GB output never needs a 30 GB reference);
- timing: ``time_cuda`` (CUDA events, median of >= 50 iterations, rotating input sets so the
  50 MB L2 cannot serve repeated inputs), ``time_cuda_graph`` (the same replayed from a CUDA graph:
  device time without host launch overhead), ``num_rotating_sets``, ``measure_copy_bandwidth``,
  ``host_us_per_call`` (host time per call of a tiny op);
- reporting: ``write_csv``, ``plot_comparison`` (PNG, matplotlib Agg), ``format_table``,
  ``geomean``, ``update_summary`` (benchmark/results/<gpu>/summary.json, written atomically),
  ``gpu_short_name``, ``git_commit``.

Imports only torch and the standard library at module level (matplotlib is imported when a plot
is drawn); never imports primus_turbo.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import json
import math
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RESULTS_DIR = REPO_ROOT / "benchmark" / "results"

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

MIN_TIMED_ITERS = 50


###############################################################################
# Correctness
###############################################################################


@dataclass(frozen=True)
class Gate:
    """An accuracy gate: allclose (skipped when rtol/atol are None) and/or a minimum SNR."""

    rtol: float | None = None
    atol: float | None = None
    min_snr_db: float | None = None


#: Gates of shared/ACCURACY.md for dense and grouped GEMM and elementwise results.
GEMM_GATES: dict[torch.dtype, Gate] = {
    torch.bfloat16: Gate(rtol=1e-2, atol=1e-2, min_snr_db=45.0),
    torch.float16: Gate(rtol=1e-2, atol=1e-2, min_snr_db=50.0),
    torch.float32: Gate(rtol=1e-4, atol=1e-4),
}
# SNR-only gates for later benchmarks (shared/ACCURACY.md).
FP8_E4M3_GATE = Gate(min_snr_db=25.0)
FP8_E5M2_OR_HYBRID_GATE = Gate(min_snr_db=20.0)
FP4_GEMM_GATE = Gate(min_snr_db=10.0)
FP4_GROUPED_GEMM_GATE = Gate(min_snr_db=8.0)
ATTENTION_GATE = Gate(min_snr_db=40.0)  # bf16/fp16 attention, forward and each gradient
FP8_ATTENTION_GATE = Gate(min_snr_db=20.0)


def gate_for(dtype: torch.dtype) -> Gate:
    if dtype not in GEMM_GATES:
        raise ValueError(f"no default accuracy gate for {dtype}; pass a Gate explicitly")
    return GEMM_GATES[dtype]


def snr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    """10*log10(||ref||^2 / ||ref - out||^2) in dB, computed in float64 (inf when identical)."""
    acc = _ErrorAccumulator(rtol=0.0)
    o, r = out.reshape(-1), ref.reshape(-1)
    for s in range(0, o.numel(), 1 << 26):
        acc.update(o[s : s + (1 << 26)], r[s : s + (1 << 26)])
    return acc.snr_db()


class _ErrorAccumulator:
    """Streams (out, ref) chunks; keeps what the gates need in float64 without holding the tensors.

    For allclose it keeps ``need_atol = max(|out - ref| - rtol*|ref|)``: the smallest atol for which
    ``|out - ref| <= atol + rtol*|ref|`` holds everywhere, so the atol (which depends on the
    reference's scale, known only at the end) can be applied after the last chunk.
    """

    def __init__(self, rtol: float):
        self.rtol = float(rtol)
        self.signal = 0.0  # sum ref^2
        self.noise = 0.0  # sum (out - ref)^2
        self.count = 0
        self.need_atol = 0.0
        self.max_abs_err = 0.0
        self.bad_nonfinite = 0  # out non-finite where ref is finite
        self.ref_nonfinite = 0

    def update(self, out: torch.Tensor, ref: torch.Tensor) -> None:
        if out.shape != ref.shape:
            raise ValueError(f"shape mismatch: out {tuple(out.shape)} vs ref {tuple(ref.shape)}")
        o = out.detach().to(torch.float64)
        r = ref.detach().to(device=o.device, dtype=torch.float64)
        ref_ok = torch.isfinite(r)
        out_ok = torch.isfinite(o)
        self.bad_nonfinite += int((ref_ok & ~out_ok).sum())
        self.ref_nonfinite += int((~ref_ok).sum())
        both = ref_ok & out_ok
        if not bool(both.all()):
            o, r = o[both], r[both]
        if r.numel() == 0:
            return
        diff = (o - r).abs_()
        self.count += r.numel()
        self.signal += float(torch.dot(r.reshape(-1), r.reshape(-1)))
        self.noise += float(torch.dot(diff.reshape(-1), diff.reshape(-1)))
        self.max_abs_err = max(self.max_abs_err, float(diff.max()))
        diff.sub_(r.abs().mul_(self.rtol))  # r may alias the caller's float64 ref: no in-place on it
        self.need_atol = max(self.need_atol, float(diff.max()))

    def rms_ref(self) -> float:
        return math.sqrt(self.signal / self.count) if self.count else 0.0

    def snr_db(self) -> float:
        if self.bad_nonfinite:
            return float("-inf")
        if self.noise == 0.0:
            return float("inf")
        if self.signal == 0.0:
            return float("-inf")
        return 10.0 * math.log10(self.signal / self.noise)


@dataclass
class CheckResult:
    """Outcome of one gate; truthy when it passed."""

    passed: bool
    snr_db: float
    allclose: bool | None  # None when the gate has no allclose part
    max_abs_err: float
    scale: float  # the atol multiplier that was used (RMS of the reference, or as given)
    nonfinite: int  # elements non-finite in out but finite in ref
    message: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.message


def _finish(acc: _ErrorAccumulator, gate: Gate, scale: float | None, what: str) -> CheckResult:
    if scale is None:
        scale = acc.rms_ref()
    snr = acc.snr_db()
    problems = []
    if acc.bad_nonfinite:
        problems.append(f"{acc.bad_nonfinite} NaN/Inf where the reference is finite")
    allclose = None
    if gate.rtol is not None and gate.atol is not None:
        allclose = acc.bad_nonfinite == 0 and acc.need_atol <= gate.atol * scale
        if not allclose and not acc.bad_nonfinite:
            problems.append(
                f"allclose(rtol={gate.rtol:g}, atol={gate.atol:g}*{scale:.3g}) violated: needs atol "
                f"{acc.need_atol / scale if scale else float('inf'):.3g}*scale"
            )
    if gate.min_snr_db is not None and not snr >= gate.min_snr_db:
        problems.append(f"SNR {snr:.1f} dB < {gate.min_snr_db:g} dB")
    if acc.count == 0 and not acc.bad_nonfinite and not acc.ref_nonfinite:
        problems.append("empty tensors")
    passed = not problems
    msg = f"{what}: {'PASS' if passed else 'FAIL'} SNR={snr:.1f} dB max|err|={acc.max_abs_err:.3g} rms(ref)={acc.rms_ref():.3g}"
    if problems:
        msg += " (" + "; ".join(problems) + ")"
    return CheckResult(passed, snr, allclose, acc.max_abs_err, scale, acc.bad_nonfinite, msg)


def check_close(
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype | None = None,
    gate: Gate | None = None,
    scale: float | None = None,
    what: str = "out",
    chunk_elems: int = 1 << 26,
) -> CheckResult:
    """Apply the accuracy gate for ``dtype`` (default: out.dtype) to ``out`` against ``ref``.

    ``ref`` should be a float64 (or float32 on very large shapes) result computed from the same
    low-precision inputs. allclose uses ``|out - ref| <= atol*scale + rtol*|ref|`` where ``scale``
    defaults to the RMS of the reference: the gate as written for outputs of unit size, applied to
    whatever scale the outputs have (pass ``scale=1.0`` for the raw gate). NaN/Inf in ``out`` where
    ``ref`` is finite fails whatever the SNR. Works in chunks of ``chunk_elems`` elements.
    """
    if out.shape != ref.shape:
        return _shape_failure(what, out.shape, ref.shape)
    gate = gate or gate_for(dtype or out.dtype)
    acc = _ErrorAccumulator(gate.rtol or 0.0)
    o, r = out.reshape(-1), ref.reshape(-1)
    for s in range(0, o.numel(), chunk_elems):
        acc.update(o[s : s + chunk_elems], r[s : s + chunk_elems])
    return _finish(acc, gate, scale, what)


def _shape_failure(what: str, got, expected) -> CheckResult:
    return CheckResult(
        False, float("-inf"), False, float("inf"), 0.0, 0, f"{what}: FAIL shape {tuple(got)} != expected {tuple(expected)}"
    )


def _tile_size(k: int, budget_bytes: int) -> int:
    # A tile holds two float64 operand slabs (t*k each) and ~6 float64 t*t temporaries.
    t = 8192
    while t > 128 and (2 * t * k + 6 * t * t) * 8 > budget_bytes:
        t //= 2
    return t


def check_matmul(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool = False,
    trans_b: bool = False,
    dtype: torch.dtype | None = None,
    gate: Gate | None = None,
    what: str = "out",
    budget_bytes: int = 2 << 30,
) -> CheckResult:
    """Gate ``out`` against ``op(a) @ op(b)`` computed in float64 from the same (low-precision) inputs.

    The reference is built tile by tile (about ``budget_bytes`` of float64 scratch at a time) and
    compared on the fly, so memory stays bounded for any shape; it runs on the tensors' device.
    """
    A = a.t() if trans_a else a  # [M, K] view
    B = b.t() if trans_b else b  # [K, N] view
    m, k = A.shape
    k2, n = B.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: op(a) is {tuple(A.shape)}, op(b) is {tuple(B.shape)}")
    if tuple(out.shape) != (m, n):
        return _shape_failure(what, out.shape, (m, n))
    gate = gate or gate_for(dtype or out.dtype)
    acc = _ErrorAccumulator(gate.rtol or 0.0)
    t = _tile_size(k, budget_bytes)
    with torch.no_grad():
        for r0 in range(0, m, t):
            a_blk = A[r0 : r0 + t].to(torch.float64)
            for c0 in range(0, n, t):
                ref = a_blk @ B[:, c0 : c0 + t].to(torch.float64)
                acc.update(out[r0 : r0 + t, c0 : c0 + t], ref)
                del ref
            del a_blk
    return _finish(acc, gate, None, what)


def poison_allocator(shapes: Iterable[Sequence[int]], dtype: torch.dtype, device="cuda") -> None:
    """Fill freshly freed cache blocks of these shapes with NaN.

    The caching allocator hands a just-freed block of the right size to the next allocation, so an
    operator that allocates its output right after this call most likely gets NaN-filled memory:
    an element the kernel forgets to write then shows up as NaN and fails the check. Best effort
    (the allocator makes no promise), but it costs nothing.
    """
    bufs = [torch.full(tuple(s), float("nan"), dtype=dtype, device=device) for s in shapes]
    del bufs


###############################################################################
# Timing
###############################################################################


def l2_cache_bytes(device=None) -> int:
    try:
        return int(torch.cuda.get_device_properties(device or torch.cuda.current_device()).L2_cache_size)
    except (RuntimeError, AssertionError):  # no CUDA device / CPU-only torch
        return 50 << 20  # H100


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def num_rotating_sets(
    traffic_bytes: int,
    footprint_bytes: int | None = None,
    memory_budget_bytes: int = 16 << 30,
    l2_bytes: int | None = None,
    factor: float = 2.0,
    max_sets: int = 64,
) -> int:
    """How many independent input sets a timer must rotate through so L2 cannot serve repeats.

    ``traffic_bytes``: bytes one call reads from its inputs; ``footprint_bytes``: device memory one
    extra set costs (default the same). Returns the smallest n with n * traffic > factor * L2,
    capped by the memory budget (at least 1: a set larger than 2x L2 flushes it by itself).
    """
    l2 = l2_bytes or l2_cache_bytes()
    footprint = footprint_bytes or traffic_bytes
    need = int(factor * l2 // max(1, traffic_bytes)) + 1
    cap = max(1, int(memory_budget_bytes // max(1, footprint)))
    return max(1, min(need, cap, max_sets))


def time_cuda(
    fn: Callable[..., Any],
    rotate: Sequence[Sequence[Any]] | None = None,
    warmup: int = 10,
    iters: int = 50,
    max_warmup_s: float = 2.0,
    return_stats: bool = False,
):
    """Median milliseconds of ``fn`` on the current stream, timed with CUDA events per call.

    ``rotate``: a list of argument tuples; call i runs ``fn(*rotate[i % len(rotate)])``, so with
    enough sets (see ``num_rotating_sets``) every call reads inputs that are not in L2. Without it,
    ``fn()`` is called. ``iters`` is raised to at least 50. Warm-up is ``warmup`` calls, fewer when
    they would take longer than ``max_warmup_s`` (large shapes), at least one. With
    ``return_stats`` a dict (median, mean, min, max, p10, p90, iters) comes back instead.
    """
    iters = max(int(iters), MIN_TIMED_ITERS)
    sets = list(rotate) if rotate else [()]
    n = len(sets)

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*sets[0])
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    n_warm = max(1, min(int(warmup), int(max_warmup_s / max(first_s, 1e-6))))
    for i in range(n_warm):
        fn(*sets[(i + 1) % n])
    torch.cuda.synchronize()

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        args = sets[i % n]
        starts[i].record()
        fn(*args)
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    med = statistics.median(times)
    if not return_stats:
        return med
    q = lambda p: times[min(len(times) - 1, int(p * (len(times) - 1) + 0.5))]
    return {
        "median": med,
        "mean": statistics.fmean(times),
        "min": times[0],
        "max": times[-1],
        "p10": q(0.1),
        "p90": q(0.9),
        "iters": iters,
    }


def time_cuda_graph(
    fn: Callable[..., Any],
    rotate: Sequence[Sequence[Any]] | None = None,
    calls: int = 20,
    replays: int = 20,
    warmup: int = 3,
    stream: torch.cuda.Stream | None = None,
) -> float:
    """Median milliseconds per call of ``fn`` replayed from one CUDA graph that holds ``calls``
    calls (cycling through ``rotate``): device time without the host's per-call launch overhead,
    which otherwise dominates memory-bound ops of a few tens of microseconds.

    Warm-up calls (compilation, caching-allocator growth) run on ``stream`` before capture. A
    backward whose forward ran outside the graph must use the stream that forward ran on: pass it.
    Raises if ``fn`` cannot be captured (the caller may fall back to ``time_cuda``).
    """
    sets = list(rotate) if rotate else [()]
    n = max(calls, len(sets))
    s = stream or torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(max(1, warmup)):
            fn(*sets[i % len(sets)])
    s.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        for i in range(n):
            fn(*sets[i % len(sets)])
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(max(3, replays)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / n)
    del graph
    return statistics.median(times)


def host_us_per_call(fn: Callable[[], Any], iters: int, warmup: int) -> float:
    """Host (CPU) microseconds per call of ``fn``: ``warmup`` calls and a synchronize, then ``iters``
    calls timed with perf_counter up to the last launch (the device work is synchronized after)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / iters * 1e6


def measure_copy_bandwidth(nbytes: int = 1 << 30, iters: int = 50) -> float:
    """Device-to-device copy bandwidth in GB/s (1e9 B/s), counting bytes read + bytes written.

    The achievable HBM bandwidth that memory-bound operators are judged against.
    """
    n = nbytes // 4
    src = torch.randint(1, 1 << 30, (n,), dtype=torch.int32, device="cuda")  # never zeros
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src), iters=iters)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


class GpuClockSampler:
    """SM clock (MHz) and board power (W) of the current GPU, sampled every ``interval_ms`` by one
    ``nvidia-smi -lms`` process while the ``with`` block runs; afterwards ``median_clock_mhz`` and
    ``median_power_w`` (None where nvidia-smi is missing or printed nothing). Identical kernels
    slow down when a step keeps the tensor cores busier; the clocks say whether that is the cause."""

    def __init__(self, interval_ms: int = 50):
        self.interval_ms = interval_ms
        self.median_clock_mhz: float | None = None
        self.median_power_w: float | None = None
        self._proc = None

    def _gpu_id(self) -> str:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        uuid = str(getattr(props, "uuid", "") or "")
        # Without a UUID, the CUDA ordinal: nvidia-smi's numbering differs under CUDA_VISIBLE_DEVICES.
        return ("GPU-" + uuid) if uuid and not uuid.startswith("GPU-") else (uuid or str(torch.cuda.current_device()))

    def __enter__(self) -> "GpuClockSampler":
        cmd = ["nvidia-smi", "-i", self._gpu_id(), "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
               f"--loop-ms={self.interval_ms}"]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            out, _ = self._proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
        clocks, power = [], []
        for line in out.splitlines():  # "1605, 687.12"; a field may read "[N/A]"
            parts = [p.strip() for p in line.split(",")]
            for values, i in ((clocks, 0), (power, 1)):
                try:
                    values.append(float(parts[i]))
                except (ValueError, IndexError):
                    pass
        self.median_clock_mhz = statistics.median(clocks) if clocks else None
        self.median_power_w = statistics.median(power) if power else None


def tflops(flops: float, ms: float) -> float:
    if ms is None or not math.isfinite(ms) or ms <= 0:
        return float("nan")
    return flops / (ms * 1e-3) / 1e12


###############################################################################
# Device / provenance
###############################################################################


_GPU_PATTERNS = [
    (r"GH200", "gh200"),
    (r"GB200", "gb200"),
    (r"H100.*PCIe", "h100-pcie"),
    (r"H100.*NVL", "h100-nvl"),
    (r"H100", "h100"),
    (r"H200", "h200"),
    (r"H800", "h800"),
    (r"H20\b", "h20"),
    (r"B200", "b200"),
    (r"B100", "b100"),
    (r"A100", "a100"),
    (r"A800", "a800"),
    (r"L40S", "l40s"),
    (r"L40", "l40"),
    (r"L4\b", "l4"),
]


def gpu_short_name(name: str | None = None) -> str:
    """Short directory name of a GPU: "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA H200" -> "h200".

    Variants with different performance keep a suffix ("h100-pcie", "h100-nvl"). Unknown names
    become a lowercase slug. Without ``name``, the current CUDA device's name ("cpu" without one).
    """
    if name is None:
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    for pat, short in _GPU_PATTERNS:
        if re.search(pat, name, flags=re.IGNORECASE):
            return short
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
    return slug or "unknown"


def git_commit(repo: Path = REPO_ROOT) -> str:
    """``git rev-parse --short HEAD`` of the repository, "-dirty" appended when tracked files changed.
    PRIMUS_TURBO_COMMIT overrides it, for a copy of the tree whose git metadata is not its own."""
    if os.environ.get("PRIMUS_TURBO_COMMIT"):
        return os.environ["PRIMUS_TURBO_COMMIT"]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
        return sha + ("-dirty" if status else "")
    except (OSError, subprocess.SubprocessError):  # no git, or not a repository
        return "unknown"


def env_info() -> dict[str, str]:
    info = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(
            gpu=p.name,
            sms=str(p.multi_processor_count),
            memory_gb=f"{p.total_memory / 2**30:.0f}",
            l2_mb=f"{l2_cache_bytes() / 2**20:.0f}",
        )
    return info


###############################################################################
# Reporting
###############################################################################


def geomean(values: Iterable[float | None]) -> float:
    """Geometric mean of the finite positive values (NaN/None/<=0 skipped); NaN when none is left."""
    logs = [math.log(v) for v in values if v is not None and isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def _fmt(v: Any, digits: int | None = None) -> str:
    """Cell text: NaN -> "NaN"; floats with ``digits`` decimals, or 6 significant digits when None."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.6g}" if digits is None else f"{v:.{digits}f}"
    return str(v)


def write_csv(path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Path:
    """Write rows (dicts) with exactly ``columns`` (missing -> empty, NaN -> "NaN"), atomically. Every
    results CSV says when and from which code it was measured: without a date or commit column
    (any case), ``Date`` (UTC) and ``Commit`` (``git_commit()``) columns are appended."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = {c.lower() for c in columns}
    stamp = {}
    if "date" not in names:
        stamp["Date"] = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    if "commit" not in names:
        stamp["Commit"] = git_commit()
    with _atomic_open(path) as f:
        w = csv.writer(f)
        w.writerow(list(columns) + list(stamp))
        for r in rows:
            w.writerow([_fmt(r.get(c)) for c in columns] + [_fmt(r.get(c, v)) for c, v in stamp.items()])
    return path


def format_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str], headers: Sequence[str] | None = None, digits: int = 2
) -> str:
    """Fixed-width text table of ``columns`` (first column left-aligned, the rest right-aligned)."""
    headers = list(headers or columns)
    cells = [[_fmt(r.get(c), digits) for c in columns] for r in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(vals):
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(vals, widths)))

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells]
    return "\n".join(out)


def plot_comparison(
    path,
    labels: Sequence[str],
    ours: Sequence[float],
    baseline: Sequence[float],
    metric: str = "Combined TFLOPS",
    title: str = "",
    ours_label: str = "Primus-Turbo",
    baseline_label: str = "torch",
    failed: Sequence[bool] | None = None,
) -> Path | None:
    """Grouped bar chart (per case: ours vs baseline) with the ratio above each pair; PNG via Agg.

    NaN values draw no bar; cases flagged in ``failed`` are marked "FAIL". Returns the path, or
    None when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib is not installed; skipping the plot")
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(labels)
    nanify = lambda v: float("nan") if v is None else float(v)
    ours = [nanify(v) for v in ours]
    baseline = [nanify(v) for v in baseline]
    failed = list(failed) if failed is not None else [False] * n

    fig, ax = plt.subplots(figsize=(max(8.0, 0.3 * n + 2.0), 6.0))
    x = list(range(n))
    w = 0.4
    ax.bar([i - w / 2 for i in x], ours, w, label=ours_label, color="#d62728")
    ax.bar([i + w / 2 for i in x], baseline, w, label=baseline_label, color="#7f7f7f")
    top = max([v for v in ours + baseline if math.isfinite(v)] or [1.0])
    for i in x:
        if failed[i]:
            ax.text(
                i, top * 0.02, "FAIL", rotation=90, ha="center", va="bottom", color="red", fontsize=8, fontweight="bold"
            )
        elif math.isfinite(ours[i]) and math.isfinite(baseline[i]) and baseline[i] > 0:
            ax.text(
                i,
                max(ours[i], baseline[i]) + top * 0.01,
                f"{ours[i] / baseline[i]:.2f}",
                rotation=90,
                ha="center",
                va="bottom",
                fontsize=6,
            )
    # Geomeans over the cases where both sides have a value and the check passed, as in the summary.
    both = [(o, b) for o, b, f in zip(ours, baseline, failed) if not f and math.isfinite(o) and math.isfinite(b)]
    g_o, g_b = geomean(o for o, _ in both), geomean(b for _, b in both)
    if math.isfinite(g_o):
        ax.axhline(g_o, color="#d62728", linestyle="--", linewidth=0.8, label=f"{ours_label} geomean {g_o:.1f}")
    if math.isfinite(g_b):
        ax.axhline(g_b, color="#7f7f7f", linestyle="--", linewidth=0.8, label=f"{baseline_label} geomean {g_b:.1f}")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(0, top * 1.3)  # headroom for the ratio labels and the legend
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", ncol=4)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@contextlib.contextmanager
def _atomic_open(path: Path):
    """Write to a temp file beside ``path``, fsync, then rename over it (readers never see half a file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; results are meant to be shared
    try:
        with os.fdopen(fd, "w", newline="") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _dir_lock(directory: Path):
    """Exclusive flock on the directory itself (no lock file left among the results)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


SUMMARY_KEYS = (
    "cases",
    "passed",
    "metric",
    "ours_geomean",
    "baseline",
    "baseline_geomean",
    "ratio_geomean",
    "ratio_min",
    "gpu",
    "date",
    "commit",
)


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def summary_entry(
    ours: Sequence[float],
    baseline_values: Sequence[float],
    passed: Sequence[bool],
    metric: str,
    baseline: str,
    gpu: str,
    **extra: Any,
) -> dict[str, Any]:
    """Build a summary entry from per-case values (one per case, in the same order).

    Geomeans and ratios use only the cases that passed and have a finite positive value on both
    sides, so ours and the baseline are averaged over the same set.
    """
    if not (len(ours) == len(baseline_values) == len(passed)):
        raise ValueError("ours, baseline_values and passed must have one value per case")
    ok = lambda v: v is not None and math.isfinite(v) and v > 0
    pairs = [(o, b) for o, b, p in zip(ours, baseline_values, passed) if p and ok(o) and ok(b)]
    ratios = [o / b for o, b in pairs]
    entry = {
        "cases": len(ours),
        "passed": int(sum(bool(p) for p in passed)),
        "metric": metric,
        "ours_geomean": geomean(o for o, _ in pairs),
        "baseline": baseline,
        "baseline_geomean": geomean(b for _, b in pairs),
        "ratio_geomean": geomean(ratios),
        "ratio_min": min(ratios) if ratios else float("nan"),
        "gpu": gpu,
        "compared": len(pairs),
    }
    entry.update(extra)
    return entry


def update_summary(results_dir, gpu_short: str, entry_name: str, entry_dict: dict[str, Any]) -> Path:
    """Set ``entry_name`` in ``<results_dir>/<gpu_short>/summary.json`` (a JSON object keyed by entry).

    Fills ``date`` (UTC, ISO 8601), ``commit`` (``git_commit()``) and ``gpu`` when absent; NaN/inf
    become null. Read-modify-write under a file lock; the file is replaced atomically.
    """
    missing = [k for k in SUMMARY_KEYS if k not in entry_dict and k not in ("gpu", "date", "commit")]
    if missing:
        raise ValueError(f"summary entry '{entry_name}' lacks {missing}")
    entry = dict(entry_dict)
    entry.setdefault("gpu", gpu_short)
    entry.setdefault("date", _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat())
    entry.setdefault("commit", git_commit())

    d = Path(results_dir) / gpu_short
    d.mkdir(parents=True, exist_ok=True)
    path = d / "summary.json"
    with _dir_lock(d):
        data: dict[str, Any] = {}
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except ValueError as e:
                data = f"unreadable ({e})"
            if not isinstance(data, dict):
                backup = path.with_name(f"summary.json.corrupt-{int(time.time())}")
                os.replace(path, backup)
                print(f"[bench] {path} was not a JSON object: {data!s:.200}; moved to {backup.name}, starting afresh")
                data = {}
        data[entry_name] = _json_safe(entry)
        with _atomic_open(path) as f:
            json.dump(dict(sorted(data.items())), f, indent=2, allow_nan=False)
            f.write("\n")
    return path


def run_stamp(gpu_short: str) -> dict[str, str]:
    """The GPU, date and commit columns every results CSV row carries."""
    return {"gpu": gpu_short, "date": _dt.date.today().isoformat(), "commit": git_commit()}


def results_dir_for(output_dir, gpu_short: str) -> Path:
    d = Path(output_dir) / gpu_short
    d.mkdir(parents=True, exist_ok=True)
    return d
