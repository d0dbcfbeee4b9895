#!/usr/bin/env bash
# The main job on data of sluice's own: set up, generate an ImageNet-like dataset, run the
# standard training pipeline for two epochs, benchmark it against plain JPEG decoding (on the
# files as generated and packed with restart markers), then
# train a small PyTorch model fed by sluice from Python.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "==> sluice demo (dataset in data/demo)"
target/release/sluice demo --dir data/demo
echo "==> sluice-bench engine (training pipeline vs plain libjpeg-turbo decode, same files)"
echo "    (--packed: also on a copy made by \`sluice pack\`: the same pixels, JPEGs rewritten with restart markers)"
target/release/sluice-bench engine --data data/demo/train --packed --runs 3
echo "==> PyTorch training fed by sluice (python/examples/train_torch.py)"
.venv/bin/python python/examples/train_torch.py --data data/demo/train --epochs 2
