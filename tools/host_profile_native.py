"""Where an op call's host time goes, native frames included: runs each named case of the
host-overhead benchmark in a loop under a sampling profiler (py-spy --native, attached after
warm-up) and splits the samples of each phase into kernel launches, allocations, tensor frees,
Python, our C++ and the rest (torch's dispatcher, boxing, autograd node).

    pip install py-spy        # and an unstripped build: pip install -C install.strip=false .
    python tools/host_profile_native.py --ops gemm_fp8_rowwise,layernorm [--secs 3] [--rate 200]
    python tools/host_profile_native.py --analyze raw.txt              # a profile taken before

Forward phases only are meaningful: a backward runs on autograd's device thread, outside the
phase's stack. The profiler slows every call about 5x; read shares, not microseconds.
"""

import argparse
import collections
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = ("launch", "alloc", "free", "python", "ours")


def categorize(raw_path):
    """phase -> Counter of samples per category (and "total") from py-spy's raw (collapsed) output."""
    phases = collections.defaultdict(collections.Counter)
    for line in open(raw_path):
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        starts = [i for i, f in enumerate(frames) if f.startswith("phase_")]
        if not starts or starts[0] + 1 >= len(frames):
            continue
        name, sub, n = frames[starts[0]].split(" ")[0][len("phase_"):], frames[starts[0] + 1:], int(n)
        c = phases[name]
        c["total"] += n
        joined = ";".join(sub)
        if re.search(r"cudaLaunchKernel|cuLaunchKernel", joined):
            c["launch"] += n
        elif re.search(r"empty_strided", joined):
            c["alloc"] += n
        if re.search(r"TensorImpl::~TensorImpl|THPVariable_dealloc", joined):
            c["free"] += n
        if ".py:" in sub[-1]:
            c["python"] += n
        elif re.search(r"\((libprimus_turbo[^)]*|module)\.so\)", sub[-1]):
            c["ours"] += n
    return phases


def report(phases) -> None:
    print(f"{'phase':40s} {'samples':>7s} " + " ".join(f"{c:>7s}" for c in CATEGORIES) + "    rest")
    for name, c in phases.items():
        shares = [100.0 * c[k] / c["total"] for k in CATEGORIES]
        print(f"{name:40s} {c['total']:7d} " + " ".join(f"{v:6.1f}%" for v in shares) + f" {100 - sum(shares):6.1f}%")


def run_phases(ops, secs, ready, go) -> None:
    """The profiled process: warm every case, signal, wait for the profiler, loop each phase."""
    import torch

    import primus_turbo.pytorch as turbo

    spec = importlib.util.spec_from_file_location("bho", ROOT / "benchmark" / "ops" / "bench_host_overhead.py")
    bho = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bho)
    cases = bho._cases(turbo)
    body = ("def {n}(fn, secs):\n    end, k = time.perf_counter() + secs, 0\n    while time.perf_counter() < end:\n"
            "        for _ in range(50):\n            fn()\n        torch.cuda.synchronize()\n        k += 50\n    return k\n")
    phases = []
    for name in ops:
        for which, idx in (("fwd", 0), ("step", 2)):
            fn = cases[name][idx]
            for _ in range(30):
                fn()
            scope = {"time": time, "torch": torch}
            exec(body.format(n=f"phase_{name}_{which}"), scope)  # a named frame per phase in every sample
            phases.append((f"phase_{name}_{which}", scope[f"phase_{name}_{which}"], fn))
    torch.cuda.synchronize()
    Path(ready).write_text(str(os.getpid()))
    while not os.path.exists(go):
        time.sleep(0.05)
    time.sleep(1.0)
    for name, phase, fn in phases:
        print(f"{name}: {phase(fn, secs)} calls", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help="comma-separated case names of bench_host_overhead.py")
    p.add_argument("--secs", type=float, default=3.0)
    p.add_argument("--rate", type=int, default=200, help="samples per second (native unwinding is slow)")
    p.add_argument("--analyze", help="a raw profile to categorize instead of running")
    p.add_argument("--raw", default=None, help="where to keep the raw profile")
    p.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        return run_phases(args.ops.split(","), args.secs, *args._child)
    if args.analyze:
        return report(categorize(args.analyze))
    tmp = Path(tempfile.mkdtemp())
    raw = Path(args.raw) if args.raw else tmp / "raw.txt"
    ready, go = tmp / "ready", tmp / "go"
    child = subprocess.Popen([sys.executable, __file__, "--ops", args.ops, "--secs", str(args.secs),
                              "--_child", str(ready), str(go)])
    while not ready.exists():
        if child.poll() is not None:
            raise SystemExit("the profiled process ended before it was ready")
        time.sleep(0.2)
    spy = subprocess.Popen(["py-spy", "record", "--native", "-r", str(args.rate), "-f", "raw", "-o", str(raw),
                            "--pid", str(child.pid)])
    time.sleep(3.0)
    go.write_text("")
    child.wait()
    spy.wait()
    report(categorize(raw))


if __name__ == "__main__":
    main()
