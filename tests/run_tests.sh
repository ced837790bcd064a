#!/usr/bin/env bash
# The project's test command: builds and runs the C++ unit tests (CTest), installs the package
# and runs the Python tests (pytest). GPU tests skip themselves when no GPU is present; the CUTLASS
# kernel compile check runs everywhere nvcc exists. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)

echo "=== C++ unit tests"
cmake -S . -B build/tests -G Ninja -DPT_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release > build-tests-configure.log 2>&1 \
  || { cat build-tests-configure.log; exit 1; }
rm -f build-tests-configure.log
cmake --build build/tests -j "$JOBS"
(cd build/tests && ctest --output-on-failure -j "$JOBS")

echo "=== install the Python package"
python3 -m pip install -q --no-build-isolation --no-deps .

echo "=== Python tests"
# -P: import the installed package, not the source tree (which has no compiled library).
python3 -P -m pytest tests/pytorch -ra -q "$@"
