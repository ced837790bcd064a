"""Stacked bars of an end-to-end CSV: GPU time per step by kernel family, per variant, with the
step's wall time marked (the gap is time the GPU sat idle).

    python benchmark/e2e/plot_breakdown.py benchmark/results/h100/e2e_dense.csv   # -> e2e_dense.png
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

FAMILIES = ("gemm", "attention", "quantization", "norm/activation", "moe routing", "other")


def plot(csv_path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[e2e] matplotlib is not installed; skipping the plot")
        return None
    rows = [r for r in csv.DictReader(open(csv_path)) if r.get("step_ms")]
    if not rows:
        return None
    families = [f for f in FAMILIES if any(r.get(f"{f}_ms") for r in rows)]
    labels = [r["variant"] for r in rows]
    fig, ax = plt.subplots(figsize=(1.3 * len(rows) + 5, 4.5))
    bottom = [0.0] * len(rows)
    for fam in families:
        vals = [float(r.get(f"{fam}_ms") or 0.0) for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=fam)
        bottom = [b + v for b, v in zip(bottom, vals)]
    walls = [float(r["step_ms"]) for r in rows]
    ax.scatter(labels, walls, color="black", marker="_", s=600, zorder=3, label="step wall time")
    for i, r in enumerate(rows):
        speedup = r.get("speedup_vs_torch_eager")
        if speedup:
            ax.annotate(f"{float(speedup):.2f}x", (i, walls[i]), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize=8)
    ax.set_ylabel("ms per training step (forward + backward)")
    first = rows[0]
    ax.set_title(f"{first['model']}, {first['layers']} layers, {int(first['batch']) * int(first['seq'])} tokens "
                 f"on {first.get('gpu', '')}: GPU time by kernel family")
    ax.tick_params(axis="x", labelrotation=25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    out = csv_path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(plot(Path(arg)))
