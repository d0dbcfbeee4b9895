"""The COCO-style detection pipeline: sluice vs DataLoader + torchvision v2 with tv_tensors.

The same generated data (``sluice gen-images --boxes``: ImageNet-like JPEGs, ~500x375,
with their shapes' boxes in ``instances.json``), the same pipeline (decode,
RandomResizedCrop to ``--size`` with scale (0.3, 1), RandomHorizontalFlip, the boxes moved,
clamped and those under a pixel dropped, uint8 images and padded boxes in batches of
``--batch``) and the same core counts:

* ``DataLoader`` over ``python/examples/detection_torchvision.py``'s ``CocoBoxes``
  (``torchvision.io`` decode to a ``tv_tensors.Image``, boxes as
  ``tv_tensors.BoundingBoxes``; v2 ``RandomResizedCrop``, ``RandomHorizontalFlip``,
  ``SanitizeBoundingBoxes``; its ``pad_boxes`` collate), ``num_workers`` = cores;
* ``sluice.Loader`` over ``Pipeline.coco`` with ``threads`` = cores.

Each measurement is one shuffled epoch after a warm-up epoch per configuration; the
configurations are interleaved within each run and the median of ``--runs`` runs is
reported, with sluice / DataLoader at the same core count. Needs the release build
(``maturin develop --release``).

    .venv/bin/python bench/detection.py                    # data/detection: 400 images
    .venv/bin/python bench/detection.py --runs 5 --cores 1,2
    .venv/bin/python bench/detection.py --crop iou   # SSD's RandomIoUCrop instead
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sluice
import torch
from sluice import _sluice
from torch.utils.data import DataLoader
from torchvision.transforms import v2

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python" / "examples"))
from detection_torchvision import CocoBoxes, pad_boxes


def dataloader_epoch(root: Path, cores: int, size: int, batch: int, crop: str) -> int:
    if crop == "iou":
        # SSD's crop: its size depends on the draw, so a resize and a centre crop follow.
        crops: list[v2.Transform] = [
            v2.RandomIoUCrop(),
            v2.Resize(size, antialias=True),
            v2.CenterCrop(size),
        ]
    else:
        crops = [v2.RandomResizedCrop(size, scale=(0.3, 1.0), antialias=True)]
    transform = v2.Compose(
        [*crops, v2.RandomHorizontalFlip(), v2.SanitizeBoundingBoxes(min_size=1)]
    )
    data = CocoBoxes(str(root / "instances.json"), str(root), transform)
    loader = DataLoader(
        data, batch_size=batch, shuffle=True, num_workers=cores, collate_fn=pad_boxes
    )
    n = 0
    for images, boxes, _labels, _counts in loader:
        n += images.shape[0]
        assert boxes.shape[0] == images.shape[0]
    return n


def sluice_epoch(
    root: Path, cores: int, size: int, batch: int, seed: int, crop: str
) -> int:
    pipe = sluice.Pipeline.coco(root / "instances.json", root).decode()
    if crop == "iou":
        pipe = pipe.random_iou_crop().resize(size).center_crop(size)
    else:
        pipe = pipe.random_resized_crop(size, scale=(0.3, 1.0))
    pipe = pipe.random_horizontal_flip().batch(batch).threads(cores).seed(seed)
    n = 0
    for b in sluice.Loader(pipe):
        n += b.size
        assert b.boxes.shape[0] == b.size
    return n


def rate(epoch: Callable[[], int]) -> float:
    t0 = time.perf_counter()
    n = epoch()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, default=REPO / "data" / "detection")
    ap.add_argument(
        "--images",
        type=int,
        default=400,
        help="images to generate when --data is missing",
    )
    ap.add_argument(
        "--cores", default="1,2", help="DataLoader workers = sluice threads"
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", type=int, default=384)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument(
        "--crop",
        choices=["rrc", "iou"],
        default="rrc",
        help="RandomResizedCrop, or RandomIoUCrop + Resize + CenterCrop",
    )
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not (a.data / "instances.json").exists():
        _sluice.generate_dataset(str(a.data), images=a.images, boxes=True)
    cores = [int(c) for c in a.cores.split(",")]
    configs: list[tuple[str, int]] = [
        (kind, c) for c in cores for kind in ("dataloader", "sluice")
    ]

    def epoch(kind: str, c: int, seed: int) -> float:
        if kind == "dataloader":
            return rate(lambda: dataloader_epoch(a.data, c, a.size, a.batch, a.crop))
        return rate(lambda: sluice_epoch(a.data, c, a.size, a.batch, seed, a.crop))

    for kind, c in configs:  # warm-up: page cache, imports, worker start-up code paths
        epoch(kind, c, 0)
    rates: dict[tuple[str, int], list[float]] = {k: [] for k in configs}
    for run in range(a.runs):
        order = configs if run % 2 == 0 else configs[::-1]
        for kind, c in order:
            rates[(kind, c)].append(epoch(kind, c, run + 1))
            print(
                f"run {run}: {kind} {c} core(s): {rates[(kind, c)][-1]:.1f} img/s",
                file=sys.stderr,
            )
    n = len(CocoBoxes(str(a.data / "instances.json"), str(a.data), None))
    crop_name = {
        "rrc": "RandomResizedCrop",
        "iou": "RandomIoUCrop + Resize + CenterCrop",
    }[a.crop]
    print(
        f"\n{n} images, {crop_name} {a.size} + flip + boxes, batches of {a.batch}, median of {a.runs} runs\n"
    )
    print(
        "| cores | DataLoader + torchvision v2 (img/s) | sluice (img/s) | sluice / DataLoader |"
    )
    print("|---:|---:|---:|---:|")
    for c in cores:
        dl, sl = (
            statistics.median(rates[("dataloader", c)]),
            statistics.median(rates[("sluice", c)]),
        )
        print(f"| {c} | {dl:.0f} | {sl:.0f} | {sl / dl:.2f}x |")


if __name__ == "__main__":
    main()
