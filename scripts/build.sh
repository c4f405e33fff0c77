#!/usr/bin/env bash
# Configures and builds laga into ./build (Release). CUDA is built when nvcc is found, and skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build --parallel "$(nproc)"
