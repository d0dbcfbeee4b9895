#!/usr/bin/env bash
# The main job on data of sluice's own: set up, generate an ImageNet-like dataset, run the
# standard training pipeline for two epochs, then benchmark it against plain JPEG decoding.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "==> sluice demo (dataset in data/demo)"
target/release/sluice demo --dir data/demo
echo "==> sluice bench"
target/release/sluice bench --data data/demo/train --runs 3
