#!/usr/bin/env bash
# `laga run --sp 4` without mpirun: 4 ranks as threads of one process. Every form (absorbed mqa/expanded,
# laga with and without K/V recomputation), layout and kernel passes --check; --check can fail; --save
# writes the documented .npy files and --load reads them back; bad --sp/--seq exit 2 naming the value.
# Usage: bash run_threads.sh <path-to-laga>
set -u
LAGA=${1:?usage: run_threads.sh <path-to-laga>}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# run_expect CODE DESCRIPTION ARGS...: `laga run ARGS` exits with CODE (stdout in $TMP/out, stderr in $TMP/err).
run_expect() {
  local want=$1 what=$2
  shift 2
  local rc=0
  "$LAGA" run "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$what: 'laga run $*' exit code $rc, expected $want
--- stdout (tail)
$(tail -n 15 "$TMP/out")
--- stderr
$(cat "$TMP/err")"
    return 1
  fi
  return 0
}

BASE=(--sp 4 --seq 64 --model tiny)

# Every form and variant, both layouts, both kernels: the check against the single-rank explicit result passes.
for layout in a2a all_gather; do
  for variant in "explicit" "absorbed --absorbed-attention mqa" "absorbed --absorbed-attention expanded" \
                 "laga" "laga --recompute kv"; do
    for kernel in fused eager; do
      # shellcheck disable=SC2086
      set -- --form $variant
      if run_expect 0 "$variant / $layout / $kernel" "${BASE[@]}" "$@" --layout "$layout" --kernel "$kernel" --check; then
        grep -q "check passed" "$TMP/out" || fail "$variant / $layout / $kernel: no 'check passed' in the output"
        grep -q "P=4" "$TMP/out" || fail "$variant / $layout / $kernel: the run does not report P=4"
        grep -qE "layout $layout" "$TMP/out" || fail "$variant / $layout / $kernel: the run does not report layout $layout"
      fi
    done
  done
done
# float64 checks against a 1e-10 bound.
run_expect 0 "laga float64" "${BASE[@]}" --form laga --dtype float64 --check && \
  { grep -q "check passed" "$TMP/out" || fail "laga float64: no 'check passed'"; }

# --check is not vacuous: an impossible tolerance fails with exit code 1.
run_expect 1 "--check with tolerance 1e-30" "${BASE[@]}" --form laga --check --tolerance 1e-30 && \
  { grep -q "check FAILED" "$TMP/out" || fail "tolerance 1e-30: no 'check FAILED' in the output"; }

# a2a needs n_h (4 in tiny) divisible by P; all_gather does not.
run_expect 2 "a2a with 8 ranks and 4 heads" --sp 8 --seq 64 --model tiny --layout a2a && {
  grep -qF "num_attention_heads = 4" "$TMP/err" || fail "a2a P=8: stderr does not name num_attention_heads = 4: $(cat "$TMP/err")"
  grep -qF "sp = 8" "$TMP/err" || fail "a2a P=8: stderr does not name sp = 8: $(cat "$TMP/err")"
}
run_expect 0 "all_gather with 8 ranks and 4 heads" --sp 8 --seq 64 --model tiny --layout all_gather --check

