"""Python ``map`` ops: what a map that does nothing costs per sample, and how a CPU-heavy
numpy map scales from one worker process to two, against a torch DataLoader running the
same function (num_workers 1 and 2) in the same run (docs/map.md).

Configurations are interleaved, ROUNDS rounds each, medians reported.

    maturin develop --release -m python/Cargo.toml && python bench/map_overhead.py

``--overhead-only`` measures only the no-op map (no heavy function, no torch), one round
per run, for interleaving builds: run it alternately with each build's package first on
``PYTHONPATH`` and take the medians.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import sluice

N, ROUNDS, BATCH = 256, 3, 32
#: Rounds of the heavy function's loop; calibrated to ~2 ms in the parent and handed to
#: worker processes (sluice's and the DataLoader's) through the environment.
HEAVY_ROUNDS = int(os.environ.get("SLUICE_BENCH_HEAVY_ROUNDS", "1"))


def identity(image: np.ndarray, sample: Any) -> np.ndarray:
    return image


def heavy(image: np.ndarray, sample: Any) -> np.ndarray:
    """A CPU-bound numpy transform (repeated box blur in float32)."""
    x = image.astype(np.float32)
    for _ in range(HEAVY_ROUNDS):
        x = (x + np.roll(x, 1, 0) + np.roll(x, 1, 1)) / 3.0
    return x.astype(np.uint8)


def calibrate(side: int, target_s: float = 0.002) -> int:
    global HEAVY_ROUNDS
    img = np.zeros((side, side, 3), np.uint8)
    HEAVY_ROUNDS = 10
    t0 = time.perf_counter()
    for _ in range(20):
        heavy(img, None)
    per_round = (time.perf_counter() - t0) / 20 / 10
    HEAVY_ROUNDS = max(1, round(target_s / per_round))
    os.environ["SLUICE_BENCH_HEAVY_ROUNDS"] = str(HEAVY_ROUNDS)
    return HEAVY_ROUNDS


def pipe(root: Path, side: int, fn: Any = None) -> sluice.Pipeline:
    p = sluice.Pipeline.image_folder(root).decode().center_crop(side)
    if fn is not None:
        p = p.map(fn)
    return p.batch(BATCH).shuffle("none").threads(1)


def sluice_epoch_s(loader: sluice.Loader) -> float:
    it = iter(loader)
    first = next(it)  # worker start-up is not the steady state
    t0 = time.perf_counter()
    n = sum(len(b["label"]) for b in it)
    assert n + len(first["label"]) == N
    return (time.perf_counter() - t0) / (N - len(first["label"]))


class _Files:
    """The same images for a torch DataLoader: read, decode (PIL), center crop, fn."""

    def __init__(
        self, root: Path, side: int, fn: Callable[[np.ndarray, Any], np.ndarray]
    ) -> None:
        self.files = sorted(root.rglob("*.jpg"))
        self.side, self.fn = side, fn

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        from PIL import Image

        img = Image.open(self.files[i]).convert("RGB")
        w, h = img.size
        left, top = (w - self.side) // 2, (h - self.side) // 2
        arr = np.asarray(img.crop((left, top, left + self.side, top + self.side)))
        return self.fn(arr.copy(), None), 0


def torch_epoch_s(dl: Any) -> float:
    it = iter(dl)
    first = next(it)
    t0 = time.perf_counter()
    n = sum(len(b[1]) for b in it)
    assert n + len(first[1]) == N
    return (time.perf_counter() - t0) / (N - len(first[1]))


def main() -> None:
    overhead_only = "--overhead-only" in sys.argv[1:]
    rounds = 1 if overhead_only else ROUNDS
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "train"
        sluice.generate_dataset(root, images=N, classes=4, seed=1)
        if overhead_only:
            overhead(root, rounds)
            return
        import torch
        from torch.utils.data import DataLoader

        torch.set_num_threads(1)
        rounds = calibrate(64)
        print(
            f"heavy map: {rounds} rounds of a 64x64 float32 box blur (~2 ms)",
            file=sys.stderr,
        )
        results: dict[str, list[float]] = {}

        def record(name: str, seconds_per_sample: float) -> None:
            results.setdefault(name, []).append(seconds_per_sample)

        for _ in range(rounds):
            for side in (64, 224):
                # Overhead: the map op's own time in-process, and end to end in one process.
                plain = sluice.Loader(pipe(root, side), processes=0)
                record(f"plain {side}", sluice_epoch_s(plain))
                inproc = sluice.Loader(pipe(root, side, identity), processes=0)
                record(f"identity in-process {side}", sluice_epoch_s(inproc))
                record(
                    f"identity op time {side}", inproc.stats()["op_seconds"]["map"] / N
                )
                one = sluice.Loader(pipe(root, side, identity), processes=1)
                record(f"identity 1 process {side}", sluice_epoch_s(one))
                one.close()
            for procs in (1, 2):
                loader = sluice.Loader(pipe(root, 64, heavy), processes=procs)
                record(f"heavy sluice {procs}", sluice_epoch_s(loader))
                loader.close()
                dl = DataLoader(
                    _Files(root, 64, heavy), batch_size=BATCH, num_workers=procs
                )
                record(f"heavy torch {procs}", torch_epoch_s(dl))

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"| measure | median (µs/sample, {ROUNDS} rounds) |")
    print("|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v * 1e6:.1f} |")
    for side in (64, 224):
        print(
            f"no-op map at {side}x{side}: op time {med[f'identity op time {side}'] * 1e6:.2f} µs/sample; "
            f"in-process +{(med[f'identity in-process {side}'] - med[f'plain {side}']) * 1e6:.2f} µs/sample; "
            f"one worker process +{(med[f'identity 1 process {side}'] - med[f'plain {side}']) * 1e6:.2f} µs/sample"
        )
    for who in ("sluice", "torch"):
        print(
            f"heavy map, {who}: 1 -> 2 processes: {med[f'heavy {who} 1'] / med[f'heavy {who} 2']:.2f}x"
        )
    print(
        f"heavy map, sluice vs torch DataLoader: {med['heavy torch 1'] / med['heavy sluice 1']:.2f}x at 1, "
        f"{med['heavy torch 2'] / med['heavy sluice 2']:.2f}x at 2"
    )


def overhead(root: Path, rounds: int) -> None:
    """The no-op map's own time (stats' op seconds) and its end-to-end cost in-process."""
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        for side in (64, 224):
            plain = sluice.Loader(pipe(root, side), processes=0)
            results.setdefault(f"plain {side}", []).append(sluice_epoch_s(plain))
            inproc = sluice.Loader(pipe(root, side, identity), processes=0)
            results.setdefault(f"identity in-process {side}", []).append(
                sluice_epoch_s(inproc)
            )
            results.setdefault(f"identity op time {side}", []).append(
                inproc.stats()["op_seconds"]["map"] / N
            )
            one = sluice.Loader(pipe(root, side, identity), processes=1)
            sluice_epoch_s(one)
            results.setdefault(f"identity op time, 1 process {side}", []).append(
                one.stats()["op_seconds"]["map"] / N
            )
            one.close()
    for k, v in results.items():
        print(f"{k}: {statistics.median(v) * 1e6:.2f} µs/sample")


if __name__ == "__main__":
    main()
