"""threads="auto": the loader sizes its thread pool to the training loop."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import sluice
from conftest import N_IMAGES, small_pipeline


def test_auto_threads_deliver_every_sample_and_report_the_autoscaler(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset, batch=4, size=32), threads="auto")
    keys = []
    for batch in loader:
        keys.extend(int(k) for k in batch.key)
        time.sleep(0.01)  # a training step
    assert sorted(keys) == list(range(N_IMAGES))
    auto = loader.stats()["autoscale"]
    assert auto["policy"] == "fastmatch"
    assert 1 <= auto["units"] == loader.threads
    assert auto["ups"] + auto["downs"] == len(auto["decisions"])


def test_bad_thread_settings_are_refused(dataset: Path) -> None:
    with pytest.raises(ValueError, match="threads must be a count >= 0 or 'auto', not 'many'"):
        sluice.Loader(small_pipeline(dataset, batch=4, size=32), threads="many")
    loader = sluice.Loader(small_pipeline(dataset, batch=4, size=32), threads=1)
    assert loader.threads == 1 and "autoscale" not in loader.stats()
