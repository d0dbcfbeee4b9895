"""A training recipe on sluice vs DataLoader + torchvision v2, and vs sluice's plain crop.

Issue 26's recipe goal: RandomResizedCrop 224 + RandomHorizontalFlip + TrivialAugmentWide +
RandomErasing, uint8 output, batches of 64, on the bench set (bench/torch_vs_sluice.py's
``data/torch_vs_sluice``), at the same core counts:

* ``DataLoader`` over ``torchvision.datasets.ImageFolder`` with torchvision's classification
  preset order (crop, flip and TrivialAugmentWide on the PIL image, ``PILToTensor``, then
  ``RandomErasing`` on the uint8 tensor), ``num_workers`` = 1 and 2;
* ``sluice.Loader`` with the same recipe (``random_erasing`` on the uint8 output), 1 and 2
  threads;
* ``sluice.Loader`` with the plain RandomResizedCrop + flip pipeline (the goal: the recipe
  within 25% of it).

Each measurement is one full epoch after one warm-up pass per configuration; the
configurations are interleaved within each run and the median of ``--runs`` runs is
reported (machines are noisy), with images per CPU second as a second view. Prints a
markdown table; ``--json`` writes every run.

    .venv/bin/python bench/recipe.py --runs 5 --json recipe.json
    .venv/bin/python bench/recipe.py --quick          # a small generated set, one run: a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import sluice
import torch
import torchvision
from torch.utils.data import DataLoader

# The peer benchmark's helpers: the epoch timer (wall and CPU) and the plain sluice pipeline.
from torch_vs_sluice import REPO, sluice_epoch, sluice_pipeline, timed
from torchvision.transforms import v2


def dataloader_epoch(root: str, workers: int, batch: int, seed: int) -> int:
    """One shuffled epoch through DataLoader + torchvision with the recipe; returns images."""
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.TrivialAugmentWide(),
            v2.PILToTensor(),
            v2.RandomErasing(),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(root, transform=transform)
    gen = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        persistent_workers=False,
        generator=gen,
    )
    n = 0
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224)
        n += labels.shape[0]
    return n


def recipe_pipeline(root: str, threads: int, batch: int) -> sluice.Pipeline:
    return (
        sluice.Pipeline.image_folder(root)
        .decode()
        .random_resized_crop(224)
        .random_horizontal_flip()
        .trivial_augment_wide()
        .random_erasing()
        .batch(batch)
        .threads(threads)
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--data",
        default=str(REPO / "data" / "torch_vs_sluice"),
        help="ImageFolder (generated if missing)",
    )
    ap.add_argument(
        "--images",
        type=int,
        default=1000,
        help="images to generate when --data is missing",
    )
    ap.add_argument(
        "--runs",
        type=int,
        default=3,
        help="runs per configuration; the median is reported",
    )
    ap.add_argument(
        "--threads",
        default="1,2",
        help="core counts: DataLoader workers = sluice threads",
    )
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 64 small generated images, one run, 1 core",
    )
    args = ap.parse_args()
    if args.quick:
        args.data = os.path.join(tempfile.mkdtemp(prefix="sluice-recipe-"), "train")
        args.images, args.runs, args.threads, args.batch = 64, 1, "1", 16
    cores = [int(t) for t in args.threads.split(",")]

    if not os.path.isdir(args.data):
        print(f"generating {args.images} images in {args.data} ...", file=sys.stderr)
        sluice.generate_dataset(
            args.data, images=args.images, classes=4 if args.quick else 10
        )
    files = [p for p in Path(args.data).rglob("*") if p.is_file()]
    for p in files:  # warm the page cache: every loader reads from memory
        p.read_bytes()
    print(
        f"{len(files)} images; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"torch {torch.__version__}, torchvision {torchvision.__version__}, sluice {sluice.__version__}; "
        f"median of {args.runs} runs",
        file=sys.stderr,
    )

    def measure_dataloader(c: int, run: int) -> tuple[float, float]:
        return timed(lambda: dataloader_epoch(args.data, c, args.batch, run))

    def measure(
        build: Callable[[str, int, int], sluice.Pipeline],
    ) -> Callable[[int, int], tuple[float, float]]:
        def go(c: int, run: int) -> tuple[float, float]:
            # Enumerating the dataset happens before the clock starts.
            loader = sluice.Loader(build(args.data, c, args.batch))
            loader.set_epoch(run)
            return timed(lambda: sluice_epoch(loader))

        return go

    measures: dict[str, Callable[[int, int], tuple[float, float]]] = {
        "dataloader_recipe": measure_dataloader,
        "sluice_recipe": measure(recipe_pipeline),
        "sluice_plain": measure(sluice_pipeline),
    }
    for c in cores:  # warm-up
        for m in measures.values():
            m(c, 0)
    results: dict[str, dict[int, list[float]]] = {}
    per_cpu: dict[str, dict[int, list[float]]] = {}
    for run in range(args.runs):
        for c in cores:
            for name, m in measures.items():
                v, per = m(c, run + 1)
                results.setdefault(name, {}).setdefault(c, []).append(v)
                per_cpu.setdefault(name, {}).setdefault(c, []).append(per)
                print(
                    f"run {run + 1}: {name:<18} cores={c}: {v:7.0f} img/s, {per:5.0f} img/CPU-s",
                    file=sys.stderr,
                )

    med = {
        name: {c: statistics.median(v) for c, v in by.items()}
        for name, by in results.items()
    }
    med_cpu = {
        name: {c: statistics.median(v) for c, v in by.items()}
        for name, by in per_cpu.items()
    }
    print()
    print(
        f"RandomResizedCrop 224 + flip + TrivialAugmentWide + RandomErasing, uint8, batch {args.batch}, "
        f"{len(files)} images; images/s, median of {args.runs} (images per CPU second in brackets)"
    )
    print()
    print(
        "| cores | DataLoader + torchvision | sluice recipe | sluice / DataLoader | sluice plain RRC+flip | recipe / plain |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for c in cores:
        dl, sr, sp = (
            med["dataloader_recipe"][c],
            med["sluice_recipe"][c],
            med["sluice_plain"][c],
        )
        cdl, csr, csp = (
            med_cpu[k][c]
            for k in ("dataloader_recipe", "sluice_recipe", "sluice_plain")
        )
        print(
            f"| {c} | {dl:.0f} ({cdl:.0f}) | {sr:.0f} ({csr:.0f}) | {sr / dl:.2f}x | {sp:.0f} ({csp:.0f}) | {sr / sp:.2f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "runs": results,
                    "per_cpu_runs": per_cpu,
                    "median": med,
                    "median_per_cpu": med_cpu,
                    "images": len(files),
                    "batch": args.batch,
                    "data": args.data,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
