# `laga run` under mpirun refuses bad input on every rank before any collective: the job ends (exit code
# 2, not the timeout's 124, which would mean a hang) and every rank printed the same message, naming the
# value and the rule.   usage: bash bad_input.sh <laga> <mpiexec>
source "$(dirname "$0")/lib.bash"

# refused NP "FRAGMENT|FRAGMENT..." ARGS...: exit 2, exactly NP lines "laga: error: ..." (one per rank), all
# the same, each containing every fragment.
refused() {
  local np=$1 fragments=$2
  shift 2
  local what="-np $np laga $*"
  run_mpi "$np" "$@"
  if [ "$RC" -eq 124 ]; then
    fail "$what: no answer within ${HANG_TIMEOUT}s (hang)"
    show_output
    return
  fi
  [ "$RC" -eq 2 ] || { fail "$what: exit code $RC, expected 2"; show_output; return; }
  local errors distinct
  errors=$(grep '^laga: error: ' <<<"$OUT")
  distinct=$(sort -u <<<"$errors" | grep -c .)
  [ "$(grep -c . <<<"$errors")" -eq "$np" ] || { fail "$what: $(grep -c . <<<"$errors") error lines for $np ranks"; show_output; return; }
  [ "$distinct" -eq 1 ] || { fail "$what: the ranks printed different messages"; show_output; return; }
  local IFS='|' f
  for f in $fragments; do
    grep -qF -- "$f" <<<"$errors" || { fail "$what: message lacks '$f'"; show_output; return; }
  done
  pass "$what -> exit 2, $np x: $(head -n1 <<<"$errors")"
}

# S not divisible by P.
refused 4 "seq = 30|not divisible by sp = 4|each rank holds S/P" run --model tiny --seq 30
# P > S.
refused 4 "sp = 4 > seq = 2|P <= S" run --model tiny --seq 2
# Heads not divisible by P in the a2a layout (tiny has 4 heads), while the all_gather layout runs at P = 3
# (run_check.sh).
refused 3 "num_attention_heads = 4|not divisible by sp = 3|a2a" run --model tiny --seq 24 --layout a2a
# The ring (p2p): S in 2P chunks (24 tokens are not 16 chunks), the fused kernel only, no absorbed form.
refused 8 "seq = 24|not divisible by 2 x sp = 16|p2p" run --model tiny --seq 24 --layout p2p
refused 2 "kernel = eager with layout = p2p|fused" run --model tiny --seq 16 --layout p2p --kernel eager
refused 2 "form = absorbed with layout = p2p" run --model tiny --seq 16 --layout p2p --form absorbed
# --sp disagreeing with the process count.
refused 4 "sp = 8|mpirun started 4 processes" run --model tiny --seq 32 --sp 8
# Recomputation only with LAGA; an unknown model; a --load directory without the files.
refused 2 "recompute = kv|explicit|laga form only" run --model tiny --seq 16 --form explicit --recompute kv
refused 2 "nosuch|preset" run --model nosuch --seq 16
mkdir -p "$TMP/empty"
refused 2 "$TMP/empty/|cannot open" run --model tiny --seq 16 --load "$TMP/empty"

# A command-line parse error: every rank prints CLI11's complaint before any exits.
run_mpi 4 run --model tiny --bogus-flag
if [ "$RC" -eq 2 ] && [ "$(count 'was not expected: --bogus-flag')" -eq 4 ]; then
  pass "-np 4 laga run --bogus-flag -> exit 2, 4 x the parse error"
else
  fail "-np 4 laga run --bogus-flag: exit $RC, $(count 'was not expected: --bogus-flag') messages for 4 ranks"
  show_output
fi

# --save into a path that cannot be a directory: rank 0 (the writer) refuses before the run, the other
# ranks say so, and no rank hangs.
touch "$TMP/a_file"
run_mpi 4 run --model tiny --seq 16 --save "$TMP/a_file/sub"
if [ "$RC" -eq 2 ] && [ "$(count "save = \"$TMP/a_file/sub\": cannot create the directory")" -eq 1 ] &&
   [ "$(count 'refused on another rank')" -eq 3 ]; then
  pass "-np 4 laga run --save <not a directory> -> exit 2, refused before the run"
else
  fail "-np 4 laga run --save <not a directory>: exit $RC"
  show_output
fi

finish
