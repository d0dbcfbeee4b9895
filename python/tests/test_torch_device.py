"""sluice.torch.DeviceLoader and its PinnedRing: ring reuse and event ordering (with
events the test completes by hand), the CPU fallback, pass-through and exact resume."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List

import pytest

import sluice
from conftest import N_IMAGES, small_pipeline

torch = pytest.importorskip("torch")
import sluice.torch as st  # noqa: E402
from sluice.torch import DeviceLoader, PinnedRing, to_device  # noqa: E402


class HandEvent:
    """An event the test completes by hand; ``synchronize`` records that someone waited
    (and completes it, as a real wait would)."""

    def __init__(self) -> None:
        self.done = False
        self.waited = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = True
        self.done = True


def test_pinned_ring_never_hands_out_a_buffer_whose_upload_is_pending() -> None:
    ring = PinnedRing(2, pin_memory=False)
    s0, b0 = ring.acquire(100)
    e0 = HandEvent()
    ring.release(s0, e0)
    s1, b1 = ring.acquire(100)
    e1 = HandEvent()
    ring.release(s1, e1)
    assert (s0, s1) == (0, 1) and b0.data_ptr() != b1.data_ptr()
    # Slot 0 is next; its upload has not completed: not handed out.
    assert ring.try_acquire(100) is None
    assert ring.try_acquire(100) is None
    e0.done = True
    got = ring.try_acquire(100)
    assert got is not None and got[0] == 0 and got[1].data_ptr() == b0.data_ptr()
    ring.release(0, HandEvent())
    # Slot 1 pending: acquire() waits for its event before handing the buffer out.
    s, b = ring.acquire(100)
    assert s == 1 and e1.waited and b.data_ptr() == b1.data_ptr()
    assert ring.waits == 1
    # Buffers were allocated once each and reused.
    assert ring.allocations == 2


def test_pinned_ring_refuses_a_slot_still_held_and_grows_only_when_needed() -> None:
    ring = PinnedRing(1, pin_memory=False)
    slot, buf = ring.acquire(64)
    with pytest.raises(RuntimeError, match="never released"):
        ring.acquire(64)
    done = HandEvent()
    done.done = True
    ring.release(slot, done)
    with pytest.raises(RuntimeError, match="not held"):
        ring.release(slot, done)
    _, same = ring.acquire(32)
    assert same.data_ptr() == buf.data_ptr() and ring.allocations == 1
    ring.release(0, done)
    _, bigger = ring.acquire(128)
    assert bigger.numel() >= 128 and ring.allocations == 2
    with pytest.raises(ValueError):
        PinnedRing(0, pin_memory=False)


def test_device_loader_on_cpu_converts_like_to_device_and_says_so_once(
    dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    st._cpu_fallback_said = False
    caplog.set_level(logging.WARNING, logger="sluice.torch")
    ref = [to_device(b, "cpu", channels_last=True) for b in sluice.Loader(small_pipeline(dataset))]
    dl = DeviceLoader(sluice.Loader(small_pipeline(dataset)), "cpu", channels_last=True)
    DeviceLoader(sluice.Loader(small_pipeline(dataset)), "cpu")
    said = [r for r in caplog.records if "DeviceLoader" in r.getMessage()]
    assert len(said) == 1 and "on the CPU" in said[0].getMessage()
    got = list(dl)
    assert len(got) == len(ref) == len(dl) == 6
    for a, b in zip(got, ref):
        assert a.image.device.type == "cpu" and a.image.dtype == torch.float32
        assert a.image.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(a.image, b.image)
        assert torch.equal(a.label, b.label) and torch.equal(a.key, b.key)
    assert sorted(torch.cat([b.key for b in got]).tolist()) == list(range(N_IMAGES))
    stats = dl.stats()
    assert stats["samples"] == N_IMAGES and stats["device_loader"]["device"] == "cpu"
    bf = next(iter(DeviceLoader(sluice.Loader(small_pipeline(dataset)), "cpu", dtype=torch.bfloat16)))
    assert bf.image.dtype == torch.bfloat16 and bf.image.shape == (8, 3, 32, 32)


def _keys(batches: List[sluice.Batch]) -> List[List[int]]:
    return [b.key.tolist() for b in batches]


def test_device_loader_state_counts_batches_received_not_prefetched(dataset: Path) -> None:
    full = DeviceLoader(sluice.Loader(small_pipeline(dataset, seed=5)), "cpu")
    full.set_epoch(1)
    expected = _keys(list(full))

    dl = DeviceLoader(sluice.Loader(small_pipeline(dataset, seed=5)), "cpu", prefetch_device=3)
    dl.set_epoch(1)
    it = iter(dl)
    received = [next(it), next(it)]
    # Five batches were pulled from sluice (two received, three in flight): the state
    # must say two.
    assert dl.loader.state_dict()["batch"] == 5
    state = dl.state_dict()
    assert state["epoch"] == 1 and state["batch"] == 2

    resumed = DeviceLoader(sluice.Loader(small_pipeline(dataset, seed=5)), "cpu", prefetch_device=3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert _keys(received) + _keys(rest) == expected
    # After a whole epoch nothing is in flight: the state is the loader's.
    assert resumed.state_dict() == resumed.loader.state_dict()


def test_device_loader_set_epoch_drops_batches_in_flight(dataset: Path) -> None:
    dl = DeviceLoader(sluice.Loader(small_pipeline(dataset, seed=2)), "cpu")
    it = iter(dl)
    next(it)
    dl.set_epoch(3)
    assert list(it) == []  # the old epoch's iterator stops
    assert dl.state_dict()["batch"] == 0 and dl.epoch == 3
    assert len(list(dl)) == 6
    with pytest.raises(ValueError, match="prefetch_device"):
        DeviceLoader(dl.loader, "cpu", prefetch_device=0)
    with pytest.raises(ValueError, match="floating"):
        DeviceLoader(dl.loader, "cpu", dtype=torch.int32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_loader_cuda_matches_cpu_and_resumes(dataset: Path) -> None:
    ref = list(DeviceLoader(sluice.Loader(small_pipeline(dataset)), "cpu", dtype=torch.bfloat16, channels_last=True))
    dl = DeviceLoader(sluice.Loader(small_pipeline(dataset)), "cuda", dtype=torch.bfloat16, channels_last=True)
    got = list(dl)
    for a, b in zip(got, ref):
        assert a.image.is_cuda and a.label.is_cuda and not a.key.is_cuda
        assert a.image.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(a.image.float().cpu(), b.image.float(), rtol=1e-2, atol=1e-2)
        assert torch.equal(a.label.cpu(), b.label)
    stats = dl.stats()["device_loader"]
    assert stats["pinned_buffers"] == 3  # prefetch_device + 1, allocated once


def test_device_loader_leaves_the_trainer_a_core_on_the_default_thread_count(dataset: Path) -> None:
    import os

    cores = len(os.sched_getaffinity(0))
    default = sluice.Pipeline.image_folder(dataset).decode().center_crop(16).batch(8)
    dl = DeviceLoader(sluice.Loader(default), "cpu")
    if cores >= 2:
        assert dl.threads_adjusted and dl.loader.threads == cores - 1
    explicit = DeviceLoader(sluice.Loader(small_pipeline(dataset)), "cpu")
    assert not explicit.threads_adjusted and explicit.loader.threads == 2
    assert len(list(dl)) == 6
