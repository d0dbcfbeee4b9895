"""sluice.Loader and sluice.RemoteLoader share one interface, sluice.LoaderLike: checked
at runtime (isinstance) and statically (mypy on an assignment of each), and exercised on
both against real service processes."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Tuple

import pytest

import sluice
from conftest import N_IMAGES, REPO, sluice_service, small_pipeline

# mypy checks that both loaders satisfy the protocol's signatures, not just its names.
STATIC_CHECK = """
import sluice

def as_loader_like(local: sluice.Loader, remote: sluice.RemoteLoader) -> None:
    a: sluice.LoaderLike = local
    b: sluice.LoaderLike = remote
"""


@pytest.fixture()
def service(dataset: Path, tmp_path: Path) -> Iterator[str]:
    with sluice_service([dataset], tmp_path / "journal") as addr:
        yield addr


def _keys(loader: sluice.LoaderLike) -> Tuple[int, ...]:
    return tuple(sorted(int(k) for batch in loader for k in batch.key))


def test_both_loaders_are_loader_like_for_mypy(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    check = tmp_path / "check_loader_like.py"
    check.write_text(STATIC_CHECK)
    out, err, status = api.run(["--strict", "--config-file", str(REPO / "python" / "pyproject.toml"), str(check)])
    assert status == 0, out + err


def test_local_loader_is_loader_like(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset))
    assert isinstance(loader, sluice.LoaderLike)
    assert (loader.rank, loader.world_size) == (0, 1)
    assert _keys(loader) == tuple(range(N_IMAGES))
    stats = loader.stats()
    assert {"batches", "samples", "elapsed_s", "samples_per_s", "wait_s"} <= set(stats)


def test_remote_loader_has_the_same_interface(dataset: Path, service: str) -> None:
    loader = sluice.RemoteLoader(small_pipeline(dataset, seed=5), dispatcher=service, job="like")
    assert isinstance(loader, sluice.LoaderLike)
    assert (loader.rank, loader.world_size) == (0, 1)

    # Epochs 0 and 1, then back to epoch 0 with set_epoch: the same samples, the same order
    # of work, and stats that count everything received.
    first = [(b.index, b.key.tolist()) for b in loader]
    assert sorted(k for _, keys in first for k in keys) == list(range(N_IMAGES))
    assert _keys(loader) == tuple(range(N_IMAGES)) and loader.epoch == 2
    loader.set_epoch(0)
    assert loader.epoch == 0
    again = sorted((b.epoch, b.index, b.key.tolist()) for b in loader)
    assert [(i, keys) for _, i, keys in again] == sorted(first) and {e for e, _, _ in again} == {0}
    assert loader.epoch == 1

    stats = loader.stats()
    assert stats["batches"] == 3 * len(loader) and stats["samples"] == 3 * N_IMAGES
    assert stats["bytes"] == 3 * N_IMAGES * 32 * 32 * 3
    assert stats["elapsed_s"] > 0 and stats["samples_per_s"] > 0 and stats["wait_s"] >= 0
    assert stats["shared_memory_batches"] == 3 * len(loader) and stats["duplicates_dropped"] == 0
    with pytest.raises(ValueError):
        loader.set_epoch(-1)


def test_remote_importance_reports_reach_the_dispatcher_and_shape_the_next_epoch(dataset: Path, service: str) -> None:
    uniform = sluice.RemoteLoader(small_pipeline(dataset), dispatcher=service, job="uniform")
    batch = next(iter(uniform))
    with pytest.raises(sluice.JobFailedError, match="samples uniformly"):
        uniform.report(batch.key, [1.0] * len(batch.key))

    loader = sluice.RemoteLoader(small_pipeline(dataset).sampling("importance"), dispatcher=service, job="importance")
    local = sluice.Loader(small_pipeline(dataset).sampling("importance"))
    remote_epochs, local_epochs = [], []
    for _ in range(2):
        for runs, source in ((remote_epochs, loader), (local_epochs, local)):
            seen = []
            for b in source:
                keys = [int(k) for k in b.key]
                with source.record_importance(b.key) as rec:
                    rec.losses([10.0 if k < 4 else 0.1 for k in keys])
                seen.extend(keys)
            runs.append(sorted(seen))
    assert remote_epochs == local_epochs, "the dispatcher draws what the local loader draws"
    assert sum(1 for k in remote_epochs[1] if k < 4) > 4, "the hard samples are drawn more"
    with pytest.raises(sluice.ServiceRequestError):
        loader.report([1, 2], [1.0])
    with pytest.raises(sluice.ServiceRequestError, match="REPORT_KIND_LOSS"):
        loader.update_gradient_info([1], [1.0])
