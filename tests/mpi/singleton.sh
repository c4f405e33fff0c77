# `laga run` without mpirun (an MPI singleton, as root in CI): P = 1, and P > 1 as threads of the process.
#   usage: bash singleton.sh <laga> <mpiexec (unused)>
source "$(dirname "$0")/lib.bash"

# Make sure no launcher variables leak in from the environment that runs the test.
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMIX_RANK PMI_SIZE PMI_RANK

single() {
  local want=$1
  shift
  OUT=$(timeout "$HANG_TIMEOUT" "$LAGA" "$@" 2>&1)
  RC=$?
  if [ "$RC" -ne "$want" ]; then
    fail "laga $*: exit $RC, expected $want"
    show_output
  else
    pass "laga $* -> exit $RC"
  fi
}

[ "$(id -u)" -eq 0 ] && echo "(running as root)"
single 0 run --model tiny --seq 16 --check
[ "$(count '(single')" -ge 1 ] || [ "$(count 'P=1')" -eq 1 ] || fail "P = 1 run: header lacks P=1"
single 0 run --model tiny --seq 32 --sp 4 --layout a2a --form laga --check
[ "$(count 'laga run: model')" -eq 1 ] || fail "--sp 4 threads: the report is not printed exactly once"
single 0 run --model tiny --seq 32 --sp 4 --layout all_gather --form explicit --kernel eager --check
single 0 run --model small --seq 64 --sp 2 --form absorbed --check
# Bad input alone: exit 2 with the message, no thread started.
single 2 run --model tiny --seq 24 --sp 3 --layout a2a
[ "$(count 'num_attention_heads = 4 is not divisible by sp = 3')" -eq 1 ] || fail "--sp 3 a2a: message missing"
single 2 run --model tiny --seq 30 --sp 4
# --save alone and --load alone.
single 0 run --model tiny --seq 16 --save "$TMP/s1"
single 0 run --model tiny --seq 16 --sp 2 --load "$TMP/s1" --save "$TMP/s2" --check
cmp -s "$TMP/s1/x.npy" "$TMP/s2/x.npy" || fail "singleton --load/--save: x.npy differs"

finish
