#!/usr/bin/env bash
# Every test: Rust unit and integration tests, clippy with warnings as errors, and the
# Python package's lints (ruff), types (mypy --strict, config in python/pyproject.toml)
# and pytest suite; the Kubernetes manifests validated offline against the API schema; the
# manylinux wheel installed into a fresh venv with no Rust toolchain, running the README's example.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
echo "==> cargo fmt --check"
cargo fmt --all --check
echo "==> the wheel, installed without Rust (scripts/wheel-test.sh)"
scripts/wheel-test.sh
if [ "${SLUICE_TEST_PRUNE:-0}" = 1 ]; then
  # CI: nothing after this point uses the release build (the Python module is copied into
  # python/sluice, the rest is cargo test's debug build), and a fresh machine's disk is short.
  echo "==> SLUICE_TEST_PRUNE=1: removing target/release ($(du -sh target/release | cut -f1))"
  rm -rf target/release
fi
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "==> cargo test"
cargo test --workspace --quiet 2>&1
echo "==> ruff and mypy (python/)"
.venv/bin/ruff check python
.venv/bin/ruff format --check python
(cd python && ../.venv/bin/mypy)
echo "==> kubernetes-validate (deploy/)"
scripts/validate-manifests.sh
echo "==> pytest (python/tests)"
.venv/bin/python -m pytest -q python/tests
