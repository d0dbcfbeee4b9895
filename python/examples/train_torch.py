"""Train a small CNN end to end with sluice feeding PyTorch.

Generates a small ImageNet-like dataset (sluice.generate_dataset) unless it is there
already, then trains for a few epochs, printing loss, accuracy and images/s. sluice
decodes and augments on its own native threads and hands out uint8 NHWC batches without a
copy; ``to_device`` converts and normalises them on the device (the CPU here, the GPU when
there is one).

    .venv/bin/python python/examples/train_torch.py                 # ~30 s on 2 cores
    .venv/bin/python python/examples/train_torch.py --images 2000 --size 96 --epochs 5
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

import sluice
from sluice.torch import SluiceDataset, to_device


def small_cnn(classes: int) -> nn.Module:
    """Three strided conv blocks and a linear head: enough to learn the synthetic classes."""

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(
        block(3, 16), block(16, 32), block(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data/example/train", help="ImageFolder root (generated if missing)")
    ap.add_argument("--images", type=int, default=512, help="images to generate")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--size", type=int, default=64, help="RandomResizedCrop output size")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="sluice worker threads (0: one per core)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    if not os.path.isdir(args.data):
        t0 = time.perf_counter()
        info = sluice.generate_dataset(args.data, images=args.images, classes=args.classes)
        print(
            f"generated {info['images']} images ({info['bytes'] / 1e6:.0f} MB) in {args.data} "
            f"in {time.perf_counter() - t0:.1f}s"
        )

    pipe = (
        sluice.Pipeline.image_folder(args.data)
        .decode()
        .random_resized_crop(args.size, scale=(0.25, 1.0))
        .random_horizontal_flip()
        .batch(args.batch)
        .threads(args.threads)
        .seed(0)
        .on_error("skip")  # a bad file is left out and reported in stats(), not fatal
    )
    data = SluiceDataset(pipe)
    classes = len(data.loader.classes)
    device = torch.device(args.device)
    model = small_cnn(classes).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    print(
        f"{data.loader.num_samples} images, {classes} classes, {len(data)} batches of {args.batch} per epoch, "
        f"{data.loader.threads} sluice threads, device {device}"
    )

    for epoch in range(args.epochs):
        data.set_epoch(epoch)
        model.train()
        t0 = time.perf_counter()
        seen = correct = 0
        total_loss = 0.0
        for batch in data:
            b = to_device(batch, device, channels_last=True)
            logits = model(b.image)
            loss = F.cross_entropy(logits, b.label)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            n = b.label.shape[0]
            seen += n
            total_loss += loss.item() * n
            correct += (logits.argmax(1) == b.label).sum().item()
        elapsed = time.perf_counter() - t0
        print(
            f"epoch {epoch}: loss {total_loss / seen:.3f}, accuracy {correct / seen:.2%}, "
            f"{seen / elapsed:.0f} images/s (training included)"
        )
    stats = data.stats()
    print(
        f"sluice: {stats['samples']} samples, waited {stats['wait_s']:.2f}s for data over "
        f"{stats['elapsed_s']:.1f}s, {len(stats['skipped'])} skipped"
    )


if __name__ == "__main__":
    main()
