#!/usr/bin/env bash
# The Python package's tests: PyTorch (2.11) into a virtual environment under build/ (scripts/python_env.sh;
# kept, so a rerun is fast), the package built and installed from this checkout, then pytest over tests/python (the module
# against the tests' own reference, gradcheck, state dicts, bad input; torchrun at 1, 2 and 4 ranks on gloo).
# The extension is built without CUDA here (this suite runs on the CPU; the GPU runs are `scripts/gpu.sh torch`).
set -euo pipefail
cd "$(dirname "$0")/.."
py=build/venv/bin/python
bash scripts/python_env.sh
# Through ccache where it is installed: the library's sources compile with the flags of the main build (scripts/
# build.sh), so only the extension's own sources are compiled again.
launcher=()
command -v ccache >/dev/null && launcher=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
"$py" -m pip install -q --disable-pip-version-check --no-build-isolation -C cmake.define.LAGA_WITH_CUDA=OFF \
  "${launcher[@]}" .
echo "laga Python package: $("$py" -c 'import laga, torch; print(f"laga {laga.__version__} on torch {torch.__version__}")')"
# Run from tests/python so the installed package (not python/laga of the checkout) is the one imported.
cd tests/python
set +e
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "../../$py" -m pytest -q -p no:cacheprovider .
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no test: the Python suite did not run" >&2
  exit 1
fi
exit "$rc"
