# Sourced by the bench/*.sh scripts (not run): the data they read, the standard training
# pipeline's spec, and the interleaved off/on rounds the overhead benches share.
# Settings (environment): SLUICE (default target/release/sluice), DATA (data/bench),
# IMAGES (1000, generated into DATA when it is missing).
SLUICE=${SLUICE:-target/release/sluice}
DATA=${DATA:-data/bench}
IMAGES=${IMAGES:-1000}
[ -d "$DATA" ] || "$SLUICE" gen-images --out "$DATA" --images "$IMAGES"

# standard_spec FILE THREADS: the standard training pipeline over DATA (decode +
# random_resized_crop 224 + flip, batches of 64, prefetch 4) with THREADS threads.
standard_spec() {
  cat > "$1" <<TOML
threads = $2
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
}

# off_on_rounds ROUNDS RUNS_FILE: calls `one off` and `one on` (defined by the script, each
# printing one line of figures) ROUNDS times, the first of each pair alternating, and
# appends "MODE FIGURES..." lines to RUNS_FILE.
off_on_rounds() {
  local r mode order
  for r in $(seq 1 "$1"); do
    if [ $((r % 2)) = 1 ]; then order="off on"; else order="on off"; fi
    for mode in $order; do
      echo "$mode $(one "$mode")" | tee -a "$2"
    done
  done
}
