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


def test_prefetch_auto_shows_its_depth_and_a_bound_caps_it(dataset: Path) -> None:
    pipe = small_pipeline(dataset, batch=4, size=32).threads(1)
    batch_bytes = 4 * 32 * 32 * 3
    loader = sluice.Loader(pipe.prefetch("auto", max_bytes=3 * batch_bytes))
    assert loader.stats()["prefetch"] == {"auto": True, "depth": 3, "ready_limit": 1, "max_depth": 3, "grows": 0}
    for i, _ in enumerate(loader):
        if i % 4 == 3:
            time.sleep(0.1)  # a bursty training loop
    p = loader.stats()["prefetch"]
    assert p["depth"] <= p["max_depth"] == 3
    fixed = sluice.Loader(pipe.prefetch(2)).stats()["prefetch"]
    assert (fixed["auto"], fixed["depth"]) == (False, 2)
    with pytest.raises(ValueError, match="max_bytes bounds"):
        pipe.prefetch(2, max_bytes=1000)


def test_a_reported_accelerator_busy_fraction_replaces_step_timing_in_the_stats(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset, batch=4, size=32))
    assert "accelerator" not in loader.stats()
    for _ in loader:
        time.sleep(0.005)  # a training step
    measured = loader.stats()["accelerator"]
    assert measured["source"] == "step_timing" and 0.0 < measured["busy"] <= 1.0
    loader.report_accelerator_busy(0.5)
    assert loader.stats()["accelerator"] == {"busy": 0.5, "source": "reported"}
