#!/usr/bin/env bash
# What the service's trace costs: a dispatcher and WORKERS worker processes on 127.0.0.1
# serve the standard training pipeline (decode + random_resized_crop 224 + flip, batches of
# 64); `sluice service remote-run` reads EPOCHS epochs of a fresh job without and with `--trace`
# (the client's events plus every batch's build times from its worker), interleaved (off,
# on, off, on, ...; the first of each pair alternates) for ROUNDS rounds. Prints one line
# per run (samples/s of the last epoch, client CPU seconds, worker builds in the trace)
# and the medians.
#
#   cargo build --release -p sluice-cli && bench/service_trace_overhead.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-5}
WORKERS=${WORKERS:-2}
EPOCHS=${EPOCHS:-2}
root=$(realpath "$DATA")
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
standard_spec "$work/spec.toml" 1
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
addr=127.0.0.1:$port
SLUICE_LOG=warn "$SLUICE" service dispatcher --listen "$addr" --allow-root "$root" --journal "$work/journal" &
pids+=($!)
for _ in $(seq 1 "$WORKERS"); do
  SLUICE_LOG=warn "$SLUICE" service worker --dispatcher "$addr" --allow-root "$root" --threads 1 &
  pids+=($!)
done
sleep 1

# One run: "samples/s cpu_s builds".
n=0
one() {
  n=$((n + 1))
  local trace_args=() out
  [ "$1" = on ] && trace_args=(--trace "$work/run.pftrace")
  out=$( { /usr/bin/env time -f "CPU %U %S" "$SLUICE" service remote-run "$work/spec.toml" --dispatcher "$addr" \
           --job "run-$n" --epochs "$EPOCHS" "${trace_args[@]}"; } 2>&1 )
  local sps cpu builds
  sps=$(echo "$out" | awk '/^epoch [0-9]+:/ {for (i = 1; i < NF; i++) if ($(i+1) ~ /^samples\/s/) v = $i} END {print v}')
  cpu=$(echo "$out" | awk '/^CPU/ {print $2 + $3}')
  builds=$(echo "$out" | awk '/worker builds written/ {print $(NF-5)}')
  echo "$sps $cpu ${builds:-0}"
}

off_on_rounds "$ROUNDS" "$work/runs"
python3 - "$work/runs" <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1])]
med = lambda mode, i: statistics.median(float(r[i]) for r in runs if r[0] == mode)
off_sps, on_sps = med("off", 1), med("on", 1)
print(f"median samples/s: off {off_sps:.1f}, on {on_sps:.1f} -> the service trace costs {100 * (1 - on_sps / off_sps):.2f}% of throughput")
print(f"median client CPU s: off {med('off', 2):.2f}, on {med('on', 2):.2f}; {med('on', 3):.0f} worker builds per traced run")
PY
