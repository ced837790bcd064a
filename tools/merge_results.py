"""Merges benchmark results made elsewhere (e.g. the RESULTS folder of tools/gpu_steps.sh) into
benchmark/results/: CSV/PNG files are copied, summary.json entries replace those of the same name.

    python3 tools/merge_results.py RESULTS_DIR [--commit SHA]

--commit records the commit the run was made at, for a run whose machine saw a copy of the working
tree without its git history (the entry's own "commit" field is then unreliable).
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmark" / "ops"))
import bench_utils as bu  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results_dir", type=Path)
    p.add_argument("--commit", default=None)
    args = p.parse_args()
    for gpu_dir in sorted(d for d in args.results_dir.iterdir() if d.is_dir()):
        dest = bu.DEFAULT_RESULTS_DIR / gpu_dir.name
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted(gpu_dir.iterdir()):
            if f.suffix in (".csv", ".png"):
                shutil.copy2(f, dest / f.name)
                print(f"copied {gpu_dir.name}/{f.name}")
        summary = gpu_dir / "summary.json"
        if summary.exists():
            for name, entry in json.loads(summary.read_text()).items():
                if args.commit:
                    entry["commit"] = args.commit
                bu.update_summary(bu.DEFAULT_RESULTS_DIR, gpu_dir.name, name, entry)
                print(f"entry {gpu_dir.name}/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
