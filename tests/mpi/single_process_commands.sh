#!/usr/bin/env bash
# demo, plan and bench are one-process commands: under mpirun they report once (rank 0), not once per rank.
source "$(dirname "$0")/lib.bash"

run_mpi 3 plan --model tiny --seq 64 --sp 2 --dtype float32
[ "$RC" -eq 0 ] || fail "plan under mpirun exited $RC"
n=$(count "tiny: S=64")
[ "$n" -eq 1 ] && pass "plan under mpirun -np 3 prints its table once" || { fail "plan printed its header $n times"; show_output; }

run_mpi 2 plan --model tiny --seq 63 --sp 2
[ "$RC" -ne 0 ] && [ "$RC" -ne 124 ] && pass "bad plan input under mpirun fails (exit $RC)" || fail "bad plan input exited $RC"

finish
