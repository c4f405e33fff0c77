#!/usr/bin/env bash
# scripts/gpu.sh on a machine without a GPU: `help` lists every subcommand the script dispatches (one line each), an
# unknown subcommand exits 2 naming it, a GPU subcommand says there is no GPU (exit 1, no shell error), a missing
# carried build is named (exit 2), and `pack` stamps the commit and tree state of the build it packs.
#   usage: bash scripts_gpu.sh <path-to-laga>
set -u
LAGA=${1:?usage: scripts_gpu.sh <path-to-laga>}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
GPU_SH=$ROOT/scripts/gpu.sh
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# help: exit 0, one line per subcommand, and exactly the subcommands the script has a function for.
bash "$GPU_SH" help >"$TMP/help.txt" 2>&1 || fail "gpu.sh help exited non-zero"
defined=$(grep -oE '^cmd_[a-z_]+\(\)' "$GPU_SH" | sed 's/^cmd_//; s/()$//; s/_/-/g' | sort)
listed=$(grep -oE '^  [a-z][a-z-]*' "$TMP/help.txt" | tr -d ' ' | grep -vx help | sort)
[ "$(echo "$defined" | wc -l)" -ge 15 ] || fail "expected at least 15 subcommands, found: $defined"
[ "$defined" = "$listed" ] || fail "help lists [$(echo $listed)] but the script defines [$(echo $defined)]"
for sub in $defined; do
  [ "$(grep -cE "^  $sub( |$)" "$TMP/help.txt")" -eq 1 ] || fail "help has not exactly one line for '$sub'"
done
bash "$GPU_SH" >"$TMP/none.txt" 2>&1 && cmp -s "$TMP/none.txt" "$TMP/help.txt" || fail "gpu.sh without a subcommand is not help"

# An unknown subcommand: exit 2, the message names it.
bash "$GPU_SH" no-such-thing >"$TMP/unknown.txt" 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "unknown subcommand exited $rc, expected 2"
grep -q "unknown subcommand 'no-such-thing'" "$TMP/unknown.txt" || fail "unknown subcommand not named: $(cat "$TMP/unknown.txt")"

# No GPU: an nvidia-smi that cannot reach a driver (as on a machine with the tools but no device).
mkdir -p "$TMP/bin"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."\nexit 9\n' \
  >"$TMP/bin/nvidia-smi"
chmod +x "$TMP/bin/nvidia-smi"
for sub in check sanitize run-check smoke short all multi overlap cudnn block-profile bench-attention profile traffic torch; do
  PATH="$TMP/bin:$PATH" bash "$GPU_SH" "$sub" "$TMP/no-dist" >"$TMP/nogpu.txt" 2>&1
  rc=$?
  [ "$rc" -eq 1 ] || fail "$sub without a GPU exited $rc, expected 1"
  grep -q "gpu.sh $sub: no NVIDIA GPU on this machine" "$TMP/nogpu.txt" || fail "$sub without a GPU: $(head -3 "$TMP/nogpu.txt")"
  ! grep -qE 'line [0-9]+:|command not found|unbound variable' "$TMP/nogpu.txt" || fail "$sub without a GPU: shell error: $(cat "$TMP/nogpu.txt")"
done

# cudnn's rounds: a bad count is refused before any GPU work (exit 2, the value named).
bash "$GPU_SH" cudnn "$TMP/no-dist" pc 4096 0 >"$TMP/rounds.txt" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "rounds = '0'" "$TMP/rounds.txt" || fail "cudnn with 0 rounds: exit $rc: $(cat "$TMP/rounds.txt")"

# A carried build that is not there: exit 2, the folder named.
bash "$GPU_SH" env "$TMP/no-dist" >"$TMP/nodist.txt" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "no carried build at '$TMP/no-dist'" "$TMP/nodist.txt" || fail "env without a build: exit $rc: $(cat "$TMP/nodist.txt")"

# pack: the binary, the libraries it needs, and BUILD naming the commit and tree state it was built from.
build=$(dirname "$LAGA")
if [ -f "$build/generated/laga_build_commit.hpp" ]; then
  mkdir -p "$TMP/build/generated"
  cp "$LAGA" "$TMP/build/laga"
  cp "$build/generated/laga_build_commit.hpp" "$TMP/build/generated/"
  bash "$GPU_SH" pack "$TMP/build" >"$TMP/pack.txt" 2>&1 || fail "pack exited non-zero: $(tail -5 "$TMP/pack.txt")"
  [ -x "$TMP/build/dist-run/laga" ] || fail "pack did not copy laga"
  want=$(sed -n 's/^#define LAGA_BUILD_COMMIT "\(.*\)"/\1/p' "$build/generated/laga_build_commit.hpp")
  grep -qx "commit=$want" "$TMP/build/dist-run/BUILD" || fail "BUILD does not name commit $want: $(cat "$TMP/build/dist-run/BUILD")"
  grep -qxE 'dirty=(0|1|-1)' "$TMP/build/dist-run/BUILD" || fail "BUILD has no tree state"
  eval "$(bash "$GPU_SH" env "$TMP/build/dist-run")"
  case $LD_LIBRARY_PATH in "$TMP/build/dist-run/libs:"*) ;; *) fail "env does not put the carried libraries first" ;; esac
  [ "${NCCL_NVLS_ENABLE:-}" = 0 ] || fail "env leaves NVLink multicast on"
  bash "$GPU_SH" pack "$TMP/build" wheels >"$TMP/pack2.txt" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] && grep -q "'wheels' after the build folder" "$TMP/pack2.txt" || fail "pack with an unknown extra: exit $rc: $(cat "$TMP/pack2.txt")"
fi

# check-summary reads GPUCHECK lines without a GPU (tests/cli/report_parsers.sh checks its figures).
echo 'GPUCHECK Bf16/CudaBlockVsCpu.MatchesFloat64/laga_a2a_fused y bf16 rel_err=3.200e-03 tol=3.0e-02' >"$TMP/c.txt"
bash "$GPU_SH" check-summary "$TMP/c.txt" | grep -q 'CudaBlockVsCpu y bf16' || fail "check-summary"

[ "$failures" -eq 0 ] || exit 1
echo "gpu.sh: ok"
