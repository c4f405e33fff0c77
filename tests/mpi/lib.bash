# Helpers shared by the tests/mpi/*.sh scripts (sourced, not run: the name does not end in .sh, so CMake
# does not register it as a test). Each script is run as `bash script.sh <laga> <mpiexec>`.
set -u
LAGA=${1:?usage: bash script.sh <path to laga> [mpiexec]}
MPIEXEC=${2:-mpirun}
[ -n "$MPIEXEC" ] || MPIEXEC=mpirun
export OPENBLAS_NUM_THREADS=1
# As in CI: root, 2 cores. -x passes the variable to every rank whatever the launcher does by default.
MPIRUN=("$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS)
HANG_TIMEOUT=${LAGA_MPI_TIMEOUT:-60}
FAILURES=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

fail() {
  echo "FAIL: $*"
  FAILURES=$((FAILURES + 1))
}
pass() { echo "ok:   $*"; }

# run_mpi NP ARGS...: runs `laga ARGS` on NP ranks under a timeout; sets RC and OUT (stdout and stderr).
run_mpi() {
  local np=$1
  shift
  OUT=$(timeout "$HANG_TIMEOUT" "${MPIRUN[@]}" -np "$np" "$LAGA" "$@" 2>&1)
  RC=$?
}

# count PATTERN: lines of OUT that contain the fixed string PATTERN.
count() { grep -cF -- "$1" <<<"$OUT"; }

show_output() { sed 's/^/    | /' <<<"$OUT" | head -n "${1:-40}"; }

finish() {
  if [ "$FAILURES" -ne 0 ]; then
    echo "$FAILURES check(s) failed"
    exit 1
  fi
  echo "all checks passed"
  exit 0
}
