#!/usr/bin/env bash
# The README's second command: install what is missing, build, and run every test suite (unit, CLI, MPI,
# fuzz; GPU tests report as skipped on a machine without a GPU), then the Python package's
# (scripts/test_python.sh), then the unit, CLI and fuzz suites again under AddressSanitizer and
# UndefinedBehaviorSanitizer (scripts/sanitize.sh, build-asan/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OPENBLAS_NUM_THREADS=1  # ranks of the MPI and threaded tests share the cores
set +e
(cd build && ctest --output-on-failure --parallel "$(nproc)" --timeout 900)
ctest_rc=$?
set -e
bash scripts/test_python.sh
bash scripts/sanitize.sh
exit "$ctest_rc"
