"""ImageNet-style training with torchvision v2 and a DataLoader: the reference for
``imagenet_sluice.py``, which differs from this file in the lines marked ``# data``.

RandomResizedCrop + flip + TrivialAugmentWide + RandomErasing per image (in the DataLoader's
worker processes), MixUp or CutMix per batch::

    python python/examples/imagenet_torchvision.py --data /path/to/imagenet/train --epochs 90
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def small_cnn(classes: int) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(block(3, 16), block(16, 32), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="ImageFolder root (class folders of images)")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop each epoch after this many batches (0: all)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    classes = sum(entry.is_dir() for entry in os.scandir(args.data))

    transform = v2.Compose(  # data
        [
            v2.ToImage(),
            v2.RandomResizedCrop(args.size),
            v2.RandomHorizontalFlip(),
            v2.TrivialAugmentWide(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
            v2.RandomErasing(p=0.25),
        ]
    )
    loader = DataLoader(  # data
        ImageFolder(args.data, transform),
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        drop_last=True,
    )
    mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes), v2.CutMix(alpha=1.0, num_classes=classes)])  # data

    device = torch.device(args.device)
    model = small_cnn(classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps, loss = 0, math.nan
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        for step, (images, labels) in enumerate(loader):
            if args.steps and step == args.steps:
                break
            images, labels = images.to(device), labels.to(device)
            images, targets = mix(images, labels)
            out = F.cross_entropy(model(images), targets)
            opt.zero_grad(set_to_none=True)
            out.backward()
            opt.step()
            steps, loss = steps + 1, out.item()
        print(f"epoch {epoch}: loss {loss:.3f}, {time.perf_counter() - t0:.1f}s")
    print(f"trained {steps} batches, final loss {loss:.4f}")


if __name__ == "__main__":
    main()
