#!/usr/bin/env bash
# Builds the package's wheel here (incrementally, in build/) into .carry/prebuilt/ with the stamp of
# the sources it came from, so tools/gpu_steps.sh on a GPU machine installs it in seconds instead of
# building (about 90 s of device time). Needs the same CUDA and torch as the GPU machine (the libraries
# link torch by soname and the C++ autograd uses torch's C++ API). Run it after the last edit of the
# sources: a stale wheel is not used (the GPU machine builds from source then).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry/prebuilt && mkdir -p .carry/prebuilt
# Unstripped: a native sampling profiler on the GPU machine then names our functions.
python3 -m pip wheel -q --no-build-isolation --no-deps -C install.strip=false . -w .carry/prebuilt
bash tools/source_stamp.sh > .carry/prebuilt/STAMP
ls -la .carry/prebuilt
