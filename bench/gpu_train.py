"""Training throughput on one GPU, fed four ways, each configuration in a fresh process.

For ResNet-50 and ResNet-18 (torchvision, bf16 autocast, channels_last, SGD, batch 256)
this runs, interleaved:

* ``synthetic``: one batch already on the GPU, reused (the GPU's own limit);
* ``device_loader``: ``sluice.Loader`` + ``sluice.torch.DeviceLoader`` (pinned ring,
  side-stream upload and conversion, bf16 channels_last);
* ``to_device``: ``sluice.Loader(output="torch")`` + ``sluice.torch.to_device`` per batch;
* ``dataloader``: ``torch.utils.data.DataLoader`` over torchvision's ``ImageFolder`` (PIL,
  RandomResizedCrop + flip, ``PILToTensor``: uint8), ``pin_memory=True``, normalised on the
  GPU;

and, once per round, ``loader_only`` (sluice alone, no training: the rate the trainer can
at best get from it). Every configuration runs in its own ``python`` process (what ran
before in a process changes the figure: torch's intra-op pool, the allocator), as a user
would write the loop: no ``torch.set_num_threads``. Each writes one JSON line (to stdout
and ``--out``) as soon as it finishes: ``model``, ``config``, ``images_per_s``, ``steps``,
``batch``, ``warmup``, ``threads``, ``device``, ``round``.

On a GPU machine with torch and torchvision but not sluice (carry the wheel)::

    pip install sluice-*.whl
    python bench/gpu_train.py --images 20000 --out gpu_train.jsonl   # dataset generated here

``--quick`` runs everything on the CPU with a tiny model, 64 small images and 2 timed
steps: a check that the script works, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

CONFIGS = ["synthetic", "device_loader", "to_device", "dataloader"]
MODELS = ["resnet50", "resnet18"]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--data",
        default="data/gpu_train/train",
        help="ImageFolder root (generated if missing)",
    )
    p.add_argument(
        "--images",
        type=int,
        default=20000,
        help="images to generate when --data is missing",
    )
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument(
        "--rounds", type=int, default=1, help="repetitions of the interleaved sequence"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="sluice threads / DataLoader workers (0: cores - 1)",
    )
    p.add_argument(
        "--out", default="gpu_train.jsonl", help="JSON lines, appended as results come"
    )
    p.add_argument(
        "--timeout", type=float, default=900, help="seconds per configuration"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="CPU, tiny model, 64 images of 32 px, 2 steps",
    )
    p.add_argument(
        "--child", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS
    )
    args = p.parse_args()
    if args.quick:
        args.images, args.size, args.batch, args.warmup, args.steps = 64, 32, 8, 1, 2
        if args.data == p.get_default("data"):
            args.data = "data/gpu_train_quick/train"
    if args.threads <= 0:
        args.threads = max(1, (os.cpu_count() or 2) - 1)
    return args


def build_model(name: str, quick: bool) -> Any:
    import torch

    if quick:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 1000),
        )
    import torchvision

    return getattr(torchvision.models, name)(num_classes=1000)


def batches(config: str, args: argparse.Namespace, device: Any) -> Iterator[Any]:
    """Endless (image, label) pairs on ``device``: NCHW bf16 channels_last images."""
    import torch

    if config == "synthetic":
        image = torch.randn(
            args.batch, 3, args.size, args.size, device=device, dtype=torch.bfloat16
        )
        image = image.contiguous(memory_format=torch.channels_last)
        label = torch.randint(0, 1000, (args.batch,), device=device)
        while True:
            yield image, label
    if config == "dataloader":
        import torchvision
        from torchvision.transforms import v2

        mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
        tf = v2.Compose(
            [
                v2.RandomResizedCrop(args.size),
                v2.RandomHorizontalFlip(),
                v2.PILToTensor(),
            ]
        )
        ds = torchvision.datasets.ImageFolder(args.data, transform=tf)
        dl = torch.utils.data.DataLoader(
            ds,
            batch_size=args.batch,
            shuffle=True,
            num_workers=args.threads,
            pin_memory=device.type == "cuda",
            persistent_workers=True,
            drop_last=True,
        )
        while True:
            for image, label in dl:
                image = image.to(device, non_blocking=True).to(torch.bfloat16)
                image = (
                    image.sub_(mean)
                    .div_(std)
                    .contiguous(memory_format=torch.channels_last)
                )
                yield image, label.to(device, non_blocking=True)
    import sluice
    import sluice.torch as st

    pipe = (
        sluice.Pipeline.image_folder(args.data)
        .decode()
        .random_resized_crop(args.size)
        .random_horizontal_flip()
        .batch(args.batch, drop_last=True)
    )
    if config == "device_loader":
        loader = st.DeviceLoader(
            sluice.Loader(pipe, threads=args.threads),
            device,
            dtype=torch.bfloat16,
            channels_last=True,
        )
        while True:
            for b in loader:
                yield b.image, b.label
    if config == "to_device":
        plain = sluice.Loader(pipe, threads=args.threads, output="torch")
        while True:
            for b in plain:
                out = st.to_device(b, device, dtype=torch.bfloat16, channels_last=True)
                yield out.image, out.label
    raise SystemExit(
        f"unknown config {config!r} (one of {', '.join(CONFIGS)}, loader_only)"
    )


def loader_only(args: argparse.Namespace) -> Dict[str, Any]:
    import sluice

    pipe = (
        sluice.Pipeline.image_folder(args.data)
        .decode()
        .random_resized_crop(args.size)
        .random_horizontal_flip()
        .batch(args.batch, drop_last=True)
    )
    loader = sluice.Loader(pipe, threads=args.threads)
    n, t0, seen = 0, 0.0, 0
    while n < args.warmup + args.steps:
        for _ in loader:
            n += 1
            if n == args.warmup:
                t0 = time.perf_counter()
            elif n > args.warmup:
                seen += args.batch
            if n >= args.warmup + args.steps:
                break
    return {
        "images_per_s": seen / (time.perf_counter() - t0),
        "steps": args.steps,
        "device": "cpu",
    }


def child(model_name: str, config: str, args: argparse.Namespace) -> Dict[str, Any]:
    if config == "loader_only":
        return loader_only(args)
    import torch

    device = torch.device(
        "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    )
    model = (
        build_model(model_name, args.quick)
        .to(device)
        .to(memory_format=torch.channels_last)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    feed = batches(config, args, device)
    t0 = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sync()
            t0 = time.perf_counter()
        image, label = next(feed)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = criterion(model(image), label)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync()
    elapsed = time.perf_counter() - t0
    if not torch.isfinite(loss.detach().float()):
        raise SystemExit(f"{model_name}/{config}: the loss is not finite")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "images_per_s": args.steps * args.batch / elapsed,
        "steps": args.steps,
        "device": name,
    }


def main() -> None:
    args = parse()
    if args.child:
        model_name, config = args.child
        print(json.dumps(child(model_name, config, args)), flush=True)
        return
    import sluice

    root = Path(args.data)
    if not root.exists():
        print(
            f"generating {args.images} images in {root} ...",
            file=sys.stderr,
            flush=True,
        )
        sluice.generate_dataset(root, images=args.images, classes=10, seed=0)
    models = [m for m in args.models.split(",") if m]
    configs = [c for c in args.configs.split(",") if c]
    passthrough = [
        f"--data={args.data}",
        f"--batch={args.batch}",
        f"--size={args.size}",
        f"--warmup={args.warmup}",
        f"--steps={args.steps}",
        f"--threads={args.threads}",
    ] + (["--quick"] if args.quick else [])
    plan: List[List[str]] = []
    for r in range(args.rounds):
        plan.append(["-", "loader_only", str(r)])
        for i, model_name in enumerate(models):
            k = (r + i) % len(configs)  # rotate the order between rounds and models
            for config in configs[k:] + configs[:k]:
                plan.append([model_name, config, str(r)])
    with open(args.out, "a") as out:
        for model_name, config, r in plan:
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                model_name,
                config,
                *passthrough,
            ]
            row: Dict[str, Any] = {
                "model": model_name,
                "config": config,
                "round": int(r),
                "batch": args.batch,
            }
            row.update(
                {"warmup": args.warmup, "threads": args.threads, "quick": args.quick}
            )
            try:
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=args.timeout
                )
                if proc.returncode == 0:
                    row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
                else:
                    row["error"] = proc.stderr.strip().splitlines()[-1:] or [
                        f"exit {proc.returncode}"
                    ]
            except subprocess.TimeoutExpired:
                row["error"] = f"timed out after {args.timeout} s"
            line = json.dumps(row)
            print(line, flush=True)
            out.write(line + "\n")
            out.flush()


if __name__ == "__main__":
    main()
