# `laga run --check` under mpirun: every layout x form (and absorbed attention, LAGA recompute) x kernel on
# 4 ranks matches the single-rank explicit result; the issue's done-when command (small model, S = 256,
# laga a2a); other P; output printed once (by rank 0); --save / --load round trip.
#   usage: bash run_check.sh <laga> <mpiexec>
source "$(dirname "$0")/lib.bash"

# checked NP ARGS...: exit 0, one header, one "check passed", no FAIL row.
checked() {
  local np=$1
  shift
  local what="-np $np laga $*"
  run_mpi "$np" "$@"
  if [ "$RC" -ne 0 ]; then
    fail "$what: exit code $RC"
    show_output 60
  elif [ "$(count 'laga run: model')" -ne 1 ] || [ "$(count 'check passed')" -ne 1 ] || [ "$(count 'FAIL')" -ne 0 ]; then
    fail "$what: expected the report once (rank 0 only): $(count 'laga run: model') headers, $(count 'check passed') verdicts"
    show_output 60
  else
    pass "$what"
  fi
}

# Every variant on 4 ranks, tiny model, S = 64, batch 2.
for layout in a2a all_gather; do
  for variant in "explicit" "absorbed --absorbed-attention mqa" "absorbed --absorbed-attention expanded" \
                 "laga" "laga --recompute kv"; do
    for kernel in eager fused; do
      # shellcheck disable=SC2086
      checked 4 run --model tiny --seq 64 --batch 2 --layout "$layout" --kernel "$kernel" --form $variant --check
    done
  done
done

# The done-when command of the issue, with the report checked for its content.
checked 4 run --model small --seq 256 --layout a2a --form laga --check --verbose
for row in "forward   all_to_all      q" "forward   all_gather      kv_latent" "backward  reduce_scatter  kv_latent" \
           "latent_gathered" "FLOPs and time by phase on rank 0" "P=4 (mpi)"; do
  [ "$(count "$row")" -eq 1 ] || fail "small laga a2a --verbose: '$row' appears $(count "$row") times, expected once"
done
# The rank table has one row per rank.
[ "$(grep -cE '^[0-3] +[0-9.]+ (B|KiB|MiB)' <<<"$OUT")" -eq 4 ] || { fail "small laga a2a: expected 4 rank rows"; show_output 20; }

# Other P: 2 and 8 ranks (small has 8 heads), and P = 3 in the all_gather layout (heads need not divide).
checked 2 run --model small --seq 256 --layout a2a --form laga --check
checked 8 run --model small --seq 256 --layout a2a --form laga --kernel eager --check
checked 3 run --model tiny --seq 24 --layout all_gather --form laga --check
checked 3 run --model tiny --seq 24 --layout all_gather --form explicit --check
# The ring (p2p): explicit and laga, fused, at 2, 4 and 8 ranks.
checked 2 run --model small --seq 256 --layout p2p --form laga --check
checked 4 run --model tiny --seq 64 --batch 2 --layout p2p --form explicit --check
checked 8 run --model tiny --seq 64 --layout p2p --form laga --check
# float64 on MPI.
checked 4 run --model tiny --seq 32 --dtype float64 --layout all_gather --form absorbed --check

# --save / --load round trip under mpirun.
D1=$TMP/saved D2=$TMP/reloaded D3=$TMP/reloaded_p2
run_mpi 4 run --model tiny --seq 32 --batch 2 --form laga --seed 5 --save "$D1"
if [ "$RC" -ne 0 ] || [ "$(count 'saved x, dy, weights')" -ne 1 ]; then
  fail "--save under mpirun: exit $RC, $(count 'saved x, dy, weights') save notices"
  show_output
fi
for f in x dy y dx q_a_proj q_a_layernorm q_b_proj kv_a_proj_with_mqa kv_a_layernorm kv_b_proj o_proj grad_kv_b_proj grad_o_proj; do
  [ -s "$D1/$f.npy" ] || fail "--save did not write $f.npy"
done
# Loading what was saved reproduces it bit for bit (same P, same form), and passes --check.
checked 4 run --model tiny --seq 32 --batch 2 --form laga --load "$D1" --save "$D2" --check
for f in x dy y dx kv_b_proj grad_kv_b_proj grad_kv_a_proj_with_mqa grad_o_proj; do
  cmp -s "$D1/$f.npy" "$D2/$f.npy" || fail "--load/--save round trip: $f.npy differs"
done
# Another P, layout and form on the loaded problem: within tolerance of the reference.
checked 2 run --model tiny --seq 32 --batch 2 --form explicit --layout all_gather --load "$D1" --save "$D3" --check
cmp -s "$D1/x.npy" "$D3/x.npy" || fail "--load at P = 2: x.npy differs"
# The ring's token map (rank r holds chunks r and 2P-1-r) loads and saves the same whole sequence.
D4=$TMP/reloaded_ring
checked 4 run --model tiny --seq 32 --batch 2 --form laga --layout p2p --load "$D1" --save "$D4" --check
cmp -s "$D1/x.npy" "$D4/x.npy" || fail "--load/--save in p2p: x.npy differs"
cmp -s "$D1/dy.npy" "$D4/dy.npy" || fail "--load/--save in p2p: dy.npy differs"
[ "$FAILURES" -eq 0 ] && pass "--save / --load round trip (bit-identical at the same P and form)"

finish
