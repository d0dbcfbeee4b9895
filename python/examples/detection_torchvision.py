"""Detection training with torchvision v2 and a DataLoader, in the style of torchvision's
detection references: the reference for ``detection_sluice.py``, which differs from this
file in the statements marked ``# data``.

COCO-style data (an ``instances_*.json`` and its image folder): decode, RandomResizedCrop
(boxes moved with the crop, clamped, those under a pixel dropped), horizontal flip, to a
fixed size, feeding a small Faster R-CNN (torchvision's, with a tiny backbone)::

    sluice gen-images --images 64 --boxes --out /tmp/det
    python python/examples/detection_torchvision.py --annotations /tmp/det/instances.json --images /tmp/det
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.io import ImageReadMode, decode_image, read_file
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.ops import MultiScaleRoIAlign
from torchvision.transforms import v2


class CocoBoxes(Dataset):  # data
    """COCO images with their XYXY boxes as ``tv_tensors`` (what
    ``wrap_dataset_for_transforms_v2(CocoDetection(...))`` gives, without pycocotools)."""

    def __init__(self, annotations: str, images: str, transform: Any) -> None:
        coco = json.loads(Path(annotations).read_text())
        self.images = sorted(coco["images"], key=lambda i: i["id"])
        self.boxes: Dict[int, List[Tuple[List[float], int]]] = {i["id"]: [] for i in self.images}
        for a in coco["annotations"]:
            x, y, w, h = a["bbox"]
            self.boxes[a["image_id"]].append(([x, y, x + w, y + h], a["category_id"]))
        self.root, self.transform = Path(images), transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> Tuple[Any, Dict[str, Any]]:
        info = self.images[i]
        img = decode_image(read_file(str(self.root / info["file_name"])), mode=ImageReadMode.RGB)
        anns = self.boxes[info["id"]]
        boxes = torch.tensor([b for b, _ in anns], dtype=torch.float32).reshape(-1, 4)
        target = {
            "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=img.shape[-2:]),
            "labels": torch.tensor([c for _, c in anns], dtype=torch.int64),
        }
        return self.transform(tv_tensors.Image(img), target)


def pad_boxes(batch: List[Tuple[Any, Dict[str, Any]]]) -> Tuple[torch.Tensor, ...]:  # data
    """Stacks the images and pads the boxes as sluice's batches carry them."""
    images = torch.stack([img for img, _ in batch])
    most = max(1, max(len(t["boxes"]) for _, t in batch))
    boxes = torch.zeros(len(batch), most, 4)
    labels = torch.full((len(batch), most), -1, dtype=torch.int64)
    for i, (_, t) in enumerate(batch):
        boxes[i, : len(t["boxes"])] = t["boxes"]
        labels[i, : len(t["labels"])] = t["labels"]
    counts = torch.tensor([len(t["boxes"]) for _, t in batch], dtype=torch.int32)
    return images, boxes, labels, counts


def tiny_faster_rcnn(classes: int, size: int) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    backbone = nn.Sequential(block(3, 16), block(16, 32), block(32, 32), block(32, 32))
    backbone.out_channels = 32  # type: ignore[assignment]
    anchors = AnchorGenerator(sizes=((16, 32, 64),), aspect_ratios=((0.5, 1.0, 2.0),))
    pool = MultiScaleRoIAlign(featmap_names=["0"], output_size=7, sampling_ratio=2)
    return FasterRCNN(
        backbone,
        num_classes=classes + 1,
        rpn_anchor_generator=anchors,
        box_roi_pool=pool,
        min_size=size,
        max_size=size,
        representation_size=64,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--annotations", required=True, help="COCO instances_*.json")
    ap.add_argument("--images", required=True, help="the folder its file_names are in")
    ap.add_argument("--classes", type=int, default=10, help="category ids are 0..classes-1")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop each epoch after this many batches (0: all)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    size = args.size

    transform = v2.Compose(  # data
        [
            v2.RandomResizedCrop(size, scale=(0.3, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.SanitizeBoundingBoxes(min_size=1),
            v2.ToDtype(torch.float32, scale=True),
        ]
    )
    loader = DataLoader(  # data
        CocoBoxes(args.annotations, args.images, transform),
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        drop_last=True,
        collate_fn=pad_boxes,
    )

    device = torch.device(args.device)
    model = tiny_faster_rcnn(args.classes, size).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    steps, loss = 0, math.nan
    model.train()
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        for step, (images, boxes, labels, counts) in enumerate(loader):
            if args.steps and step == args.steps:
                break
            # Background is class 0 in torchvision's detectors: labels move up by one.
            targets = [
                {"boxes": b[:n].to(device), "labels": (lab[:n] + 1).to(device)}
                for b, lab, n in zip(boxes, labels, counts.tolist())
            ]
            losses = model(list(images.to(device)), targets)
            out = sum(losses.values())
            opt.zero_grad(set_to_none=True)
            out.backward()
            opt.step()
            steps, loss = steps + 1, out.item()
        print(f"epoch {epoch}: loss {loss:.3f}, {time.perf_counter() - t0:.1f}s")
    print(f"trained {steps} batches, final loss {loss:.4f}")


if __name__ == "__main__":
    main()
