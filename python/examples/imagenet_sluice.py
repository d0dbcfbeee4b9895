"""ImageNet-style training fed by sluice: ``imagenet_torchvision.py`` with the lines
marked ``# data`` changed, and nothing else.

RandomResizedCrop + flip + TrivialAugmentWide + RandomErasing per image (native, on
sluice's threads, each op with torchvision v2's semantics), MixUp or CutMix per batch (on
the batch where it is, seeded per batch so a resumed run mixes the same way)::

    python python/examples/imagenet_sluice.py --data /path/to/imagenet/train --epochs 90

The change from the torchvision version (``diff imagenet_torchvision.py imagenet_sluice.py``)::

    -    transform = v2.Compose([v2.ToImage(), v2.RandomResizedCrop(args.size), v2.RandomHorizontalFlip(),
    -                            v2.TrivialAugmentWide(), v2.ToDtype(torch.float32, scale=True),
    -                            v2.Normalize(MEAN, STD), v2.RandomErasing(p=0.25)])
    +    transform = (sluice.Pipeline.image_folder(args.data).decode().random_resized_crop(args.size)
    +                 .random_horizontal_flip().trivial_augment_wide().normalize(MEAN, STD)
    +                 .layout("chw").random_erasing(p=0.25))
    -    loader = DataLoader(ImageFolder(args.data, transform), batch_size=args.batch, shuffle=True,
    -                        num_workers=args.workers, drop_last=True)
    +    loader = SluiceDataset(transform.batch(args.batch, drop_last=True).threads(args.workers),
    +                           fields=("image", "label"))
    -    mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes), v2.CutMix(alpha=1.0, num_classes=classes)])
    +    mix = MixUpOrCutMix(mixup_alpha=0.2, cutmix_alpha=1.0, num_classes=classes)

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
from sluice.mix import MixUpOrCutMix
from sluice.torch import SluiceDataset

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

    transform = (  # data
        sluice.Pipeline.image_folder(args.data)
        .decode()
        .random_resized_crop(args.size)
        .random_horizontal_flip()
        .trivial_augment_wide()
        .normalize(MEAN, STD)
        .layout("chw")
        .random_erasing(p=0.25)
    )
    loader = SluiceDataset(  # data
        transform.batch(args.batch, drop_last=True).threads(args.workers), fields=("image", "label")
    )
    mix = MixUpOrCutMix(mixup_alpha=0.2, cutmix_alpha=1.0, num_classes=classes)  # data

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
