#!/usr/bin/env bash
# Every test: Rust unit and integration tests, clippy with warnings as errors, and the
# Python package's pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "==> cargo fmt --check"
cargo fmt --all --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "==> cargo test"
cargo test --workspace --quiet 2>&1
echo "==> pytest (python/tests)"
.venv/bin/python -m pytest -q python/tests
