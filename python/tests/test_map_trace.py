"""Traces of a pipeline with a ``map`` op hold the worker processes' work: the map op's
time in every sample, each process on its own (docs/map.md, docs/profiling.md)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from test_trace import perfetto, slices

import sluice

__all__ = ["perfetto"]

N = 48  # conftest's dataset


def keep(image: np.ndarray, sample: Any) -> np.ndarray:
    return image


def pipe(root: Path) -> sluice.Pipeline:
    return sluice.Pipeline.image_folder(root).decode().center_crop(16).map(keep).batch(8).seed(2)


def test_a_chrome_trace_holds_every_samples_map_op_from_the_worker_processes(dataset: Path, tmp_path: Path) -> None:
    loader = sluice.Loader(pipe(dataset), processes=2)
    assert sum(b.size for b in loader) == N  # the workers run before the trace starts
    path = tmp_path / "run.json"
    with loader.trace(path):
        assert sum(b.size for b in loader) == N
    events = json.loads(path.read_text())["traceEvents"]
    maps = [e for e in events if e.get("name") == "map" and e.get("ph") == "X"]
    assert sorted(e["args"]["key"] for e in maps) == list(range(N))
    assert {e["args"]["epoch"] for e in maps} == {1}
    assert len({e["pid"] for e in maps}) == 2  # one process each
    assert sorted(loader._workers.pids()) == sorted({e["pid"] for e in maps})  # type: ignore[union-attr]
    loader.close()


def test_a_perfetto_trace_of_the_whole_life_holds_the_workers_map_slices(
    dataset: Path, perfetto: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "run.pftrace"
    loader = sluice.Loader(pipe(dataset), processes=2, trace=path)
    assert sum(b.size for b in loader) == N
    written = loader.close_trace()
    assert written is not None and written > 2 * N
    durations, _, _, _ = slices(perfetto, path)
    assert len(durations["map"]) == N
    assert all(d > 0 for d in durations["map"])
    loader.close()
