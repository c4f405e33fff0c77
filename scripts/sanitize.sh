#!/usr/bin/env bash
# The unit, CLI and fuzz suites under AddressSanitizer and UndefinedBehaviorSanitizer (every report is an
# error: -fno-sanitize-recover=all), CPU only, in build-asan/: an -O1 build of laga and the unit tests.
# scripts/test.sh runs it after the main suites.   usage: bash scripts/sanitize.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -g1: line tables for the reports' stack traces, without the full debug information's compile time.
flags="-O1 -g1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLAGA_WITH_CUDA=OFF "${launcher[@]}" \
  "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" >/dev/null
ninja -C build-asan -j "$(nproc)" laga laga_unit_tests
export OPENBLAS_NUM_THREADS=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LAGA_TIME_SCALE=10  # time bounds of the CLI tests, for a build several times slower
cd build-asan
# The unit tests with leak detection; the CLI without: every laga process starts MPI, whose plugins are
# unloaded at exit, so their allocations cannot be told from the program's. The CLI suites that repeat whole
# runs the unit tests already cover under the sanitizers (threads, reruns, the bench sweep, the docs, the
# demo), and the tests of the scripts alone (scripts/gpu.sh, the wording of the tracked files), are left to the
# main suite.
ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
  ctest --output-on-failure --parallel "$(nproc)" --timeout 900 -L '^unit$' "$@"
ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 \
  ctest --output-on-failure --parallel "$(nproc)" --timeout 900 -L '^(cli|fuzz)$' \
  -E '^cli\.(run_threads|bitwise_rerun|bench|docs_fresh|demo|scripts_gpu|project_wording)$' "$@"
