#!/usr/bin/env bash
# The tracked files speak of the software and its measurements, not of how the work was organised: no issue
# numbers, numbered sessions or leases in code, docs, scripts or documents (outside .git). Skipped outside a git
# checkout.   usage: bash project_wording.sh <path-to-laga>
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if ! git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "not a git checkout: skipped"
  exit 0
fi
# The pattern is assembled so that this file does not match it.
word=l; word+=ease
found=$(git -C "$ROOT" grep -n -iE "issue ?#?[0-9]|session [0-9]|\\b$word\\b" -- . 2>/dev/null)
if [ -n "$found" ]; then
  echo "FAIL: process wording in tracked files:" >&2
  echo "$found" | head -20 >&2
  exit 1
fi
echo "project wording: ok"
