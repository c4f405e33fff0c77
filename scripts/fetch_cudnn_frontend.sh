#!/usr/bin/env bash
# Fetches the cudnn-frontend C++ headers (header-only; PyPI's nvidia-cudnn-frontend wheel ships them under
# include/) into build/_deps/cudnn-frontend/include, pinned by version. The cuDNN attention provider is
# built only when they (and cudnn.h) are there; without them laga builds and runs with the provider compiled
# out (`laga run --attention-provider cudnn` then says so). Never fails the build: a failed fetch is reported
# and the script exits 0.
#   scripts/fetch_cudnn_frontend.sh [build-dir, default build]
set -uo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
dest=${1:-build}/_deps/cudnn-frontend
if [ -f "$dest/include/cudnn_frontend.h" ] && [ "$(cat "$dest/VERSION" 2>/dev/null)" = "$version" ]; then
  exit 0
fi
python=$(command -v python3 || true)
if [ -z "$python" ] || ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "cudnn-frontend: python3 -m pip not available; the cuDNN provider is compiled out"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Any platform's wheel carries the same headers: ask for one explicitly so pip's Python version does not matter.
if ! timeout 300 "$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_28_x86_64 "nvidia-cudnn-frontend==$version" -d "$tmp" >"$tmp/log" 2>&1; then
  echo "cudnn-frontend $version: download failed, the cuDNN provider is compiled out ($(tail -1 "$tmp/log"))"
  exit 0
fi
rm -rf "$dest" && mkdir -p "$dest"
if "$python" - "$tmp"/*.whl "$dest" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    z.extractall(dest, names)
print(f"cudnn-frontend: {len(names)} header entries into {dest}/include")
PY
then
  echo "$version" >"$dest/VERSION"
else
  echo "cudnn-frontend $version: could not unpack the wheel; the cuDNN provider is compiled out"
  rm -rf "$dest"
fi
exit 0
