"""Detection training fed by sluice: ``detection_torchvision.py`` with the two statements
marked ``# data`` changed (and its dataset class and collate function, which sluice does
not need, left out), and nothing else.

COCO-style data: decode (of the crop window only, for JPEGs), RandomResizedCrop with the
boxes moved, clamped and those under a pixel dropped, horizontal flip, on sluice's
threads, feeding the same small Faster R-CNN::

    sluice gen-images --images 64 --boxes --out /tmp/det
    python python/examples/detection_sluice.py --annotations /tmp/det/instances.json --images /tmp/det

The change from the torchvision version: the ``v2.Compose`` becomes
``sluice.Pipeline.coco(...).decode().random_resized_crop(...).random_horizontal_flip()
.dtype("f32").layout("chw")`` and the ``DataLoader`` a ``SluiceDataset`` of the fields
``image, boxes, box_labels, box_count``, which are already what ``pad_boxes`` makes.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.ops import MultiScaleRoIAlign

import sluice
from sluice.torch import SluiceDataset


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

    transform = (  # data
        sluice.Pipeline.coco(args.annotations, args.images)
        .decode()
        .random_resized_crop(size, scale=(0.3, 1.0))
        .random_horizontal_flip()
        .dtype("f32")
        .layout("chw")
    )
    loader = SluiceDataset(  # data
        transform.batch(args.batch, drop_last=True).threads(args.workers),
        fields=("image", "boxes", "box_labels", "box_count"),
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
