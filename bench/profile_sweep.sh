#!/usr/bin/env bash
# `sluice profile` on the standard training pipeline: a threads sweep (local loader) and a
# workers sweep (dispatcher + worker processes on loopback), each setting run RUNS times
# interleaved (median run kept); writes bench-profile-{threads,workers}.html and .txt (the table).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-3}
EPOCHS=${EPOCHS:-2}
THREADS=${THREADS:-1,2}
WORKERS=${WORKERS:-1,2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
standard_spec "$work/spec.toml" 2
for sweep in "threads=$THREADS" "workers=$WORKERS"; do
  name=${sweep%%=*}
  "$SLUICE" profile "$work/spec.toml" --sweep "$sweep" --runs "$RUNS" --epochs "$EPOCHS" \
    --report "bench-profile-$name.html" | tee "bench-profile-$name.txt"
done
