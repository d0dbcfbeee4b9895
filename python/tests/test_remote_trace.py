"""A RemoteLoader's trace, read back by Google's ``protobuf`` package (not sluice's prost
code): the worker's batch builds and the trainer's events in one timeline, a flow from each
build to its hand-over, and the same interface as :class:`sluice.Loader`'s traces."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Iterator, Tuple

import pytest
from test_trace import perfetto, slices

import sluice
from conftest import N_IMAGES, sluice_service

__all__ = ["perfetto"]


@pytest.fixture()
def service(dataset: Path, tmp_path: Path) -> Iterator[Tuple[str, Path]]:
    with sluice_service([dataset], tmp_path / "journal") as addr:
        yield addr, dataset


def _pipeline(root: Path) -> sluice.Pipeline:
    return sluice.Pipeline.image_folder(root).decode().random_resized_crop(32).batch(8).seed(1)


def test_a_remote_trace_shows_worker_builds_flowing_into_the_trainers_hand_overs(
    perfetto: ModuleType, service: Tuple[str, Path], tmp_path: Path
) -> None:
    addr, root = service
    whole = tmp_path / "whole.pftrace"
    loader = sluice.RemoteLoader(_pipeline(root), dispatcher=addr, job="py-trace", trace=whole)
    block = tmp_path / "block.pftrace"
    with pytest.raises(sluice.SluiceError, match="already being recorded"):
        with loader.trace(block):
            pass
    keys = [int(k) for batch in loader for k in batch.key]
    assert sorted(keys) == list(range(N_IMAGES))
    assert loader.close_trace() is not None

    durations, threads, flows, ends = slices(perfetto, whole)
    batches = N_IMAGES // 8
    assert len(durations["batch_built"]) == batches
    assert len(durations["batch_wait"]) == batches
    assert len(flows) == len(ends) == batches and sorted(flows) == sorted(ends)
    trace = perfetto.Trace()
    trace.ParseFromString(whole.read_bytes())
    names = [p.track_descriptor.process.process_name for p in trace.packet if p.track_descriptor.HasField("process")]
    assert "sluice client" in names and any(n.startswith("sluice worker ") for n in names), names

    # A block of the next epoch, as with the local loader.
    with loader.trace(block):
        assert sum(len(b.key) for b in loader) == N_IMAGES
    durations, _, flows, ends = slices(perfetto, block)
    assert len(durations["batch_wait"]) == batches
    assert set(ends) <= set(flows), "every flow ends at a build's flow"
