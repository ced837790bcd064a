#!/usr/bin/env bash
# Prints a sha256 of the files a build of the package reads (sources, build files), paths included:
# a wheel built from one tree is installed elsewhere only where this matches (tools/gpu_steps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
find csrc primus_turbo CMakeLists.txt pyproject.toml -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
