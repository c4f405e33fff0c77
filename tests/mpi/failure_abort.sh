# A failure on one rank after collectives began ends every rank (MpiSession::abort) instead of hanging:
# LAGA_TEST_FAIL_RANK=r makes rank r throw after the block's collectives while the others wait in the next
# one. Also the in-process thread ranks (--sp without mpirun).   usage: bash failure_abort.sh <laga> <mpiexec>
source "$(dirname "$0")/lib.bash"

for r in 0 3; do
  OUT=$(LAGA_TEST_FAIL_RANK=$r timeout "$HANG_TIMEOUT" "${MPIRUN[@]}" -x LAGA_TEST_FAIL_RANK -np 4 "$LAGA" run \
        --model tiny --seq 32 --check 2>&1)
  RC=$?
  if [ "$RC" -eq 124 ]; then
    fail "failure on rank $r of 4: hang (no exit within ${HANG_TIMEOUT}s)"
  elif [ "$RC" -ne 3 ]; then
    fail "failure on rank $r of 4: exit code $RC, expected 3"
    show_output
  elif [ "$(count "laga: failure on rank $r of 4: failure injected")" -ne 1 ] || [ "$(count 'laga: failure on rank')" -ne 1 ]; then
    fail "failure on rank $r of 4: expected one message from rank $r"
    show_output
  elif [ "$(count 'check passed')" -ne 0 ]; then
    fail "failure on rank $r of 4: a verdict was printed"
  else
    pass "failure on rank $r of 4 -> every rank ended, exit 3"
  fi
done

# Without the hook the same command passes (the hook is off by default).
run_mpi 4 run --model tiny --seq 32 --check
[ "$RC" -eq 0 ] && pass "without LAGA_TEST_FAIL_RANK the run passes" || { fail "plain run: exit $RC"; show_output; }

# Thread ranks: a failing thread ends the process rather than leaving the others at a barrier.
OUT=$(LAGA_TEST_FAIL_RANK=1 timeout "$HANG_TIMEOUT" "$LAGA" run --model tiny --seq 32 --sp 4 --check 2>&1)
RC=$?
if [ "$RC" -eq 3 ] && [ "$(count 'laga: failure on rank 1 of 4 (thread)')" -eq 1 ]; then
  pass "failure on thread rank 1 of 4 -> exit 3"
else
  fail "failure on thread rank 1 of 4: exit $RC"
  show_output
fi

finish
