"""Cold start: seconds from a fresh Python process to the first result of each seed example, with
an empty kernel cache, so what a user waits for on a new machine is measured.

Each example (tests/pytorch/seed_examples, copied unchanged from the original library's examples
page) runs in its own interpreter with ``PRIMUS_TURBO_CACHE_DIR`` pointing at a new, empty folder:
only what the install put in place (the package's prebuilt modules, ``PRIMUS_TURBO_PREBUILD=1``)
can serve it; anything else is compiled during the run, and the child reports how many modules it
compiled and loaded. A second run in the same cache shows the warm time for comparison.

    python benchmark/e2e/bench_cold_start.py [--install-seconds S] [--output-dir benchmark/results]

Writes ``<output-dir>/<gpu>/cold_start.csv`` (example, cold_s, warm_s, compiled, loaded, ok, gpu,
date, commit); ``--install-seconds`` (timed by the caller around ``pip install``) is recorded as
an ``install`` row. Target (issue: native path): each example <= 15 s cold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmark.ops.bench_utils import (  # noqa: E402
    DEFAULT_RESULTS_DIR,
    format_table,
    gpu_short_name,
    results_dir_for,
    run_stamp,
    write_csv,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "tests" / "pytorch" / "seed_examples"
TARGET_S = 15.0

# Runs an example in this interpreter, then prints the JIT runtime's counters as one JSON line.
_CHILD = r"""
import ctypes, json, runpy, sys
runpy.run_path(sys.argv[1], run_name="__main__")
from primus_turbo._core.lib import check, lib
c, l = ctypes.c_int64(), ctypes.c_int64()
check(lib.pt_jit_stats(ctypes.byref(c), ctypes.byref(l)))
print("COLD_START_STATS " + json.dumps({"compiled": c.value, "loaded_from_disk": l.value}))
"""


def run_example(path: Path, cache_dir: str, timeout: float) -> dict:
    env = dict(os.environ, PRIMUS_TURBO_CACHE_DIR=cache_dir)
    start = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-P", "-c", _CHILD, str(path)], env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": time.perf_counter() - start, "ok": False, "error": f"timed out after {timeout:.0f} s"}
    seconds = time.perf_counter() - start
    stats = {}
    for line in p.stdout.splitlines():
        if line.startswith("COLD_START_STATS "):
            stats = json.loads(line.split(" ", 1)[1])
    out = {"seconds": seconds, "ok": p.returncode == 0, "compiled": stats.get("compiled"),
           "loaded": stats.get("loaded_from_disk")}
    if p.returncode:
        out["error"] = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", nargs="*", help="file names under tests/pytorch/seed_examples (default: all)")
    ap.add_argument("--install-seconds", type=float, help="pip install time measured by the caller")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--output-dir", default=str(DEFAULT_RESULTS_DIR))
    args = ap.parse_args()

    names = args.examples or sorted(p.name for p in EXAMPLES.glob("example_*.py"))
    gpu = gpu_short_name()
    stamp = run_stamp(gpu)
    cols = ["example", "cold_s", "warm_s", "compiled", "loaded", "ok", "within_target", "error", "gpu", "date",
            "commit"]
    out_path = results_dir_for(args.output_dir, gpu) / "cold_start.csv"
    rows = []
    if args.install_seconds is not None:
        rows.append({"example": "install", "cold_s": args.install_seconds, "ok": True})
    for name in names:
        with tempfile.TemporaryDirectory(prefix="pt_cold_") as cache:
            cold = run_example(EXAMPLES / name, cache, args.timeout)
            warm = run_example(EXAMPLES / name, cache, args.timeout) if cold["ok"] else {"seconds": None}
        row = {"example": name.removesuffix(".py"), "cold_s": cold["seconds"], "warm_s": warm["seconds"],
               "compiled": cold.get("compiled"), "loaded": cold.get("loaded"), "ok": cold["ok"],
               "within_target": cold["ok"] and cold["seconds"] <= TARGET_S, "error": cold.get("error", "")}
        rows.append(row)
        print(f"{row['example']:36s} cold {cold['seconds']:6.1f} s  warm {warm['seconds'] or float('nan'):6.1f} s  "
              f"compiled {row['compiled']}  {'OK' if cold['ok'] else 'FAIL: ' + row['error']}", flush=True)
        path = write_csv(out_path, [{**r, **stamp} for r in rows], cols)  # after each: a cut-off run keeps the rest
    rows = [{**r, **stamp} for r in rows]
    path = write_csv(out_path, rows, cols)
    print(format_table(rows, ["example", "cold_s", "warm_s", "compiled", "ok"], digits=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
