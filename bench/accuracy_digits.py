#!/usr/bin/env python3
"""Does importance-aware caching cost accuracy? scikit-learn's digits, written out as PNG
files in an ImageFolder, a small CNN trained on CPU through sluice: final test accuracy
of uniform sampling without a cache against each cache policy at 50% of the dataset,
same epochs, several seeds. Also reports each run's cache hit rate over the epochs after
the first (which only fills the cache).

Each policy runs with the sampler it was designed with: ``lru`` under uniform epochs,
``shade`` and ``fastmatch`` under their own samplers (unweighted loss, as published),
``importance`` under sluice's importance sampler with the batch ``weight`` applied to the
per-sample loss (``(w * loss).mean()``). Per-sample losses are reported to the loader
every step through ``loader.record_importance``.

    .venv/bin/python bench/accuracy_digits.py --epochs 15 --seeds 0 1 2 --json out.json

Needs: numpy, torch, scikit-learn, pillow (``pip install scikit-learn``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

SIZE = 28
VARIANTS = ["uniform", "lru", "shade", "fastmatch", "importance"]
#: Loader threads (the results do not depend on it: pixels and orders are thread-independent).
THREADS = [1]
#: Extra `sampling` fields for the importance variant (--importance '{"floor": 0.05}').
IMPORTANCE_OVERRIDES: Dict[str, Any] = {}


def write_digits(out: Path, seed: int = 0) -> Dict[str, Any]:
    """Digits upscaled to 32x32 RGB PNGs: out/train/<digit>/*.png and out/test/<digit>/*.png
    (a fixed stratified 70/30 split)."""
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    y = digits.target
    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=0.3, random_state=seed, stratify=y)
    if not (out / "test").is_dir():
        for split, idx in (("train", idx_train), ("test", idx_test)):
            for i in idx:
                d = out / split / str(int(y[i]))
                d.mkdir(parents=True, exist_ok=True)
                img = Image.fromarray(x[i], mode="L").resize((32, 32), Image.BILINEAR).convert("RGB")
                img.save(d / f"{i:05d}.png")
    return {"train": len(idx_train), "test": len(idx_test)}


def base_spec(root: Path, seed: int, train: bool) -> Dict[str, Any]:
    ops: List[Dict[str, Any]] = [{"op": "decode"}]
    if train:
        ops.append({"op": "random_resized_crop", "size": SIZE, "scale": [0.7, 1.0], "ratio": [0.9, 1.1]})
    else:
        ops += [{"op": "resize", "size": SIZE}, {"op": "center_crop", "size": SIZE}]
    ops += [{"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}, {"op": "layout", "order": "chw"}]
    return {
        "source": {"kind": "image_folder", "root": str(root)},
        "ops": ops,
        "shuffle": {"kind": "global" if train else "none"},
        "batch": {"size": 64 if train else 512},
        "seed": seed,
        "threads": THREADS[0],
    }


def variant_spec(root: Path, seed: int, variant: str, n_train: int) -> Dict[str, Any]:
    spec = base_spec(root, seed, train=True)
    if variant == "uniform":
        return spec
    # Half the dataset's decoded entries (32x32 RGB8 each).
    spec["cache"] = {"budget": n_train * 32 * 32 * 3 // 2, "level": "decoded", "policy": variant}
    spec["sampling"] = {"kind": {"lru": "uniform"}.get(variant, variant)}
    if variant == "importance":
        spec["sampling"].update(IMPORTANCE_OVERRIDES)
    return spec


def model_for(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def evaluate(torch: Any, sluice: Any, model: Any, test_root: Path) -> float:
    loader = sluice.Loader(base_spec(test_root, 0, train=False), output="torch")
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for b in loader:
            pred = model(b["image"]).argmax(1)
            correct += int((pred == b["label"]).sum())
            total += len(b["label"])
    model.train()
    return correct / max(total, 1)


def run(torch: Any, sluice: Any, data: Path, variant: str, seed: int, epochs: int, n_train: int) -> Dict[str, Any]:
    torch.manual_seed(seed)
    loader = sluice.Loader(variant_spec(data / "train", seed, variant, n_train), output="torch")
    model = model_for(torch)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    t0 = time.perf_counter()
    after_first: Optional[Dict[str, Any]] = None
    for epoch in range(epochs):
        if epoch == 1:
            after_first = loader.stats().get("cache")
        for b in loader:
            x, y = b["image"], b["label"]
            with loader.record_importance(b["key"]) as rec:
                losses = ce(model(x), y)
                rec.losses(losses)
                w = b.get("weight")
                loss = (losses * w).mean() if (variant == "importance" and w is not None) else losses.mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    secs = time.perf_counter() - t0
    acc = evaluate(torch, sluice, model, data / "test")
    cache = loader.stats().get("cache")
    hit_rate = None
    if cache and after_first:
        # Epochs after the first (which only fills the cache).
        hits = cache["hits"] - after_first["hits"]
        lookups = hits + cache["misses"] - after_first["misses"]
        hit_rate = hits / max(lookups, 1)
    return {
        "variant": variant,
        "seed": seed,
        "accuracy": acc,
        "hit_rate": hit_rate,
        "train_s": secs,
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("data/digits"))
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    ap.add_argument("--threads", type=int, default=1, help="loader threads (results do not depend on it)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--importance", default="{}", help="JSON of sampling fields for the importance variant")
    a = ap.parse_args(argv)
    IMPORTANCE_OVERRIDES.update(json.loads(a.importance))
    THREADS[0] = a.threads

    import torch

    import sluice

    torch.set_num_threads(1)
    sizes = write_digits(a.data)
    print(f"digits: {sizes['train']} train / {sizes['test']} test PNGs in {a.data}; {a.epochs} epochs", file=sys.stderr)
    results = []
    for seed in a.seeds:
        for v in a.variants:
            r = run(torch, sluice, a.data, v, seed, a.epochs, sizes["train"])
            hr = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.3f}"
            print(f"seed {seed} {v:>10}: accuracy {r['accuracy']:.4f}  hit rate {hr}  ({r['train_s']:.1f}s)", file=sys.stderr)
            results.append(r)
    summary = {}
    print(f"\n{'variant':>10} {'mean acc':>9} {'std':>7} {'vs uniform':>11} {'hit rate':>9}", file=sys.stderr)
    base = statistics.mean(r["accuracy"] for r in results if r["variant"] == "uniform") if "uniform" in a.variants else None
    for v in a.variants:
        accs = [r["accuracy"] for r in results if r["variant"] == v]
        hits = [r["hit_rate"] for r in results if r["variant"] == v and r["hit_rate"] is not None]
        mean = statistics.mean(accs)
        std = statistics.stdev(accs) if len(accs) > 1 else 0.0
        hit = statistics.mean(hits) if hits else None
        delta = None if base is None else (mean - base) * 100
        summary[v] = {"mean_accuracy": mean, "std": std, "delta_pp_vs_uniform": delta, "mean_hit_rate": hit}
        print(
            f"{v:>10} {mean:>9.4f} {std:>7.4f} {'' if delta is None else f'{delta:+.2f} pp':>11} "
            f"{'-' if hit is None else f'{hit:.3f}':>9}",
            file=sys.stderr,
        )
    if a.json:
        a.json.write_text(json.dumps({"epochs": a.epochs, "seeds": a.seeds, "runs": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
