"""The cache's `auto` level from Python: a budget too small to pay for itself stores
nothing and says why in the stats (Cachew's "don't cache"); one that holds the dataset
caches, and later epochs hit. And `share=True`: loaders of one process read one cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sluice
from conftest import N_IMAGES, small_pipeline


def test_auto_caches_nothing_when_the_budget_cannot_pay_and_says_why(dataset: Path) -> None:
    # ~100 KB files, ~0.5 MB decoded: 150 KB holds one raw entry of 48, no decoded one.
    loader = sluice.Loader(small_pipeline(dataset).cache(150_000, level="auto", policy="lru"))
    for _ in range(2):
        for _ in loader:
            pass
    cache = loader.stats()["cache"]
    off = cache["off"]
    assert off is not None, cache
    assert off["best"] == "raw" and 0 <= off["saved_fraction"] < off["min_fraction"] == 0.05, off
    assert off["pipeline_per_epoch_s"] > off["saved_per_epoch_s"] >= 0, off
    assert (cache["entries"], cache["used_bytes"], cache["hits"], cache["misses"]) == (0, 0, 0, 2 * N_IMAGES)


def test_auto_caches_when_the_budget_holds_the_dataset(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset).cache("256MB", level="auto", policy="lru"))
    for _ in range(3):
        for _ in loader:
            pass
    cache = loader.stats()["cache"]
    assert cache["off"] is None and cache["level"] == "decoded", cache
    assert cache["hits"] >= N_IMAGES, cache


def test_loaders_with_a_shared_cache_decode_each_sample_once(dataset: Path) -> None:
    first = sluice.Loader(small_pipeline(dataset, seed=1).cache("256MB", level="decoded", policy="lru", share=True))
    for _ in first:
        pass
    assert (first.stats()["cache"]["misses"], first.stats()["cache"]["hits"]) == (N_IMAGES, 0)
    # Another seed and batch size: the same cache, and the batches it makes alone.
    pipe = small_pipeline(dataset, batch=6, seed=2).cache("256MB", level="decoded", policy="lru", share=True)
    second = sluice.Loader(pipe)
    shared = [np.array(b["image"]) for b in second]
    assert (second.stats()["cache"]["misses"], second.stats()["cache"]["hits"]) == (N_IMAGES, N_IMAGES)
    alone = sluice.Loader(small_pipeline(dataset, batch=6, seed=2).cache("256MB", level="decoded", policy="lru"))
    assert all(np.array_equal(a, np.array(b["image"])) for a, b in zip(shared, alone, strict=True))
    with pytest.raises(sluice.SpecError, match="cache.share"):
        sluice.Loader(pipe.sampling("importance"))
