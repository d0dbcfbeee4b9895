#!/usr/bin/env bash
# Runs each fuzz target (fuzz/fuzz_targets) for a bounded time with cargo-fuzz (libFuzzer,
# AddressSanitizer). Not part of scripts/test.sh or CI: it needs cargo-fuzz
# (`cargo install cargo-fuzz`) and is CPU-heavy.
#
#   scripts/fuzz.sh                 # every target, 60 s each
#   FUZZ_SECONDS=300 scripts/fuzz.sh spec
#
# The stable toolchain serves: RUSTC_BOOTSTRAP lets it take the nightly-only sanitizer
# flags. Crashes land in fuzz/artifacts/<target>/; the corpus grows in fuzz/corpus/<target>/
# (neither is committed). Reproduce a crash with `scripts/fuzz.sh <target> <artifact>`.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${FUZZ_SECONDS:-60}"
targets=("${1:-spec}")
[ $# -eq 0 ] && targets=(spec image stream_entry stream_state peer_frames shard_frames loader_state remote_state parquet records batch entropy_index)
export RUSTC_BOOTSTRAP=1
if [ $# -ge 2 ]; then
    exec cargo fuzz run "$1" "$2"
fi
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    # Start from the committed seeds (fuzz/seeds/<target>), if any.
    if [ -d "seeds/$t" ]; then cp -n "seeds/$t"/* "corpus/$t/"; fi
    echo "==> fuzz $t for ${seconds}s"
    nice -n 10 cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=65536
done
