"""sluice vs torch.utils.data.DataLoader + torchvision, and sluice from Python vs Rust.

The same files, the same pipeline (decode, RandomResizedCrop 224, RandomHorizontalFlip,
uint8 output, batches of 64) and the same core counts, in one run:

* ``DataLoader`` over ``torchvision.datasets.ImageFolder`` (PIL decode, torchvision
  transforms v2 on PIL images, then ``PILToTensor``: uint8 CHW), ``num_workers`` = 1 and 2,
  ``persistent_workers=False``, a shuffled epoch;
* ``sluice.Loader`` with 1 and 2 threads (uint8 NHWC);
* ``target/release/sluice-bench engine`` (the same loader driven from Rust) at 1 and 2 threads;

each on the files as generated and on a packed copy (``sluice.pack``: the same pixels, the
JPEGs rewritten losslessly with restart markers so crops decode only what they cover), which
both loaders read.

Each measurement is one full epoch (after one warm-up pass per configuration); the
configurations are interleaved within each run, and the median of ``--runs`` runs is
reported, because machines are noisy. Prints a markdown table with images/s and the
ratios sluice/DataLoader (same core count) and sluice-from-Python/Rust.

    .venv/bin/python bench/torch_vs_sluice.py           # data/torch_vs_sluice: 1000 x ~100 KB JPEGs
    .venv/bin/python bench/torch_vs_sluice.py --runs 5 --threads 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision.transforms import v2

import sluice

REPO = Path(__file__).resolve().parent.parent


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its reaped children (DataLoader
    workers are joined at the end of each epoch when persistent_workers is off)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(epoch: Callable[[], int]) -> Tuple[float, float]:
    """(images per wall second, images per CPU second) of one epoch. CPU seconds are a
    check that holds up on a busy machine, where wall time also counts other work."""
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    n = epoch()
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return n / wall, n / max(cpu, 1e-9)


def dataloader_epoch(root: str, workers: int, batch: int, seed: int) -> int:
    """One shuffled epoch through DataLoader + torchvision (uint8 output); returns images."""
    transform = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor()])
    dataset = torchvision.datasets.ImageFolder(root, transform=transform)
    gen = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=False, generator=gen
    )
    n = 0
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224)
        n += labels.shape[0]
    return n


def sluice_pipeline(root: str, threads: int, batch: int) -> sluice.Pipeline:
    return (
        sluice.Pipeline.image_folder(root)
        .decode()
        .random_resized_crop(224)
        .random_horizontal_flip()
        .batch(batch)
        .threads(threads)
    )


def sluice_loader(root: str, threads: int, batch: int, epoch: int) -> sluice.Loader:
    """A loader at `epoch` (enumerating the dataset happens before the clock starts, as in
    `sluice-bench engine`)."""
    loader = sluice.Loader(sluice_pipeline(root, threads, batch))
    loader.set_epoch(epoch)
    return loader


def sluice_epoch(loader: sluice.Loader) -> int:
    """One epoch through sluice.Loader from Python (uint8 NHWC numpy batches)."""
    n = 0
    for b in loader:
        assert b.image.dtype.name == "uint8" and b.image.shape[1:] == (224, 224, 3)
        n += b.image.shape[0]
    return n


def rust_bench(binary: Path, root: str, threads: List[int], batch: int) -> Dict[int, float]:
    """One run of `sluice-bench engine --json` (its pipeline rows): images/s by thread count."""
    cmd = [str(binary), "engine", "--data", root, "--json", "--runs", "1", "--batch", str(batch)]
    cmd += ["--threads", ",".join(map(str, threads))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)["rows"]
    return {int(r["threads"]): float(r["pipeline_img_s"]) for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO / "data" / "torch_vs_sluice"), help="ImageFolder (generated if missing)")
    ap.add_argument("--images", type=int, default=1000, help="images to generate when --data is missing")
    ap.add_argument("--texture", type=int, default=None, help="texture of generated images (default: ~100 KB JPEGs)")
    ap.add_argument("--runs", type=int, default=3, help="runs per configuration; the median is reported")
    ap.add_argument("--threads", default="1,2", help="core counts: DataLoader workers = sluice threads")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument(
        "--sluice-bench-bin", default=str(REPO / "target" / "release" / "sluice-bench"), help="the Rust benchmarks"
    )
    ap.add_argument("--no-rust", action="store_true", help="skip the Rust `sluice-bench engine` comparison")
    ap.add_argument("--no-packed", action="store_true", help="skip the packed copy of the dataset (DATA-packed)")
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
    binary = Path(args.sluice_bench_bin)
    use_rust = not args.no_rust and binary.is_file()
    if not args.no_rust and not use_rust:
        print(f"note: {binary} not found (run scripts/setup.sh); skipping the Rust comparison", file=sys.stderr)

    print(
        f"{len(files)} images, {size / len(files) / 1e3:.0f} KB average; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; torch {torch.__version__}, torchvision {torchvision.__version__}, "
        f"sluice {sluice.__version__}; median of {args.runs} runs",
        file=sys.stderr,
    )

    # The same files as they are, and packed (`sluice.pack`: the same pixels, JPEGs rewritten
    # with restart markers); both loaders run on both.
    datasets = {"original": args.data}
    if not args.no_packed:
        packed = args.data.rstrip("/") + "-packed"
        if not os.path.isdir(packed):
            print(f"packing {args.data} into {packed} ...", file=sys.stderr)
            sluice.pack(args.data, packed)
        for p in Path(packed).rglob("*"):
            if p.is_file():
                p.read_bytes()
        datasets["packed"] = packed

    results: Dict[str, Dict[int, List[float]]] = {}
    per_cpu: Dict[str, Dict[int, List[float]]] = {}

    def measure_dataloader(root: str, c: int, run: int) -> Tuple[float, float]:
        return timed(lambda: dataloader_epoch(root, c, args.batch, run))

    def measure_sluice(root: str, c: int, run: int) -> Tuple[float, float]:
        loader = sluice_loader(root, c, args.batch, run)
        return timed(lambda: sluice_epoch(loader))

    measures: Dict[str, Callable[[str, int, int], Tuple[float, float]]] = {
        "dataloader": measure_dataloader,
        "sluice": measure_sluice,
    }
    # Warm-up: one pass of each configuration (imports, page cache, allocator, JIT paths).
    for root in datasets.values():
        for c in cores:
            for m in measures.values():
                m(root, c, 0)
    for run in range(args.runs):
        for ds, root in datasets.items():
            for c in cores:
                for name, m in measures.items():
                    v, per = m(root, c, run + 1)
                    results.setdefault(f"{name}/{ds}", {}).setdefault(c, []).append(v)
                    per_cpu.setdefault(f"{name}/{ds}", {}).setdefault(c, []).append(per)
                    print(f"run {run + 1}: {name:<10} {ds:<8} cores={c}: {v:7.0f} img/s, {per:5.0f} img/CPU-s", file=sys.stderr)
            if use_rust:
                for c, v in rust_bench(binary, root, cores, args.batch).items():
                    results.setdefault(f"rust/{ds}", {}).setdefault(c, []).append(v)
                    print(f"run {run + 1}: {'rust':<10} {ds:<8} cores={c}: {v:7.0f} img/s", file=sys.stderr)

    med = {name: {c: statistics.median(v) for c, v in by.items()} for name, by in results.items()}
    med_cpu = {name: {c: statistics.median(v) for c, v in by.items()} for name, by in per_cpu.items()}
    print()
    print(f"RandomResizedCrop 224 + flip, uint8, batch {args.batch}, {len(files)} images; images/s, median of {args.runs}")
    print()
    header = "| files | cores | DataLoader + torchvision | sluice (Python) | sluice / DataLoader |"
    rule = "|---|---:|---:|---:|---:|"
    if use_rust:
        header += " sluice-bench engine (Rust) | Python / Rust |"
        rule += "---:|---:|"
    print(header)
    print(rule)
    for ds in datasets:
        for c in cores:
            dl, sl = med[f"dataloader/{ds}"][c], med[f"sluice/{ds}"][c]
            row = f"| {ds} | {c} | {dl:.0f} | {sl:.0f} | {sl / dl:.2f}x |"
            if use_rust:
                rs = med[f"rust/{ds}"][c]
                row += f" {rs:.0f} | {sl / rs:.3f} |"
            print(row)
    if "packed" in datasets:
        print()
        print("sluice on packed files vs DataLoader on the original files (what a user switching gets):")
        print()
        for c in cores:
            dl, sl = med["dataloader/original"][c], med["sluice/packed"][c]
            print(f"- {c} cores: {sl:.0f} vs {dl:.0f} img/s = {sl / dl:.2f}x")
    print()
    print("Per CPU second (all threads and worker processes; less sensitive to a busy machine):")
    print()
    print("| files | cores | DataLoader img/CPU-s | sluice img/CPU-s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for ds in datasets:
        for c in cores:
            dl, sl = med_cpu[f"dataloader/{ds}"][c], med_cpu[f"sluice/{ds}"][c]
            print(f"| {ds} | {c} | {dl:.0f} | {sl:.0f} | {sl / dl:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"runs": results, "per_cpu_runs": per_cpu, "median": med, "median_per_cpu": med_cpu,
                 "images": len(files), "batch": args.batch, "datasets": datasets},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
