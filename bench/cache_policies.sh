#!/usr/bin/env bash
# Cache policies compared (see crates/sluice-bench/src/cache.rs):
#  1. hit rate vs cache size (10%..90%) for lru, shade, fastmatch and importance on one
#     simulated training run with importance feedback (heavy-tailed simulated losses);
#  2. epoch time on throttled storage (2 ms per read, 200 MB/s) with no cache, and with the
#     importance and lru caches at 50% of the decoded dataset (real JPEGs, real loader).
# Usage: bench/cache_policies.sh [out.json]   (extra flags: SLUICE_BENCH_CACHE_ARGS)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-data/bench/cache_policies.json}"
mkdir -p "$(dirname "$out")"
cargo build --release --quiet -p sluice-bench
# shellcheck disable=SC2086
./target/release/sluice-bench cache --json ${SLUICE_BENCH_CACHE_ARGS:-} > "$out"
echo "results in $out" >&2
