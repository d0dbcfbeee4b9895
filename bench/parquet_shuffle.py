"""Exact global shuffle over Parquet vs the same JPEGs as loose files, and vs Hugging Face
``datasets`` reading the same Parquet through a torch DataLoader.

The same images (``sluice.generate_dataset``: ~500x375, ~100 KB JPEGs), the same pipeline
(decode, RandomResizedCrop 224, RandomHorizontalFlip, uint8 out, batches of 64), the same
core count, one shuffled epoch per measurement, in one run:

* ``files``: ``sluice.Pipeline.image_folder`` over the loose JPEGs;
* ``parquet``: ``sluice.Pipeline.parquet`` over the same images written by ``datasets``
  (``Dataset.to_parquet``, the Hub's layout: ``image`` a struct ``{bytes, path}``, ``label``
  int64, row groups of 100 rows as ``datasets`` writes image datasets), with the default
  row-group window (``SLUICE_PARQUET_CACHE_MB`` = 256, which holds this dataset);
* ``parquet-window-N``: the same with a window of N MiB (``--small-window``, default 16:
  ~15% of the dataset, so most samples miss it). ``datasets`` >= 4 writes an offset index
  and content-defined pages of ~1 MB (~10 rows), so a miss reads one page;
* ``parquet-noindex-window-N``: the same images written by ``datasets`` without the page
  index (``write_page_index=False``): the pages are found by their headers;
* ``parquet-onepage-window-N``: written without content-defined chunking either (what
  older ``datasets`` wrote): one ~10 MB page per row group, so a miss reads it all;
* ``datasets``: ``datasets.Dataset.from_parquet`` of the same file, ``with_transform``
  doing PIL decode + torchvision transforms v2 + ``PILToTensor``, through
  ``torch.utils.data.DataLoader(shuffle=True, num_workers=cores)``.

Configurations are interleaved within each run; the median of ``--runs`` runs is printed
as a markdown table of images/s and ratios against ``files`` and ``datasets``.

    .venv/bin/python bench/parquet_shuffle.py --runs 5      # data/parquet_bench, 1000 images
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import sluice
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

REPO = Path(__file__).resolve().parent.parent
SIZE, BATCH = 224, 64


def prepare(data: Path, images: int) -> Path:
    """The loose JPEGs under ``data/train`` and their Parquet file (made once)."""
    root = data / "train"
    if not root.exists():
        sluice.generate_dataset(root, images=images, classes=10, seed=0)
    out = data / "parquet" / "train-00000-of-00001.parquet"
    if not out.exists():
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        rows = [
            (p, i)
            for i, c in enumerate(classes)
            for p in sorted((root / c).glob("*.jpg"))
        ]
        features = datasets.Features(
            {"image": datasets.Image(), "label": datasets.Value("int64")}
        )
        ds = datasets.Dataset.from_dict(
            {
                "image": [{"bytes": p.read_bytes(), "path": p.name} for p, _ in rows],
                "label": [i for _, i in rows],
            },
            features=features,
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(out), batch_size=100)
        ds.to_parquet(
            str(variant(data, "noindex")), batch_size=100, write_page_index=False
        )
        ds.to_parquet(
            str(variant(data, "onepage")),
            batch_size=100,
            write_page_index=False,
            use_content_defined_chunking=False,
        )
    return root


def variant(data: Path, name: str) -> Path:
    """The same rows written another way (see the module docs)."""
    out = data / f"parquet-{name}" / "train-00000-of-00001.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def sluice_epoch(
    source: sluice.Pipeline, threads: int, seed: int, window_mb: int
) -> Callable[[], int]:
    os.environ["SLUICE_PARQUET_CACHE_MB"] = str(window_mb)
    pipe = (
        source.decode()
        .random_resized_crop(SIZE)
        .random_horizontal_flip()
        .batch(BATCH)
        .seed(seed)
        .threads(threads)
    )
    loader = sluice.Loader(pipe)  # the window is read when the loader is made

    def run() -> int:
        return sum(len(b.key) for b in loader)

    return run


def hf_epoch(parquet: Path, workers: int) -> Callable[[], int]:
    ds = datasets.Dataset.from_parquet(str(parquet))
    tf = v2.Compose(
        [
            v2.RandomResizedCrop(SIZE, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
        ]
    )

    def transform(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        images = [
            tf(Image.open(io.BytesIO(im["bytes"])).convert("RGB"))
            for im in batch["image"]
        ]
        return {"image": images, "label": batch["label"]}

    ds = ds.cast_column("image", datasets.Image(decode=False)).with_transform(transform)

    def collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return {
            "image": torch.stack([r["image"] for r in rows]),
            "label": torch.tensor([r["label"] for r in rows]),
        }

    loader = DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, collate_fn=collate
    )

    def run() -> int:
        return sum(len(b["label"]) for b in loader)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, default=REPO / "data" / "parquet_bench")
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument(
        "--small-window",
        type=int,
        default=16,
        help="MiB of decoded row groups for the small window",
    )
    a = ap.parse_args()
    root = prepare(a.data, a.images)
    parquet = a.data / "parquet" / "train-00000-of-00001.parquet"
    small = f"parquet-window-{a.small_window}"
    configs: dict[str, Callable[[int], Callable[[], int]]] = {
        "files": lambda run: sluice_epoch(
            sluice.Pipeline.image_folder(root), a.cores, run, 256
        ),
        "parquet": lambda run: sluice_epoch(
            sluice.Pipeline.parquet(parquet), a.cores, run, 256
        ),
        small: lambda run: sluice_epoch(
            sluice.Pipeline.parquet(parquet), a.cores, run, a.small_window
        ),
        f"parquet-noindex-window-{a.small_window}": lambda run: sluice_epoch(
            sluice.Pipeline.parquet(variant(a.data, "noindex")),
            a.cores,
            run,
            a.small_window,
        ),
        f"parquet-onepage-window-{a.small_window}": lambda run: sluice_epoch(
            sluice.Pipeline.parquet(variant(a.data, "onepage")),
            a.cores,
            run,
            a.small_window,
        ),
        "datasets": lambda run: hf_epoch(parquet, a.cores),
    }
    rates: dict[str, list[float]] = {k: [] for k in configs}
    for (
        name,
        make,
    ) in configs.items():  # one warm-up epoch each (page cache, worker start-up)
        make(99)()
    for run in range(a.runs):
        for name, make in configs.items():
            epoch = make(run)
            t0 = time.perf_counter()
            n = epoch()
            rates[name].append(n / (time.perf_counter() - t0))
            print(f"run {run} {name}: {rates[name][-1]:.0f} img/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"\nmedian of {a.runs} runs, {a.cores} cores, {a.images} images ({time.strftime('%Y-%m-%d %H:%M')}):\n"
    )
    print("| configuration | img/s | / files | / datasets |")
    print("|---|---:|---:|---:|")
    for k, v in med.items():
        print(f"| {k} | {v:.0f} | {v / med['files']:.2f} | {v / med['datasets']:.2f} |")


if __name__ == "__main__":
    main()
