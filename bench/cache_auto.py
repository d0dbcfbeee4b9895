"""What ``cache(level="auto")`` decides, against what each choice measures: epoch time
(the median of epochs 2-3: epoch 0 fills the cache, and under ``auto`` epoch 1 still
misses the 32 samples it measured before deciding) and the bytes the cache holds, for no
cache, ``auto``, the level ``auto`` judged best forced on, and ``raw`` (the one level
that keeps the decode fused with the crop), in three settings:

* ``small budget``: 1 MB for 400 ~100 KB JPEGs: room for ~2% of the raw files;
* ``decode-bound``: a budget for everything, decode + random resized crop + flip;
* ``costly suffix``: a budget for everything, 40 JPEGs, then 80 ms of work per sample
  after the cache seam (the ``sleep`` op: an augmentation no cache can skip).

One thread each; configurations interleaved, ``ROUNDS`` rounds, medians.

    maturin develop --release -m python/Cargo.toml && python bench/cache_auto.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sluice

ROUNDS, EPOCHS = 3, 4


def pipelines(big: Path, small: Path) -> dict[str, tuple[sluice.Pipeline, object]]:
    """Each setting: its pipeline without a cache, and the budget its caches get."""
    standard = sluice.Pipeline.image_folder(big).decode().random_resized_crop(64)
    standard = standard.random_horizontal_flip().batch(16).threads(1).seed(3)
    suffix = sluice.Pipeline.image_folder(small).decode().random_resized_crop(64)
    suffix = suffix.sleep(80_000).batch(16).threads(1).seed(3)
    return {
        "small budget": (standard, 1_000_000),
        "decode-bound": (standard, "1GB"),
        "costly suffix": (suffix, "1GB"),
    }


def run(pipe: sluice.Pipeline) -> tuple[float, dict[str, Any]]:
    loader = sluice.Loader(pipe)
    times = []
    for _ in range(EPOCHS):
        t0 = time.perf_counter()
        for _ in loader:
            pass
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]), loader.stats().get("cache") or {}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        big, small = Path(tmp) / "big", Path(tmp) / "small"
        sluice.generate_dataset(big, images=400, classes=4, seed=1)
        sluice.generate_dataset(small, images=40, classes=4, seed=2)
        settings = pipelines(big, small)
        # The level auto judges best in each setting, found by a first auto run.
        forced: dict[str, str | None] = {}
        for name, (pipe, budget) in settings.items():
            _, c = run(pipe.cache(budget, level="auto", policy="lru"))
            off = c.get("off")
            forced[name] = off["best"] if off else c["level"]
        results: dict[tuple[str, str], list[tuple[float, dict[str, Any]]]] = {}
        for r in range(ROUNDS):
            for name, (pipe, budget) in settings.items():
                level = forced[name]
                configs = {
                    "none": pipe,
                    "auto": pipe.cache(budget, level="auto", policy="lru"),
                    f"{level} forced": pipe.cache(budget, level=level, policy="lru"),
                    "raw forced": pipe.cache(budget, level="raw", policy="lru"),
                }
                for label, p in configs.items():
                    results.setdefault((name, label), []).append(run(p))
            print(f"round {r + 1}/{ROUNDS} done", file=sys.stderr)
        print("| setting | cache | epoch (s) | vs none | cache holds | auto decided |")
        print("|---|---|---:|---:|---:|---|")
        for name in settings:
            base = statistics.median(t for t, _ in results[(name, "none")])
            for (n, label), runs in results.items():
                if n != name:
                    continue
                t = statistics.median(x for x, _ in runs)
                c = runs[-1][1]
                held = f"{c['used_bytes'] / 1e6:.1f} MB" if c else "-"
                decided = ""
                if label == "auto":
                    off = c.get("off")
                    decided = (
                        f"off: {off['best']} would save {100 * off['saved_fraction']:.1f}%"
                        if off
                        else f"{c['level']}"
                    )
                print(
                    f"| {name} | {label} | {t:.3f} | {t / base:.2f}x | {held} | {decided} |"
                )


if __name__ == "__main__":
    main()
