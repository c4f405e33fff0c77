#!/usr/bin/env bash
# Installs the Debian 12 packages laga builds with, only those missing (run as root, or with sudo present).
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config libopenblas-dev libopenmpi-dev openmpi-bin
          nlohmann-json3-dev libcli11-dev libgtest-dev)
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
