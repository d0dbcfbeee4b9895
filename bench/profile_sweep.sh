#!/usr/bin/env bash
# `sluice profile` on the standard training pipeline: a threads sweep (local loader) and a
# workers sweep (dispatcher + worker processes on loopback), each setting run RUNS times
# interleaved (median run kept); writes bench-profile-{threads,workers}.html and .txt (the table).
set -euo pipefail
SLUICE=${SLUICE:-target/release/sluice}
DATA=${DATA:-data/bench}
IMAGES=${IMAGES:-1000}
RUNS=${RUNS:-3}
EPOCHS=${EPOCHS:-2}
THREADS=${THREADS:-1,2}
WORKERS=${WORKERS:-1,2}
[ -d "$DATA" ] || "$SLUICE" gen-images --out "$DATA" --images "$IMAGES"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/spec.toml" <<TOML
threads = 2
prefetch = 4
[source]
kind = "image_folder"
root = "$(realpath "$DATA")"
[[ops]]
op = "decode"
[[ops]]
op = "random_resized_crop"
size = 224
[[ops]]
op = "random_horizontal_flip"
[batch]
size = 64
TOML
for sweep in "threads=$THREADS" "workers=$WORKERS"; do
  name=${sweep%%=*}
  "$SLUICE" profile "$work/spec.toml" --sweep "$sweep" --runs "$RUNS" --epochs "$EPOCHS" \
    --report "bench-profile-$name.html" | tee "bench-profile-$name.txt"
done
