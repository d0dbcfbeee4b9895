"""sluice.RemoteLoader against real ``sluice dispatcher`` and ``sluice worker`` processes on
127.0.0.1 (the binary ``cargo test`` builds)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import sluice
from conftest import N_IMAGES, sluice_service


@pytest.fixture()
def service(dataset: Path, tmp_path: Path) -> Iterator[Tuple[str, Path]]:
    """A dispatcher and one worker allowed to read the shared dataset only."""
    with sluice_service([dataset], tmp_path / "journal") as addr:
        yield addr, dataset


def _pipeline(root: Path, seed: int = 0) -> sluice.Pipeline:
    return sluice.Pipeline.image_folder(root).decode().random_resized_crop(32).batch(8).seed(seed)


def test_an_epoch_arrives_exactly_once_and_a_state_dict_resumes_it(service: Tuple[str, Path]) -> None:
    addr, root = service
    loader = sluice.RemoteLoader(_pipeline(root), dispatcher=addr, job="py")
    assert len(loader) == N_IMAGES // 8
    keys = [int(k) for batch in loader for k in batch.key]
    assert sorted(keys) == list(range(N_IMAGES))
    assert loader.epoch == 1

    # Read two batches of epoch 1, checkpoint, and resume in a new loader.
    it = iter(loader)
    first = [next(it), next(it)]
    assert all(b.image.shape[1:] == (32, 32, 3) and b.layout == "hwc" for b in first)
    state = loader.state_dict()
    assert state["epoch"] == 1 and len(state["delivered"]) == 2
    del it, loader
    resumed = sluice.RemoteLoader(_pipeline(root), dispatcher=addr, job="py", output="numpy")
    resumed.load_state_dict(state)
    keys = [int(k) for b in first for k in b.key] + [int(k) for b in resumed for k in b.key]
    assert sorted(keys) == list(range(N_IMAGES))


def test_paths_outside_the_allowed_roots_are_refused(service: Tuple[str, Path], tmp_path: Path) -> None:
    addr, _ = service
    outside = tmp_path / "outside"
    sluice.generate_dataset(outside, images=2, classes=1)
    with pytest.raises(PermissionError, match="outside the allowed roots"):
        sluice.RemoteLoader(_pipeline(outside), dispatcher=addr, job="outside")


def test_parallel_epochs_deliver_every_sample_once_per_pass(service: Tuple[str, Path]) -> None:
    addr, root = service
    loader = sluice.RemoteLoader(_pipeline(root, seed=3), dispatcher=addr, job="py-parallel", parallel_epochs=2)
    assert len(loader) == 2 * (N_IMAGES // 8)
    keys = sorted(int(k) for batch in loader for k in batch.key)
    assert keys == sorted(list(range(N_IMAGES)) * 2)


def test_every_data_plane_and_compression_gives_equal_batches_and_unknown_ones_are_refused(
    service: Tuple[str, Path],
) -> None:
    addr, root = service

    def epoch(job: str, **options: str) -> Tuple[List[Tuple[int, List[int], bytes]], int]:
        loader = sluice.RemoteLoader(_pipeline(root, seed=4), dispatcher=addr, job=job, **options)
        batches = sorted((b.index, b.key.tolist(), b.image.tobytes()) for b in loader)
        return batches, loader.shared_memory_batches

    # The worker runs on this machine: by default its batches come through shared memory.
    plain, shared = epoch("py-plain")
    assert shared == len(plain) == N_IMAGES // 8
    assert epoch("py-zstd", compression="zstd") == (plain, len(plain))
    assert epoch("py-tcp", data_plane="tcp") == (plain, 0)
    assert epoch("py-grpc", data_plane="grpc", compression="zstd") == (plain, 0)
    with pytest.raises(ValueError, match="unknown compression"):
        sluice.RemoteLoader(_pipeline(root), dispatcher=addr, job="py-bad", compression="zip")
    with pytest.raises(ValueError, match="unknown data plane"):
        sluice.RemoteLoader(_pipeline(root), dispatcher=addr, job="py-bad", data_plane="udp")


def test_skipped_samples_are_listed_by_stats_as_the_local_loader_lists_them(
    bad_dataset: Dict[str, Any], tmp_path: Path
) -> None:
    root = bad_dataset["root"]
    pipe = _pipeline(root).batch(1).on_error("skip")
    with sluice_service([root], tmp_path / "journal") as addr:
        remote = sluice.RemoteLoader(pipe, dispatcher=addr, job="skips")
        remote_keys = sorted(int(k) for b in remote for k in b.key)
        skipped = remote.stats()["skipped"]
    local = sluice.Loader(pipe)
    local_keys = sorted(int(k) for b in local for k in b.key)
    assert remote_keys == local_keys and len(remote_keys) == bad_dataset["good"]
    by_key = {s["key"]: s for s in skipped}
    assert sorted(by_key) == sorted(s["key"] for s in local.stats()["skipped"])
    assert sorted(s["path"] for s in skipped) == sorted(bad_dataset["bad_files"])
    assert all(s["error"] for s in skipped)


def test_stats_tell_the_jobs_cache_hits_by_the_local_loaders_names(service: Tuple[str, Path]) -> None:
    addr, root = service
    pipeline = _pipeline(root).cache(1 << 30, level="raw").sampling("importance")
    loader = sluice.RemoteLoader(pipeline, dispatcher=addr, job="cached")
    for _ in range(2):
        for batch in loader:
            loader.report(batch.key, [1.0] * len(batch.key))
    # The workers' heartbeats (every 250 ms) bring the counts to the dispatcher.
    deadline = time.monotonic() + 10
    cache = loader.stats()["cache"]
    while cache["hits"] + cache["misses"] < 2 * N_IMAGES and time.monotonic() < deadline:
        time.sleep(0.1)
        cache = loader.stats()["cache"]
    local = sluice.Loader(pipeline)
    next(iter(local))
    assert {"hits", "misses", "hit_rate"} <= set(local.stats()["cache"]) & set(cache)
    # Epoch 0 fills the cache (it holds the whole dataset), epoch 1 hits.
    assert cache["hits"] >= N_IMAGES and cache["misses"] >= N_IMAGES, cache
    assert cache["hit_rate"] == pytest.approx(cache["hits"] / (cache["hits"] + cache["misses"]))
    assert cache["entries"] == N_IMAGES, cache


def test_a_checkpoint_resumes_on_a_service_with_another_worker_count(dataset: Path, tmp_path: Path) -> None:
    # A remote job's state holds its epoch and the indices of the batches delivered, no
    # worker count: batch i of an epoch is the same samples whichever worker builds it.
    def by_index(batches: List[Any]) -> Dict[int, List[int]]:
        return {int(b.index): sorted(int(k) for k in b.key) for b in batches}

    with sluice_service([dataset], tmp_path / "two", workers=2) as addr:
        loader = sluice.RemoteLoader(_pipeline(dataset, seed=4), dispatcher=addr, job="elastic")
        it = iter(loader)
        first = [next(it), next(it), next(it)]
        state = loader.state_dict()
        del it, loader
    assert "workers" not in state
    with sluice_service([dataset], tmp_path / "three", workers=3) as addr:
        resumed = sluice.RemoteLoader(_pipeline(dataset, seed=4), dispatcher=addr, job="elastic")
        resumed.load_state_dict(state)
        rest = list(resumed)
        whole = list(sluice.RemoteLoader(_pipeline(dataset, seed=4), dispatcher=addr, job="elastic-whole"))
    got = by_index(first)
    assert not set(got) & set(by_index(rest)), "a batch was delivered twice"
    got.update(by_index(rest))
    assert got == by_index(whole)
    assert sorted(k for keys in got.values() for k in keys) == list(range(N_IMAGES))


def test_a_remote_loader_measures_and_takes_reports_of_the_accelerator_busy_fraction(
    service: Tuple[str, Path],
) -> None:
    addr, root = service
    loader = sluice.RemoteLoader(_pipeline(root), dispatcher=addr, job="accelerator")
    assert loader.stats()["accelerator"] is None
    for _ in loader:
        time.sleep(0.005)  # a training step
    measured = loader.stats()["accelerator"]
    assert measured["source"] == "step_timing" and 0.0 < measured["busy"] <= 1.0, measured
    loader.report_accelerator_busy(0.9)  # what the heartbeats send from now on
    assert loader.stats()["accelerator"] == {"busy": 0.9, "source": "reported"}
