"""An ensemble of ``MEMBERS`` loaders in one process (seeds 0..MEMBERS-1, the standard
pipeline, a decoded-level cache that holds the dataset), read batch by batch in turn as
an ensemble's training loop does: with ``cache(share=True)`` against without. Reported
per configuration: the wall time of the members' first epoch together, of their second,
and the decode seconds all members spent (their ``op_seconds`` for decode and crop);
configurations interleaved, ``ROUNDS`` rounds, medians, ratios shared / not shared.

    maturin develop --release -m python/Cargo.toml && python bench/cache_share.py
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sluice

MEMBERS, ROUNDS, IMAGES = 4, 3, 400


def members(root: Path, share: bool) -> list[sluice.Loader]:
    out = []
    for seed in range(MEMBERS):
        pipe = sluice.Pipeline.image_folder(root).decode().random_resized_crop(128)
        pipe = pipe.random_horizontal_flip().batch(16).threads(1).seed(seed)
        out.append(
            sluice.Loader(pipe.cache("1GB", level="decoded", policy="lru", share=share))
        )
    return out


def epoch(loaders: list[sluice.Loader]) -> float:
    """One epoch of every member, a batch of each in turn."""
    t0 = time.perf_counter()
    for batches in itertools.zip_longest(*(iter(x) for x in loaders)):
        assert any(b is not None for b in batches)
    return time.perf_counter() - t0


def decode_s(loaders: list[sluice.Loader]) -> float:
    return sum(
        t
        for x in loaders
        for op, t in x.stats()["op_seconds"].items()
        if op.startswith("decode")
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        sluice.generate_dataset(root, images=IMAGES, classes=4, seed=1)
        runs: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        for r in range(ROUNDS):
            for share in (False, True) if r % 2 == 0 else (True, False):
                loaders = members(root, share)
                first, second = epoch(loaders), epoch(loaders)
                runs[share].append((first, second, decode_s(loaders)))
                del loaders
            print(f"round {r + 1}/{ROUNDS} done", file=sys.stderr)
    med = {
        s: [statistics.median(x[i] for x in runs[s]) for i in range(3)] for s in runs
    }
    print(f"{MEMBERS} members x {IMAGES} images, medians of {ROUNDS} rounds\n")
    print(
        "| cache | first epoch, all members (s) | second epoch (s) | decode seconds |"
    )
    print("|---|---:|---:|---:|")
    for s, name in ((False, "one per member"), (True, "shared (share=True)")):
        print(f"| {name} | {med[s][0]:.2f} | {med[s][1]:.2f} | {med[s][2]:.2f} |")
    ratios = [med[True][i] / med[False][i] for i in range(3)]
    print(
        f"| shared / one per member | {ratios[0]:.2f}x | {ratios[1]:.2f}x | {ratios[2]:.2f}x |"
    )


if __name__ == "__main__":
    main()
