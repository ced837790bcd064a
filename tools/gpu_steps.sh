#!/usr/bin/env bash
# Runs a list of named steps (tests, benchmarks) on a machine with a GPU after one shared setup, each
# under its own time limit, and packs what they wrote into a few files:
#
#   tools/gpu_steps.sh OUT_DIR 'name|seconds|command' ['name|seconds|command' ...]
#
#   tools/gpu_steps.sh /tmp/out \
#     'warm|300|python3 -P tools/precompile_elementwise.py -j 16' \
#     'norm|300|python3 -P -m pytest tests/pytorch/test_rmsnorm.py -q -n 8' \
#     'bench|300|python3 benchmark/ops/bench_rmsnorm.py --quick --output-dir $RESULTS'
#
# Setup: wheels in .whl/ are installed to /tmp/site (offline machines), the package is installed
# (from .carry/prebuilt/ when tools/prebuild_wheel.sh made it from these sources, else built here),
# and .carry/jitcache.tgz (a kernel cache built anywhere with the same nvcc: modules are keyed by
# content) seeds the JIT cache. Steps see $RESULTS (benchmark output dir) and run in order; one that
# fails or times out does not stop the others. OUT_DIR ends up with steps.txt (name, exit status,
# seconds), logs.tgz (each step's log and $RESULTS) and jitcache.tgz (the cache after the steps).
#
# PIP_INSTALL_ARGS adds to the install, e.g. '-C install.strip=false' keeps the libraries' symbols for a
# native profiler.
#
# Results CSVs and summary entries record the commit measured (bench_utils.git_commit): on a copy of
# the tree without its git metadata, pass it, e.g. PRIMUS_TURBO_COMMIT=$(git rev-parse --short HEAD)
# expanded where the copy is made.
set -uo pipefail
OUT=${1:?usage: tools/gpu_steps.sh OUT_DIR 'name|seconds|command' ...}
shift
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
export RESULTS=$WORK/results LOGS=$WORK/logs
mkdir -p "$RESULTS" "$LOGS"
export PYTHONUNBUFFERED=1
export PRIMUS_TURBO_CACHE_DIR=${PRIMUS_TURBO_CACHE_DIR:-/tmp/primus_turbo_cache}
SUMMARY=$OUT/steps.txt
: > "$SUMMARY"

run_step() {  # name seconds command
  local start rc
  start=$(date +%s)
  timeout --kill-after=10 "$2" bash -c "$3" > "$LOGS/$1.log" 2>&1
  rc=$?
  printf '%-24s rc=%-4s %5ss\n' "$1" "$rc" "$(( $(date +%s) - start ))" | tee -a "$SUMMARY"
  tail -n 4 "$LOGS/$1.log"
  tar czf "$OUT/logs.tgz" -C "$WORK" logs results  # after every step: a cut-off run keeps the rest
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nvcc --version | tail -1; } \
  > "$LOGS/machine.log" 2>&1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >> "$LOGS/setup.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
mkdir -p "$PRIMUS_TURBO_CACHE_DIR"
[ -f .carry/jitcache.tgz ] && tar xzf .carry/jitcache.tgz -C "$PRIMUS_TURBO_CACHE_DIR"
# A wheel from tools/prebuild_wheel.sh installs in seconds, if it was built from these very sources
# (and no install arguments ask for another build); else the package builds here.
PREBUILT=$(compgen -G ".carry/prebuilt/primus_turbo-*.whl" | head -n 1 || true)
if [ -n "$PREBUILT" ] && [ -z "${PIP_INSTALL_ARGS:-}" ] && \
   [ "$(cat .carry/prebuilt/STAMP 2>/dev/null)" = "$(bash tools/source_stamp.sh)" ]; then
  # Unusable here after all (it does not install or import): build.
  run_step install 300 "{ python3 -m pip install -q --no-deps --no-index --force-reinstall $PREBUILT && \
    python3 -P -c 'import primus_turbo.pytorch'; } || { echo 'the prebuilt wheel is unusable: building'; \
    python3 -m pip install -q --no-build-isolation --no-deps .; }"
else
  [ -n "$PREBUILT" ] && echo "the prebuilt wheel is for other sources: building" | tee -a "$LOGS/setup.log"
  run_step install 300 "python3 -m pip install -q --no-build-isolation --no-deps ${PIP_INSTALL_ARGS:-} ."
fi
# What the steps run on: torch, and whether the C++ autograd loaded (a wheel built against another
# torch falls back to the Python autograd.Functions, slower on the host).
python3 -P -c "import torch; from primus_turbo.pytorch.core import native; print('torch', torch.__version__, \
'cpp autograd', native.CPP_AUTOGRAD)" >> "$LOGS/machine.log" 2>&1

for spec in "$@"; do
  name=${spec%%|*}
  rest=${spec#*|}
  run_step "$name" "${rest%%|*}" "${rest#*|}"
done

tar czf "$OUT/logs.tgz" -C "$WORK" logs results
tar czf "$OUT/jitcache.tgz" -C "$PRIMUS_TURBO_CACHE_DIR" jit 2>/dev/null
rm -rf "$WORK"
