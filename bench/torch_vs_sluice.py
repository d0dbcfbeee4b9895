"""sluice vs torch.utils.data.DataLoader + torchvision, and sluice from Python vs Rust.

The same files, the same pipeline (decode, RandomResizedCrop 224, RandomHorizontalFlip,
uint8 output, batches of 64) and the same core counts, in one run:

* ``DataLoader`` over ``torchvision.datasets.ImageFolder`` (PIL decode, torchvision
  transforms v2 on PIL images, then ``PILToTensor``: uint8 CHW), ``num_workers`` = 1 and 2,
  ``persistent_workers=False``, a shuffled epoch;
* ``sluice.Loader`` with 1 and 2 threads (uint8 NHWC);
* ``target/release/sluice bench`` (the same loader driven from Rust) at 1 and 2 threads.

Each measurement is one full epoch (after one warm-up pass per configuration); the
configurations are interleaved within each run, and the median of ``--runs`` runs is
reported, because machines are noisy. Prints a markdown table with images/s and the
ratios sluice/DataLoader (same core count) and sluice-from-Python/Rust.

    .venv/bin/python bench/torch_vs_sluice.py           # data/torch_vs_sluice: 1000 x ~100 KB
    .venv/bin/python bench/torch_vs_sluice.py --runs 5 --threads 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision.transforms import v2

import sluice

REPO = Path(__file__).resolve().parent.parent


def dataloader_epoch(root: str, workers: int, batch: int, seed: int) -> float:
    """Images/s of one shuffled epoch through DataLoader + torchvision (uint8 output)."""
    transform = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor()])
    dataset = torchvision.datasets.ImageFolder(root, transform=transform)
    gen = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=False, generator=gen
    )
    start = time.perf_counter()
    n = 0
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224)
        n += labels.shape[0]
    return n / (time.perf_counter() - start)


def sluice_pipeline(root: str, threads: int, batch: int) -> sluice.Pipeline:
    return (
        sluice.Pipeline.image_folder(root)
        .decode()
        .random_resized_crop(224)
        .random_horizontal_flip()
        .batch(batch)
        .threads(threads)
    )


def sluice_epoch(root: str, threads: int, batch: int, epoch: int) -> float:
    """Images/s of one epoch through sluice.Loader from Python (uint8 NHWC numpy batches;
    enumerating the dataset happens before the clock starts, as in `sluice bench`)."""
    loader = sluice.Loader(sluice_pipeline(root, threads, batch))
    loader.set_epoch(epoch)
    start = time.perf_counter()
    n = 0
    for b in loader:
        assert b.image.dtype.name == "uint8" and b.image.shape[1:] == (224, 224, 3)
        n += b.image.shape[0]
    return n / (time.perf_counter() - start)


def rust_bench(binary: Path, root: str, threads: List[int], batch: int) -> Dict[int, float]:
    """One run of `sluice bench --json` (its pipeline rows): images/s by thread count."""
    cmd = [str(binary), "bench", "--data", root, "--json", "--runs", "1", "--batch", str(batch)]
    cmd += ["--threads", ",".join(map(str, threads))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)["rows"]
    return {int(r["threads"]): float(r["pipeline_img_s"]) for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO / "data" / "torch_vs_sluice"), help="ImageFolder (generated if missing)")
    ap.add_argument("--images", type=int, default=1000, help="images to generate when --data is missing")
    ap.add_argument("--texture", type=int, default=36, help="texture of generated images (36: ~100 KB JPEGs)")
    ap.add_argument("--runs", type=int, default=3, help="runs per configuration; the median is reported")
    ap.add_argument("--threads", default="1,2", help="core counts: DataLoader workers = sluice threads")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sluice-bin", default=str(REPO / "target" / "release" / "sluice"), help="the Rust CLI")
    ap.add_argument("--no-rust", action="store_true", help="skip the Rust `sluice bench` comparison")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()
    cores = [int(t) for t in args.threads.split(",")]

    if not os.path.isdir(args.data):
        print(f"generating {args.images} images in {args.data} ...", file=sys.stderr)
        sluice.generate_dataset(args.data, images=args.images, classes=10, texture=args.texture)
    files = [p for p in Path(args.data).rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    for p in files:  # warm the page cache: both sides read from memory
        p.read_bytes()
    binary = Path(args.sluice_bin)
    use_rust = not args.no_rust and binary.is_file()
    if not args.no_rust and not use_rust:
        print(f"note: {binary} not found (run scripts/setup.sh); skipping the Rust comparison", file=sys.stderr)

    print(
        f"{len(files)} images, {size / len(files) / 1e3:.0f} KB average; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; torch {torch.__version__}, torchvision {torchvision.__version__}, "
        f"sluice {sluice.__version__}; median of {args.runs} runs",
        file=sys.stderr,
    )

    results: Dict[str, Dict[int, List[float]]] = {"dataloader": {}, "sluice": {}, "rust": {}}
    measures: Dict[str, Callable[[int, int], float]] = {
        "dataloader": lambda c, run: dataloader_epoch(args.data, c, args.batch, run),
        "sluice": lambda c, run: sluice_epoch(args.data, c, args.batch, run),
    }
    # Warm-up: one pass of each configuration (imports, page cache, allocator, JIT paths).
    for c in cores:
        for m in measures.values():
            m(c, 0)
    for run in range(args.runs):
        for c in cores:
            for name, m in measures.items():
                v = m(c, run + 1)
                results[name].setdefault(c, []).append(v)
                print(f"run {run + 1}: {name:<10} cores={c}: {v:7.0f} img/s", file=sys.stderr)
        if use_rust:
            for c, v in rust_bench(binary, args.data, cores, args.batch).items():
                results["rust"].setdefault(c, []).append(v)
                print(f"run {run + 1}: {'rust':<10} cores={c}: {v:7.0f} img/s", file=sys.stderr)

    med = {name: {c: statistics.median(v) for c, v in by.items()} for name, by in results.items()}
    print()
    print(f"RandomResizedCrop 224 + flip, uint8, batch {args.batch}, {len(files)} images; images/s, median of {args.runs}")
    print()
    header = "| cores | DataLoader + torchvision | sluice (Python) | sluice / DataLoader |"
    rule = "|---:|---:|---:|---:|"
    if use_rust:
        header += " sluice bench (Rust) | Python / Rust |"
        rule += "---:|---:|"
    print(header)
    print(rule)
    for c in cores:
        dl, sl = med["dataloader"][c], med["sluice"][c]
        row = f"| {c} | {dl:.0f} | {sl:.0f} | {sl / dl:.2f}x |"
        if use_rust:
            rs = med["rust"][c]
            row += f" {rs:.0f} | {sl / rs:.3f} |"
        print(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": results, "median": med, "images": len(files), "batch": args.batch}, f, indent=2)


if __name__ == "__main__":
    main()
