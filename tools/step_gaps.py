"""Where the GPU waits for the host in a training step of the end-to-end benchmark's model: the
forward+backward timed as bench_train_step.py times it (from an idle GPU, after a synchronize),
under torch.profiler, then the idle gaps between consecutive kernels summed by the kernel that
ended each gap (the one whose launch came late) and by the CPU op that was running when it was
launched.

    python tools/step_gaps.py --arch dense --variant turbo_fp8_tensorwise --optimizer turbo \\
        --fp8-weight-cache all

Idle time = step wall time - kernel time; "before the first kernel" is the host's start-up of the
step (Python, the first op's checks and launch) that no queued work hides.
"""

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_train_step_host import add_step_arguments, make_step  # noqa: E402


def launching_op(cpu_ops, t_us):
    """The innermost CPU op (by start time) running at t_us: [start, end, name] sorted by start."""
    best = None
    for start, end, name in cpu_ops:
        if start > t_us:
            break
        if end >= t_us and (best is None or start >= best[0]):
            best = (start, name)
    return best[1] if best else "(none)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(p, "dense", "turbo_fp8_tensorwise")
    p.add_argument("--steps", type=int, default=3, help="profiled steps (after three warm-up steps)")
    p.add_argument("--min-gap-us", type=float, default=5.0, help="gaps shorter than this are not attributed")
    p.add_argument("--rows", type=int, default=15)
    p.add_argument("--largest", type=int, default=8, help="the largest gaps listed one by one")
    p.add_argument("--trace", default=None, help="also write the profile as a gzipped Chrome trace (.json.gz)")
    args = p.parse_args()
    fwd_bwd, optimizer_step = make_step(args)
    for _ in range(3):
        fwd_bwd()
        optimizer_step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(args.steps):
            torch.cuda.synchronize()
            with record_function(f"timed_step_{i}"):
                fwd_bwd()
                torch.cuda.synchronize()
            optimizer_step()
        torch.cuda.synchronize()
    if args.trace:
        import gzip
        import shutil
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
            prof.export_chrome_trace(tmp.name)
            with open(tmp.name, "rb") as src, gzip.open(args.trace, "wb") as dst:
                shutil.copyfileobj(src, dst)
    events = prof.events()
    steps = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.name.startswith("timed_step_") and e.device_type == torch.autograd.DeviceType.CPU)
    # GPU-side copies of record_function ranges ("gpu_user_annotation") are not kernels.
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                     if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("timed_step_"))
    cpu_ops = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                     if e.device_type == torch.autograd.DeviceType.CPU and not e.name.startswith(("timed_step_", "cuda")))
    by_next, by_op, counts, totals = (collections.Counter() for _ in range(4))
    largest = []  # (gap us, previous kernel, next kernel, CPU ops that started during the gap)
    for s0, s1 in steps:
        ks = [k for k in kernels if s0 <= k[0] <= s1]
        if not ks:
            continue
        wall = s1 - s0
        busy = sum(k[1] - k[0] for k in ks)  # kernels of one stream do not overlap here
        totals["wall"] += wall
        totals["busy"] += busy
        totals["before first kernel"] += ks[0][0] - s0
        totals["after last kernel"] += s1 - ks[-1][1]
        end, prev = ks[0][1], ks[0][2]
        for k in ks[1:]:
            gap = k[0] - end
            if gap >= args.min_gap_us:
                name = k[2][:90]
                by_next[name] += gap
                counts[name] += 1
                by_op[launching_op(cpu_ops, k[0] - 1.0)[:90]] += gap
                totals["gaps"] += gap
                # What the host did meanwhile: the ops that started in the gap, by their total time.
                during = collections.Counter()
                for o in cpu_ops:
                    if end <= o[0] < k[0]:
                        during[o[2]] += o[1] - o[0]
                largest.append((gap, prev[:60], name[:60],
                                ", ".join(f"{op[:48]} {us:.0f}us" for op, us in during.most_common(8))))
            end, prev = max(end, k[1]), k[2]
    n = max(len(steps), 1)
    print(f"per step: wall {totals['wall'] / n / 1e3:.2f} ms, kernels {totals['busy'] / n / 1e3:.2f} ms, "
          f"idle before the first kernel {totals['before first kernel'] / n:.0f} us, after the last "
          f"{totals['after last kernel'] / n:.0f} us, gaps >= {args.min_gap_us:g} us {totals['gaps'] / n:.0f} us")
    print("gaps by the kernel that ended them (us per step, count per step):")
    for name, us in by_next.most_common(args.rows):
        print(f"  {us / n:8.0f} {counts[name] / n:5.1f}  {name}")
    print("gaps by the CPU op running just before that kernel started (us per step):")
    for name, us in by_op.most_common(args.rows):
        print(f"  {us / n:8.0f}  {name}")
    print("the largest gaps (us: previous kernel -> next kernel; CPU ops that started in the gap, by time):")
    for gap, before, after, during in sorted(largest, reverse=True)[:args.largest]:
        print(f"  {gap:8.0f}: {before} -> {after}; {during}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
