"""The cache's disk tier from Python: a second loader over the same folder is served from
disk (its stats say so), with the same batches, once the first is gone (while it lives,
the folder is refused)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sluice
from sluice import Pipeline


def test_a_second_loader_is_served_from_the_disk_tier(dataset: Path, tmp_path: Path) -> None:
    pipe = (
        Pipeline.image_folder(str(dataset))
        .decode()
        .center_crop(32)
        .random_horizontal_flip()
        .batch(8)
        .cache(1, level="decoded", policy="lru", disk={"dir": tmp_path / "tier", "budget": "64MB"})
    )
    first = sluice.Loader(pipe)
    epoch = [np.array(b["image"]) for b in first]
    disk = first.stats()["cache"]["disk"]
    n = disk["insertions"]
    assert disk["hits"] == 0 and n == disk["misses"] and n > 0 and disk["used_bytes"] <= 64_000_000
    # The folder has one owner at a time: a second loader over it waits for the first to go.
    with pytest.raises(OSError, match=r"another loader has this folder open .* give each process its own"):
        sluice.Loader(pipe)
    del first
    second = sluice.Loader(pipe)
    again = [np.array(b["image"]) for b in second]
    disk = second.stats()["cache"]["disk"]
    assert disk["recovered"] == n and disk["hits"] == n and disk["corrupt"] == 0
    assert all(np.array_equal(a, b) for a, b in zip(epoch, again))


def test_a_disk_tier_folder_that_cannot_be_made_is_an_os_error(dataset: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"x")
    pipe = Pipeline.image_folder(str(dataset)).decode().center_crop(32).batch(8)
    pipe = pipe.cache("1MB", level="raw", disk={"dir": blocker / "tier", "budget": "64MB"})
    with pytest.raises(OSError, match="cache.disk.dir"):
        sluice.Loader(pipe)
