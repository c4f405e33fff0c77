# Ranks agree before they compute: ranks launched with different input (mpirun's per-rank form, "-np 1 laga
# ... : -np 1 laga ...") refuse on every rank, exit 2, naming the field that differs and the ranks on each
# side, instead of hanging in mismatched collectives or finishing with a mismatched result. A killed rank
# still ends the job with a message.   usage: bash agree.sh <laga> <mpiexec>
source "$(dirname "$0")/lib.bash"

# run_mpmd "ARGS OF RANK 0" "ARGS OF RANK 1": sets RC and OUT.
run_mpmd() {
  # shellcheck disable=SC2086
  OUT=$(timeout "$HANG_TIMEOUT" "${MPIRUN[@]}" -np 1 "$LAGA" $1 : -np 1 "$LAGA" $2 2>&1)
  RC=$?
}

cat >"$TMP/v64.json" <<'JSON'
{"hidden_size": 32, "num_attention_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
 "qk_rope_head_dim": 8, "v_head_dim": 16, "rope_theta": 10000.0,
 "rope_scaling": {"type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0,
                  "beta_slow": 1.0, "original_max_position_embeddings": 16}, "rms_norm_eps": 1e-6}
JSON
sed 's/"hidden_size": 32/"hidden_size": 64/; s/"v_head_dim": 16/"v_head_dim": 8/' "$TMP/v64.json" >"$TMP/h64.json"
sed 's/"v_head_dim": 16/"v_head_dim": 8/' "$TMP/v64.json" >"$TMP/tiny.json"

base="run --seq 32"
# differs "FIELD" "RANK 0 ARGS" "RANK 1 ARGS"
differs() {
  local field=$1 a=$2 b=$3
  run_mpmd "$base $a" "$base $b"
  local what="rank 0: laga $base $a | rank 1: laga $base $b"
  [ "$RC" -ne 124 ] || { fail "$what: no answer within ${HANG_TIMEOUT}s (hang)"; show_output; return; }
  [ "$RC" -eq 2 ] || { fail "$what: exit $RC, expected 2"; show_output; return; }
  local n
  n=$(count "$field differs across ranks (ranks 0 | ranks 1")
  [ "$n" -eq 2 ] || { fail "$what: $n of 2 ranks named '$field' and the ranks"; show_output; return; }
  pass "$what -> exit 2 on both ranks, $field named"
}

differs v_head_dim "--model $TMP/tiny.json" "--model $TMP/v64.json"
differs hidden_size "--model $TMP/tiny.json" "--model $TMP/h64.json"
differs form "--model tiny --form laga" "--model tiny --form explicit"
differs layout "--model tiny --layout a2a" "--model tiny --layout all_gather"
differs kernel "--model tiny --kernel fused" "--model tiny --kernel eager"
differs warmup "--model tiny" "--model tiny --warmup 1"
differs check "--model tiny --check" "--model tiny"
differs json "--model tiny --json $TMP/r.json" "--model tiny"
differs save "--model tiny" "--model tiny --save $TMP/saved"
base="run"
differs seq "--model tiny --seq 32" "--model tiny --seq 64"
base="run --seq 32"

# A command line that does not parse on one rank only: both ranks leave with exit 2.
run_mpmd "run --model tiny --seq 32" "run --model tiny --seq 32 --bogus-flag"
if [ "$RC" -eq 2 ] && [ "$(count 'was not expected: --bogus-flag')" -eq 1 ]; then
  pass "a parse error on rank 1 only -> exit 2, no hang"
else
  fail "a parse error on rank 1 only: exit $RC (124 = hang)"
  show_output
fi
differs dtype "--model tiny" "--model tiny --dtype float64"
differs seed "--model tiny" "--model tiny --seed 2"

# The same input on both ranks (per-rank form, same arguments) runs.
run_mpmd "$base --model tiny --check" "$base --model tiny --check"
if [ "$RC" -eq 0 ] && grep -q "check passed" <<<"$OUT"; then
  pass "the same input on both ranks runs and checks"
else
  fail "the same input on both ranks: exit $RC"
  show_output
fi

# A killed rank ends the job: rank 1 is killed in the middle of a long run; mpirun must not wait forever.
OUT=$(timeout "$HANG_TIMEOUT" "${MPIRUN[@]}" -np 2 bash -c '
  if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then (sleep 2; kill -9 $$) & fi
  exec "$0" run --model small --seq 2048 --warmup 50' "$LAGA" 2>&1)
RC=$?
if [ "$RC" -ne 124 ] && [ "$RC" -ne 0 ] && grep -qiE "killed|signal|terminated|exited" <<<"$OUT"; then
  pass "a rank killed mid-run ends the job (exit $RC) with a message"
else
  fail "a rank killed mid-run: exit $RC (124 = hang)"
  show_output
fi

finish
