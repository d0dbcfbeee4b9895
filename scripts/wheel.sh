#!/usr/bin/env bash
# Builds the Python package as a manylinux wheel in dist/: the native module with
# libjpeg-turbo linked statically, so installing it needs no Rust toolchain, cmake or nasm.
# maturin picks the oldest manylinux tag the module's symbols allow and checks the module
# against it (its auditwheel-style compliance check); a wheel it cannot tag manylinux fails.
#
#   scripts/wheel.sh          # -> dist/sluice-<version>-cp39-abi3-manylinux_2_NN_x86_64.whl
#   pip install dist/sluice-*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/maturin ] || scripts/setup.sh
rm -f dist/sluice-*.whl
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin build --release --quiet -m python/Cargo.toml --out dist
wheel=$(ls dist/sluice-*.whl)
case "$wheel" in
  *manylinux*) ;;
  *) echo "wheel.sh: $wheel is not a manylinux wheel" >&2; exit 1 ;;
esac
echo "==> $wheel ($(du -h "$wheel" | cut -f1))"
