"""The trainer-side CPU cost of handing a batch over, per batch, on the CPU.

Batches are made once by sluice and replayed (so sluice's worker threads are idle while
the hand-off is timed); for each way of consuming them this measures, per batch, the CPU
seconds on the trainer's thread (``time.thread_time()``) and on the whole process
(``resource.getrusage(RUSAGE_SELF)``: the trainer's thread plus torch's intra-op pool and
any framework threads), and the wall time; median of ``--runs`` (5) runs:

* ``numpy``: the plain numpy batches (the baseline: nothing handed over);
* ``to_device``: ``sluice.torch.to_device(batch, "cpu")`` per batch;
* ``device_loader``: ``sluice.torch.DeviceLoader(loader, "cpu")`` (its CPU fallback);
* ``jax``: ``sluice.jax.JaxLoader`` (DLPack);
* ``tf``: ``sluice.tf.dataset`` (a ``tf.data`` generator).

On the CPU both torch hand-offs convert on the CPU (to float, normalised, NCHW): the figure
is what that costs the trainer. On a GPU, DeviceLoader moves the conversion to the device
and the per-batch ``pin_memory()`` of ``to_device`` into one copy into a reused pinned
buffer (``bench/gpu_train.py`` measures that). Prints one JSON line per consumer.

    .venv/bin/python bench/handoff_cpu.py --batch 64 --size 224
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import sluice


class Replay:
    """A loader that hands out the same pre-made sluice batches every epoch."""

    def __init__(self, loader: sluice.Loader, batches: int) -> None:
        self.inner = loader
        it = iter(loader)
        self.batches = [next(it) for _ in range(batches)]
        self.pipeline = loader.pipeline

    def __iter__(self) -> Iterator[sluice.Batch]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:
        pass

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Any) -> None:
        pass

    def stats(self) -> Dict[str, Any]:
        return {}


def measure(consume: Callable[[], int], runs: int) -> Dict[str, float]:
    thread, process, wall = [], [], []
    for _ in range(runs):
        r0, t0, w0 = (
            resource.getrusage(resource.RUSAGE_SELF),
            time.thread_time(),
            time.perf_counter(),
        )
        n = consume()
        r1, t1, w1 = (
            resource.getrusage(resource.RUSAGE_SELF),
            time.thread_time(),
            time.perf_counter(),
        )
        thread.append((t1 - t0) / n)
        process.append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / n)
        wall.append((w1 - w0) / n)
    return {
        "trainer_thread_cpu_ms": 1e3 * statistics.median(thread),
        "process_cpu_ms": 1e3 * statistics.median(process),
        "wall_ms": 1e3 * statistics.median(wall),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batches", type=int, default=8, help="batches per run (replayed)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--consumers", default="numpy,to_device,device_loader,jax,tf")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="handoff-")) / "train"
    sluice.generate_dataset(root, images=args.batch * args.batches, classes=4, seed=0)
    pipe = (
        sluice.Pipeline.image_folder(root)
        .decode()
        .random_resized_crop(args.size)
        .batch(args.batch)
    )
    replay = Replay(sluice.Loader(pipe), args.batches)

    def numpy_() -> int:
        n = 0
        for _ in replay:  # the baseline: the numpy batch as sluice hands it out
            n += 1
        return n

    consumers: Dict[str, Callable[[], int]] = {"numpy": numpy_}
    wanted = [c for c in args.consumers.split(",") if c]
    if {"to_device", "device_loader"} & set(wanted):
        import torch

        from sluice.torch import DeviceLoader, to_device

        def to_device_() -> int:
            return sum(
                1
                for b in replay
                if to_device(b, "cpu", dtype=torch.float32) is not None
            )

        dl = DeviceLoader(replay, "cpu")

        def device_loader_() -> int:
            return sum(1 for _ in dl)

        consumers.update({"to_device": to_device_, "device_loader": device_loader_})
    if "jax" in wanted:
        from sluice.jax import JaxLoader

        jl = JaxLoader(replay)

        def jax_() -> int:
            return sum(1 for _ in jl)

        consumers["jax"] = jax_
    if "tf" in wanted:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from sluice.tf import dataset

        ds = dataset(replay)

        def tf_() -> int:
            return sum(1 for _ in ds)

        consumers["tf"] = tf_
    rows: List[Dict[str, Any]] = []
    for name in wanted:
        fn = consumers[name]
        fn()  # warm-up (imports, first allocations, tf graph)
        row = {
            "consumer": name,
            "batch": args.batch,
            "size": args.size,
            **measure(fn, args.runs),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
