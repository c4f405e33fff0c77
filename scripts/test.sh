#!/usr/bin/env bash
# The README's second command: install what is missing, build, and run every test suite (unit, CLI, MPI,
# fuzz; GPU tests report as skipped on a machine without a GPU), then the Python package's
# (scripts/test_python.sh), then the unit, CLI and fuzz suites again under AddressSanitizer and
# UndefinedBehaviorSanitizer (scripts/sanitize.sh, build-asan/).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's wall time is printed as it ends, so a slow suite shows where its time goes.
stage() {
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  echo "test.sh: $name took $((SECONDS - t0)) s (exit $rc)"
  return "$rc"
}
stage "build" bash scripts/build.sh
export OPENBLAS_NUM_THREADS=1  # ranks of the MPI and threaded tests share the cores
ctest_rc=0
(cd build && stage "ctest" ctest --output-on-failure --parallel "$(nproc)" --timeout 900) || ctest_rc=$?
stage "python package" bash scripts/test_python.sh
stage "sanitizers" bash scripts/sanitize.sh
echo "test.sh: all stages took $SECONDS s"
exit "$ctest_rc"
