"""CIFAR-style training fed by sluice: ``cifar_torchvision.py`` with the two lines marked
``# data`` changed, and nothing else.

RandomCrop(32, padding=4) + flip per image (native, on sluice's threads; the crop reads its
window straight from the image, never building the padded one), on an ImageFolder of 32x32
images (CIFAR-10 written out as PNGs, one folder per class)::

    python python/examples/cifar_sluice.py --data /path/to/cifar10/train --epochs 200

The change from the torchvision version (``diff cifar_torchvision.py cifar_sluice.py``)::

    -    transform = v2.Compose([v2.ToImage(), v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(),
    -                            v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    +    transform = (sluice.Pipeline.image_folder(args.data).decode().random_crop(32, padding=4)
    +                 .random_horizontal_flip().normalize(MEAN, STD).layout("chw"))
    -    loader = DataLoader(ImageFolder(args.data, transform), batch_size=args.batch, shuffle=True,
    -                        num_workers=args.workers, drop_last=True)
    +    loader = SluiceDataset(transform.batch(args.batch, drop_last=True).threads(args.workers),
    +                           fields=("image", "label"))

(and the imports). The pipeline shuffles every epoch by default, as ``shuffle=True`` does.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

import sluice
from sluice.torch import SluiceDataset

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def small_cnn(classes: int) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(block(3, 16), block(16, 32), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="ImageFolder root (class folders of images)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop each epoch after this many batches (0: all)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    classes = sum(entry.is_dir() for entry in os.scandir(args.data))

    transform = (  # data
        sluice.Pipeline.image_folder(args.data)
        .decode()
        .random_crop(32, padding=4)
        .random_horizontal_flip()
        .normalize(MEAN, STD)
        .layout("chw")
    )
    loader = SluiceDataset(  # data
        transform.batch(args.batch, drop_last=True).threads(args.workers), fields=("image", "label")
    )

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
            out = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            out.backward()
            opt.step()
            steps, loss = steps + 1, out.item()
        print(f"epoch {epoch}: loss {loss:.3f}, {time.perf_counter() - t0:.1f}s")
    print(f"trained {steps} batches, final loss {loss:.4f}")


if __name__ == "__main__":
    main()
