#!/usr/bin/env bash
# The Python test environment: PyTorch (2.11), numpy, pytest, scikit-build-core and transformers (the tests of
# laga.hf swap its DeepSeek attention for laga's) in a virtual environment
# under build/venv (kept, so a rerun is fast). scripts/test.sh starts it beside the C++ build, since the
# download is network time the build's cores do not need; scripts/test_python.sh calls it again (a no-op when
# it is ready).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/venv
py=$venv/bin/python
if ! "$py" -c "import torch, pytest, scikit_build_core, transformers" >/dev/null 2>&1; then
  mkdir -p build
  python3 -m venv "$venv"
  "$py" -m pip install -q --disable-pip-version-check torch==2.11.0 numpy pytest "scikit-build-core>=0.10" \
    transformers==5.25.0
fi
