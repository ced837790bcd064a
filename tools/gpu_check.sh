#!/usr/bin/env bash
# One command that validates a change on a machine with a GPU: install, warm the JIT kernel cache,
# run the test suite (GPU tests included) and the benchmarks, leaving logs and results in OUT_DIR.
#
#   tools/gpu_check.sh OUT_DIR [fast|tests|bench|all] [extra pytest args...]
#
# fast (the default): the fast test tier (every test function once, its first parametrization;
# long sweeps left to the full tier) and compute-sanitizer memcheck over one small case per op
# family (tools/sanitize_cases.py), in a few minutes. tests: the full sweep. all: tests + bench.
# PRECOMPILE=0 skips warming the GEMM kernels (when only other operators' tests are selected).
#
# Offline machines: wheels placed in .whl/ are installed first; a JIT cache tarball placed at
# .carry/jitcache.tgz seeds the kernel cache (kernels are keyed by content, so a cache built on
# another machine with the same compiler is reused as is).
set -uo pipefail
OUT=${1:?usage: tools/gpu_check.sh OUT_DIR [fast|tests|bench|all]}
MODE=${2:-fast}
shift $(( $# >= 2 ? 2 : 1 ))
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/run.log"
export PYTHONUNBUFFERED=1
export PRIMUS_TURBO_CACHE_DIR=${PRIMUS_TURBO_CACHE_DIR:-/tmp/primus_turbo_cache}
JOBS=$(nproc)
step() { echo "=== $* ($(date +%T))" | tee -a "$LOG"; }
status=0

step "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvcc --version | tail -2;
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'; } >> "$LOG" 2>&1

if compgen -G ".whl/*.whl" > /dev/null; then
  step "install carried wheels"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >> "$LOG" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -f .carry/jitcache.tgz ]; then
  mkdir -p "$PRIMUS_TURBO_CACHE_DIR" && tar xzf .carry/jitcache.tgz -C "$PRIMUS_TURBO_CACHE_DIR"
fi

step "install"
python3 -m pip install -q --no-build-isolation --no-deps . >> "$LOG" 2>&1 || { echo "install failed" | tee -a "$LOG"; exit 1; }

step "warm the kernel cache"
precompile() { python3 -P -m primus_turbo.precompile -j "$JOBS" "$@" >> "$LOG" 2>&1 || status=1; }
if [ "${PRECOMPILE:-1}" = 1 ] && { [ "$MODE" = all ] || [ "$MODE" = tests ]; }; then
  # What the tests force: the default configs of every layout, and fp32 output for main_grad.
  precompile --dtype bf16 fp16 --configs 0 3
  precompile --dtype bf16 --out-dtype fp32 --layouts AkBn AmBn --configs 0 3
fi
if [ "${PRECOMPILE:-1}" = 1 ] && { [ "$MODE" = all ] || [ "$MODE" = bench ]; }; then
  # Every autotune candidate of the forward, dgrad and wgrad layouts.
  precompile --dtype ${BENCH_DTYPES:-bf16 fp16} --layouts AkBk AkBn AmBn
fi
tar czf "$OUT/jitcache.tgz" -C "$PRIMUS_TURBO_CACHE_DIR" jit 2>/dev/null

if [ "$MODE" = fast ]; then
  step "fast test tier"
  python3 -P -m pytest tests/pytorch --tier fast -ra -q -p no:cacheprovider -n "${PYTEST_WORKERS:-8}" "$@" \
    > "$OUT/pytest.log" 2>&1 || status=1
  tail -n 30 "$OUT/pytest.log" | tee -a "$LOG"
  step "compute-sanitizer memcheck, one small case per op family"
  compute-sanitizer --tool memcheck --error-exitcode 1 python3 -P tools/sanitize_cases.py \
    > "$OUT/sanitizer.log" 2>&1 || status=1
  tail -n 12 "$OUT/sanitizer.log" | tee -a "$LOG"
fi

if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  step "tests"
  python3 -P -m pytest tests/pytorch -ra -q -p no:cacheprovider "$@" > "$OUT/pytest.log" 2>&1 || status=1
  tail -n 30 "$OUT/pytest.log" | tee -a "$LOG"
fi

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  step "benchmarks"
  # The headline entries (gemm_<dtype>) are measured with autotune on: the recommended setting.
  # BENCH_RUNS splits the work into several invocations (';'-separated argument lists), e.g. model
  # subsets that each fit a time limit; their CSVs combine with bench_gemm.py --merge.
  IFS=';' read -ra runs <<< "${BENCH_RUNS:-$(for d in ${BENCH_DTYPES:-bf16 fp16}; do printf -- '--dtype %s --tag= ;' "$d"; done)}"
  for run in "${runs[@]}"; do
    [ -n "${run// }" ] || continue
    # shellcheck disable=SC2086
    python3 benchmark/ops/bench_gemm.py --autotune --output-dir "$OUT/results" $run >> "$OUT/bench.log" 2>&1 || status=1
  done
  tail -n 40 "$OUT/bench.log" | tee -a "$LOG"
  tar czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$OUT/results"
fi

step "done (status $status)"
exit $status
