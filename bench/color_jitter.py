"""Per-sample cost of ``color_jitter(0.4, 0.4, 0.4, 0.1)`` on a 224x224 image: sluice's op
(its own time from the loader's per-op stats, one thread) against torchvision v2's
``ColorJitter`` on the same image as a uint8 CHW tensor (one torch thread), both in this
process; each the median of 5 rounds.

    maturin develop --release -m python/Cargo.toml && python bench/color_jitter.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import sluice
import torch
from PIL import Image
from torchvision.transforms import v2

N, ROUNDS, SIDE = 256, 5, 224
JITTER = {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1}


def picture(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    base = np.stack([x, y, (x + y) // 2], axis=-1) + rng.integers(
        0, 40, (SIDE, SIDE, 3)
    )
    return np.clip(base, 0, 255).astype(np.uint8)


def sluice_us(root: Path) -> list[float]:
    pipe = (
        sluice.Pipeline.image_folder(root)
        .decode()
        .center_crop(SIDE)
        .color_jitter(**JITTER)
    )
    pipe = pipe.batch(32).threads(1).shuffle("none")
    out = []
    for _ in range(ROUNDS):
        loader = sluice.Loader(pipe)
        n = sum(len(b.label) for b in loader)
        out.append(loader.stats()["op_seconds"]["color_jitter"] / n * 1e6)
    return out


def torchvision_us(img: np.ndarray) -> list[float]:
    torch.set_num_threads(1)
    t = torch.from_numpy(img).permute(2, 0, 1).contiguous()
    jitter = v2.ColorJitter(**JITTER)
    torch.manual_seed(0)
    jitter(t)
    out = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(N):
            jitter(t)
        out.append((time.perf_counter() - t0) / N * 1e6)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "train"
        (root / "a").mkdir(parents=True)
        for i in range(N):
            Image.fromarray(picture(i)).save(root / "a" / f"{i:04}.png")
        ours = statistics.median(sluice_us(root))
    theirs = statistics.median(torchvision_us(picture(0)))
    print(
        f"color_jitter per 224x224 sample, median of {ROUNDS} rounds of {N} samples, one thread"
    )
    print(f"  sluice      {ours:8.1f} us")
    print(f"  torchvision {theirs:8.1f} us")
    print(f"  ratio       {theirs / ours:8.2f}x")


if __name__ == "__main__":
    sys.exit(main())