# --save DIR: inputs, weights, output and gradients as .npy ([batch, seq, hidden]; weights nn.Linear's [out, in]).
SAVE=$TMP/saved
if run_expect 0 "--save" "${BASE[@]}" --batch 2 --form laga --seed 5 --save "$SAVE"; then
  for name in x dy y dx q_a_proj q_a_layernorm q_b_proj kv_a_proj_with_mqa kv_a_layernorm kv_b_proj o_proj; do
    [ -s "$SAVE/$name.npy" ] || fail "--save did not write $name.npy"
    case $name in x | dy | y | dx) ;; *) [ -s "$SAVE/grad_$name.npy" ] || fail "--save did not write grad_$name.npy" ;; esac
  done
  for name in x dy y dx; do
    head -c 128 "$SAVE/$name.npy" | grep -qF "'shape': (2, 64, 32)" ||
      fail "$name.npy is not [batch, seq, hidden] = (2, 64, 32): $(head -c 128 "$SAVE/$name.npy" | tr -d '\0')"
  done
  # tiny: d = 32, r_q = 16, n_h x (d_n + d_r) = 64, r_kv + d_r = 24, n_h x (d_n + d_v) = 64, n_h x d_v = 32.
  for spec in "q_a_proj:(16, 32)" "q_a_layernorm:(16,)" "q_b_proj:(64, 16)" "kv_a_proj_with_mqa:(24, 32)" \
              "kv_a_layernorm:(16,)" "kv_b_proj:(64, 16)" "o_proj:(32, 32)"; do
    name=${spec%%:*} shape=${spec#*:}
    for f in "$name" "grad_$name"; do
      head -c 128 "$SAVE/$f.npy" | grep -qF "'shape': $shape" ||
        fail "$f.npy does not have shape $shape: $(head -c 128 "$SAVE/$f.npy" | tr -d '\0')"
    done
  done

  # --load DIR --check: the saved problem passes the check, for another form and layout too.
  run_expect 0 "--load --check (laga a2a)" "${BASE[@]}" --batch 2 --form laga --load "$SAVE" --check &&
    { grep -q "check passed" "$TMP/out" || fail "--load --check: no 'check passed'"; }
  run_expect 0 "--load --check (absorbed all_gather)" "${BASE[@]}" --batch 2 --form absorbed --layout all_gather \
    --load "$SAVE" --check

  # --load really reads the files: with another seed, the same form reproduces the saved y and gradients
  # bit for bit (the deterministic data of seed 99 would give others).
  RESAVE=$TMP/resaved
  if run_expect 0 "--load --save with another seed" "${BASE[@]}" --batch 2 --form laga --seed 99 --load "$SAVE" \
      --save "$RESAVE"; then
    for name in x y dx grad_o_proj grad_kv_b_proj grad_q_a_proj; do
      cmp -s "$SAVE/$name.npy" "$RESAVE/$name.npy" || fail "--load with --seed 99: $name.npy differs from the loaded problem's"
    done
  fi
  run_expect 0 "seed 99 without --load" "${BASE[@]}" --batch 2 --form laga --seed 99 --save "$TMP/seed99" &&
    { cmp -s "$SAVE/y.npy" "$TMP/seed99/y.npy" && fail "seeds 5 and 99 gave the same y.npy: the comparison above proves nothing"; }

  # A weight file of the wrong shape is invalid input that names the file.
  cp -r "$SAVE" "$TMP/broken"
  cp "$SAVE/kv_b_proj.npy" "$TMP/broken/o_proj.npy"
  run_expect 2 "--load with a wrong-shaped o_proj.npy" "${BASE[@]}" --batch 2 --load "$TMP/broken" &&
    { grep -qF "o_proj.npy" "$TMP/err" || fail "wrong-shaped o_proj.npy: stderr does not name the file: $(cat "$TMP/err")"; }
fi

# Bad --sp / --seq: exit 2 with a message naming the value.
run_expect 2 "--sp 3 --seq 64" --sp 3 --seq 64 --model tiny && {
  grep -qF "sp = 3" "$TMP/err" || fail "--sp 3: stderr does not name sp = 3: $(cat "$TMP/err")"
  grep -qF "seq = 64" "$TMP/err" || fail "--sp 3: stderr does not name seq = 64: $(cat "$TMP/err")"
}
run_expect 2 "--sp 128 --seq 64" --sp 128 --seq 64 --model tiny && {
  grep -qF "sp = 128" "$TMP/err" || fail "--sp 128: stderr does not name sp = 128: $(cat "$TMP/err")"
}
run_expect 2 "--sp -2" --sp -2 --seq 64 --model tiny && {
  grep -qF "sp = -2" "$TMP/err" || fail "--sp -2: stderr does not name sp = -2: $(cat "$TMP/err")"
}
run_expect 2 "--recompute kv with explicit" "${BASE[@]}" --form explicit --recompute kv && {
  grep -qF "recompute" "$TMP/err" || fail "--recompute kv --form explicit: stderr does not name recompute: $(cat "$TMP/err")"
}

if [ "$failures" -ne 0 ]; then
  echo "run_threads.sh: $failures check(s) failed" >&2
  exit 1
fi
echo "run_threads.sh: all checks passed"
