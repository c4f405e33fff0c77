#!/usr/bin/env bash
# Installs the Debian 12 packages laga builds with, only those missing (run as root, or with sudo present).
set -euo pipefail
# python3-matplotlib: the bench plots (scripts/plot_bench.py); tests/cli/bench.sh skips them without it.
# python3-venv: the Python package's tests install PyTorch into a virtual environment (scripts/test_python.sh).
packages=(build-essential cmake ninja-build pkg-config libopenblas-dev libopenmpi-dev openmpi-bin
          nlohmann-json3-dev libcli11-dev libgtest-dev python3-matplotlib ccache python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
