#!/usr/bin/env bash
# What tracing costs: `sluice run` of the standard training pipeline (decode +
# random_resized_crop 224 + flip, batches of 64) without and with `--trace`, interleaved
# (off, on, off, on, ...; the first of each pair alternates) for ROUNDS rounds. Prints one
# line per run and the medians: samples/s, CPU seconds (user + sys), trace events, and the
# extra CPU per event ((median CPU on - median CPU off) / events).
#
#   cargo build --release -p sluice-cli && bench/trace_overhead.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
EPOCHS=${EPOCHS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
standard_spec "$work/spec.toml" "$THREADS"

# One run: "samples/s cpu_s events".
one() {
  local trace_args=() out
  [ "$1" = on ] && trace_args=(--trace "$work/run.pftrace")
  out=$( { /usr/bin/env time -f "CPU %U %S" "$SLUICE" run "$work/spec.toml" --epochs "$EPOCHS" --json \
           "${trace_args[@]}" > "$work/stats.json"; } 2>&1 )
  local sps cpu events
  sps=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['samples_per_s'])" "$work/stats.json")
  cpu=$(echo "$out" | awk '/^CPU/ {print $2 + $3}')
  events=$(echo "$out" | awk '/events written to/ {print $2}')
  echo "$sps $cpu ${events:-0}"
}

off_on_rounds "$ROUNDS" "$work/runs"
python3 - "$work/runs" <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1])]
med = lambda mode, i: statistics.median(float(r[i]) for r in runs if r[0] == mode)
off_sps, on_sps = med("off", 1), med("on", 1)
off_cpu, on_cpu = med("off", 2), med("on", 2)
events = med("on", 3)
print(f"median samples/s: off {off_sps:.1f}, on {on_sps:.1f} -> tracing costs {100 * (1 - on_sps / off_sps):.2f}% of throughput")
print(f"median CPU s: off {off_cpu:.2f}, on {on_cpu:.2f}; {events:.0f} events -> {1e9 * (on_cpu - off_cpu) / events:.0f} ns of CPU per event")
PY
