#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the embedded demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/laga
