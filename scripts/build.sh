#!/usr/bin/env bash
# Configures and builds laga into ./build (Release). CUDA is built when nvcc is found, and skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
launchers=()
# ccache (installed with the other packages) makes a rebuild of unchanged sources a cache hit.
if command -v ccache >/dev/null; then
  launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
bash scripts/fetch_cudnn_frontend.sh build  # optional: the cuDNN attention provider
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launchers[@]}" "$@"
cmake --build build --parallel "$(nproc)"
