"""DDP sharding: every rank gets a disjoint, equally long part of each epoch."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

import sluice
from conftest import N_IMAGES, small_pipeline


def keys(loader: sluice.Loader) -> List[int]:
    return [int(k) for b in loader for k in b.key]


def test_two_ranks_are_disjoint_and_equal(dataset: Path) -> None:
    pipe = small_pipeline(dataset, batch=5)
    ranks = [sluice.Loader(pipe, rank=r, world_size=2) for r in range(2)]
    for _epoch in range(2):
        k0, k1 = keys(ranks[0]), keys(ranks[1])
        assert len(k0) == len(k1) == N_IMAGES // 2
        assert not set(k0) & set(k1)
        assert sorted(k0 + k1) == list(range(N_IMAGES))
        assert len(ranks[0]) == len(ranks[1]) == 5  # 24 samples in batches of 5
    assert ranks[1].rank == 1 and ranks[1].world_size == 2


def test_uneven_split_leaves_the_remainder_out(dataset: Path) -> None:
    pipe = small_pipeline(dataset, batch=8)
    parts = [keys(sluice.Loader(pipe, rank=r, world_size=5)) for r in range(5)]
    assert all(len(p) == N_IMAGES // 5 for p in parts)
    assert len(set().union(*map(set, parts))) == 5 * (N_IMAGES // 5)


def test_rank_defaults_come_from_the_environment(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = sluice.Loader(small_pipeline(dataset))
    assert (loader.rank, loader.world_size) == (1, 3)
    assert loader.samples_per_epoch == N_IMAGES // 3
    assert keys(loader) == keys(sluice.Loader(small_pipeline(dataset), rank=1, world_size=3))
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert (sluice.Loader(small_pipeline(dataset)).world_size) == 1


def test_bad_rank_is_rejected(dataset: Path) -> None:
    with pytest.raises(ValueError, match="rank 2"):
        sluice.Loader(small_pipeline(dataset), rank=2, world_size=2)
