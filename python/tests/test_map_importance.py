"""Importance sampling with a ``map`` op: the epochs the worker processes draw follow the
trainer's reports exactly as the in-process loader's do (docs/map.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import numpy as np

import sluice

N = 48  # conftest's dataset


def keep(image: np.ndarray, sample: Any) -> np.ndarray:
    """The image as it came (the map op is what moves the pipeline into processes)."""
    return image


def pipe(root: Path) -> sluice.Pipeline:
    return (
        sluice.Pipeline.image_folder(root)
        .decode()
        .center_crop(16)
        .map(keep)
        .batch(8)
        .seed(5)
        .sampling("importance", floor=0.01, coverage_epochs=40)  # a sweep of 1/40: the reports shape the epoch
    )


def keys(loader: sluice.Loader) -> List[int]:
    return [int(k) for b in loader for k in np.asarray(b.key)]


def reported(loader: sluice.Loader) -> None:
    """Reports the first eight samples as far more important than the rest."""
    loader.report(list(range(N)), [100.0 if k < 8 else 0.01 for k in range(N)])


def test_worker_processes_draw_the_epochs_the_reports_shape(dataset: Path) -> None:
    drawn = {}
    for processes in (0, 2):
        loader = sluice.Loader(pipe(dataset), processes=processes)
        assert sorted(keys(loader)) == list(range(N))  # epoch 0: nothing reported yet
        reported(loader)
        drawn[processes] = keys(loader)
        loader.close()
    # The reports shape epoch 1: the important samples come more than once.
    assert sum(k < 8 for k in drawn[0]) > N // 2, drawn[0]
    assert drawn[2] == drawn[0]


def test_a_resumed_loader_with_processes_draws_with_the_saved_scores(dataset: Path) -> None:
    ref = sluice.Loader(pipe(dataset), processes=0)
    keys(ref)
    reported(ref)
    state = ref.state_dict()
    want = keys(ref)
    ref.close()
    resumed = sluice.Loader(pipe(dataset), processes=2)
    resumed.load_state_dict(state)
    assert keys(resumed) == want
    resumed.close()
