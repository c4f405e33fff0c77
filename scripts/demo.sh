#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the embedded demo. The installation and
# the build print one summary line (their full output goes to build/demo-setup.log, shown if they fail).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
log=build/demo-setup.log
start=$(date +%s)
if ! bash scripts/build.sh >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "setup failed: the full output is in $log" >&2
  exit 1
fi
installed=$(sed -n 's/^installing: //p' "$log")
echo "setup: ${installed:+installed ${installed}; }built laga in $(( $(date +%s) - start )) s (output in $log)"
./build/laga
