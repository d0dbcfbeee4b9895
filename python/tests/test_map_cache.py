"""A cache under ``map`` worker processes (docs/map.md): the spec's memory and disk budgets
are the loader's whatever its processes (each holds its share, its disk tier in a folder of
its own), ``stats()["cache"]`` adds the processes' caches up, and each process's disk tier
hears the order of the samples its batches will look up, so Belady's rule keeps what it
needs next."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

import sluice

N = 48  # conftest's dataset


def invert(image: np.ndarray, sample: Any) -> np.ndarray:
    return 255 - image


def pipe(root: Path, memory: Any, disk: Dict[str, Any]) -> sluice.Pipeline:
    p = sluice.Pipeline.image_folder(root).decode().center_crop(16).map(invert).random_horizontal_flip()
    return p.batch(8).seed(5).cache(memory, level="raw", policy="lru", disk=disk)


def entry_files(folder: Path) -> Tuple[List[Path], int]:
    files = sorted(folder.rglob("*.entry"))
    return files, sum(f.stat().st_size for f in files)


def epoch(loader: sluice.Loader) -> None:
    for _ in loader:
        pass


def test_the_cache_budgets_are_the_loaders_whatever_its_processes(dataset: Path, tmp_path: Path) -> None:
    memory, disk_budget = 3 * 128 * 1024, 3 * 128 * 1024
    loader = sluice.Loader(pipe(dataset, memory, {"dir": tmp_path / "disk", "budget": disk_budget}), processes=3)
    epoch(loader)
    cache = loader.stats()["cache"]
    # Every sample was looked up once, by one of the processes, and offered to both tiers.
    assert (cache["hits"], cache["misses"]) == (0, N), cache
    assert cache["budget_bytes"] <= memory and cache["used_bytes"] <= memory, cache
    assert cache["entries"] > 0 and cache["insertions"] == cache["entries"] + cache["evictions"], cache
    disk = cache["disk"]
    assert (disk["hits"], disk["misses"]) == (0, N), disk
    assert disk["budget_bytes"] <= disk_budget and disk["dir"] == str(tmp_path / "disk"), disk
    files, on_disk = entry_files(tmp_path / "disk")
    assert (len(files), on_disk) == (disk["entries"], disk["used_bytes"]), disk
    assert 0 < on_disk <= disk_budget, f"3 processes hold {on_disk} bytes of a {disk_budget}-byte budget"
    folders = sorted(p.name for p in (tmp_path / "disk").iterdir())
    assert folders == [f"process-{w}-of-3" for w in range(3)], folders
    assert len(disk["dirs"]) == 3
    loader.close()


def _second_epoch_disk_hits(dataset: Path, folder: Path, budget: int, processes: int) -> int:
    loader = sluice.Loader(pipe(dataset, "1KB", {"dir": folder, "budget": budget}), processes=processes)
    epoch(loader)
    before = loader.stats()["cache"]["disk"]["hits"]
    epoch(loader)
    hits = int(loader.stats()["cache"]["disk"]["hits"]) - int(before)
    loader.close()
    return hits


def test_each_process_hears_its_future_so_belady_keeps_what_it_needs_next(dataset: Path, tmp_path: Path) -> None:
    whole = sluice.Loader(pipe(dataset, "1KB", {"dir": tmp_path / "whole", "budget": "1GB"}), processes=0)
    epoch(whole)
    total = int(whole.stats()["cache"]["disk"]["used_bytes"])
    del whole
    # A third of the dataset fits. In one process, Belady keeps the third epoch 1 needs
    # first; two processes (a sixth each) see their own batches of epoch 0 only, but knowing
    # their batches of epoch 1 they keep those of them they will need, so they hit about as
    # often. (Without the future every key ranks alike once the tier is full: it keeps the
    # first entries it wrote, and a process needs few of those itself in epoch 1.)
    budget = max(total // 3, 2 * 4096)
    one = _second_epoch_disk_hits(dataset, tmp_path / "one", budget, 0)
    two = _second_epoch_disk_hits(dataset, tmp_path / "two", budget, 2)
    assert one >= N // 4, f"one process: {one} disk hits in epoch 1"
    assert two >= 0.75 * one, f"two processes: {two} disk hits in epoch 1, one process: {one}"
