"""Python iteration against native Rust iteration of the same loader, on the same data.

The standard training pipeline (decode + RandomResizedCrop 224 + flip, uint8 out, batches
of 64) over a generated ImageFolder. Each run iterates one epoch twice on one loader: once
natively (``EpochIterator.drain``: Rust takes every batch and hands its buffer straight
back, what a Rust consumer does) and once from Python (``for batch in loader``: numpy
arrays that go back to the pool when freed). Both passes run the same epoch, so they do
the same work; the order alternates between runs, and the medians over the runs are
compared, because machines are noisy.

    python bench/python_vs_rust.py                  # 1000 images in data/bench-py, 2 threads, 5 runs
    python bench/python_vs_rust.py --threads 4 --runs 7 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List

import sluice


def native_epoch(loader: sluice.Loader, epoch: int) -> int:
    """One epoch taken in Rust; returns its samples."""
    loader.set_epoch(epoch)
    _, samples = loader._native.iter().drain()
    return int(samples)


def python_epoch(loader: sluice.Loader, epoch: int) -> int:
    """One epoch taken from Python; returns its samples."""
    loader.set_epoch(epoch)
    samples = 0
    for batch in loader:
        samples += batch.size
    return samples


def timed(epoch: Callable[[sluice.Loader, int], int], loader: sluice.Loader, n: int) -> float:
    """Images per second of ``epoch`` number ``n``."""
    t0 = time.perf_counter()
    samples = epoch(loader, n)
    return samples / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("data/bench-py"), help="ImageFolder (generated if missing)")
    parser.add_argument("--images", type=int, default=1000, help="images to generate when --data is missing")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()

    if not args.data.is_dir():
        sluice.generate_dataset(args.data, images=args.images)
    pipe = (
        sluice.Pipeline.image_folder(args.data)
        .decode()
        .random_resized_crop(224)
        .random_horizontal_flip()
        .batch(args.batch)
        .threads(args.threads)
    )
    loader = sluice.Loader(pipe)
    # Warm the page cache and the buffer pool (not timed).
    native_epoch(loader, 0)
    python_epoch(loader, 0)

    rates: Dict[str, List[float]] = {"rust": [], "python": []}
    for run in range(1, args.runs + 1):
        order = [("rust", native_epoch), ("python", python_epoch)]
        if run % 2 == 0:
            order.reverse()
        for name, epoch in order:
            rates[name].append(timed(epoch, loader, run))
    rust, python = statistics.median(rates["rust"]), statistics.median(rates["python"])
    result = {
        "images": loader.num_samples,
        "threads": args.threads,
        "runs": args.runs,
        "rust_img_s": rust,
        "python_img_s": python,
        "python_over_rust": python / rust,
        "rust_runs": rates["rust"],
        "python_runs": rates["python"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{loader.num_samples} images, {args.threads} threads, median of {args.runs} runs each (img/s)")
    print("rust:   " + "  ".join(f"{r:7.1f}" for r in rates["rust"]) + f"   median {rust:7.1f}")
    print("python: " + "  ".join(f"{r:7.1f}" for r in rates["python"]) + f"   median {python:7.1f}")
    print(f"python / rust = {python / rust:.3f}")


if __name__ == "__main__":
    main()
