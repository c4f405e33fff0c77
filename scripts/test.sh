#!/usr/bin/env bash
# The README's second command: install what is missing, build, and run every test suite (unit, CLI, MPI;
# GPU tests report as skipped on a machine without a GPU), then the Python package's
# (scripts/test_python.sh), then the unit, fuzz and CLI suites under AddressSanitizer and
# UndefinedBehaviorSanitizer (scripts/sanitize.sh, build-asan/; the fuzz suite runs there only).
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
stage "dependencies" bash scripts/install_deps.sh
# The Python environment's download (PyTorch, ~1 minute of network) runs beside the C++ build.
mkdir -p build
bash scripts/python_env.sh >build/python_env.log 2>&1 &
python_env=$!
stage "build" bash scripts/build.sh
export OPENBLAS_NUM_THREADS=1  # ranks of the MPI and threaded tests share the cores
ctest_rc=0
# The fuzz suite runs once, under the sanitizers below, where it also catches memory errors.
(cd build && stage "ctest" ctest --output-on-failure --parallel "$(nproc)" --timeout 900 -LE '^fuzz$') || ctest_rc=$?
wait "$python_env" || { echo "test.sh: the Python environment failed to install:"; tail -20 build/python_env.log; }
stage "python package" bash scripts/test_python.sh
stage "sanitizers" bash scripts/sanitize.sh
echo "test.sh: all stages took $SECONDS s"
exit "$ctest_rc"
