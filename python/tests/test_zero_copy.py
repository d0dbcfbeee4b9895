"""Batches reach Python without a copy: numpy arrays and torch tensors point at the very
buffer sluice's worker threads wrote into."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sluice
from conftest import N_IMAGES, small_pipeline

torch = pytest.importorskip("torch")


def test_numpy_image_is_the_rust_buffer(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset))
    for batch in loader:
        assert batch.buffer_address != 0
        assert batch.image.ctypes.data == batch.buffer_address
        assert batch.image.flags["C_CONTIGUOUS"] and batch.image.flags["WRITEABLE"]
        # numpy does not own a copy: the array's base chain ends in sluice's buffer owner.
        assert batch.image.base is not None


def test_torch_tensor_shares_memory_with_the_rust_buffer(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset), output="torch")
    for batch in loader:
        assert isinstance(batch.image, torch.Tensor) and batch.image.dtype == torch.uint8
        assert batch.image.data_ptr() == batch.buffer_address
        assert batch.label.dtype == torch.int64 and batch.key.dtype == torch.int64
        assert batch.image.is_contiguous()


def test_writes_through_torch_are_visible_in_numpy(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset))
    batch = next(iter(loader))
    array = batch.image
    tensor = torch.from_numpy(array)
    assert tensor.data_ptr() == array.ctypes.data == batch.buffer_address
    before = int(array[0, 0, 0, 0])
    tensor[0, 0, 0, 0] = (before + 77) % 256
    tensor[-1].fill_(7)
    assert int(array[0, 0, 0, 0]) == (before + 77) % 256
    assert np.all(array[-1] == 7)
    assert np.shares_memory(array, tensor.numpy())

    # And the other way round, from torch output.
    tbatch = next(iter(sluice.Loader(small_pipeline(dataset), output="torch")))
    view = tbatch.image.numpy()
    assert view.ctypes.data == tbatch.buffer_address
    tbatch.image[0].zero_()
    assert not view[0].any()


def test_freed_batch_buffers_are_reused_and_held_ones_never_overwritten(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset, batch=4).prefetch(2))

    def epoch0() -> "sluice.BatchIterator":
        loader.set_epoch(0)  # the same pixels every time
        return iter(loader)

    # Batches dropped at once: their buffers come back, so later batches are built in them
    # (at the same addresses) instead of in fresh memory.
    addresses = [b.buffer_address for b in epoch0()]
    assert len(addresses) == N_IMAGES // 4
    assert len(set(addresses)) < len(addresses)
    assert loader.stats()["buffers_reused"] >= len(addresses) - 4

    # Batches kept alive: none comes back, every one has its own buffer, and its pixels
    # stay as they were while the loader builds the next ones.
    reference = [b.image.copy() for b in epoch0()]
    before = loader.stats()["buffers_reused"]
    held = list(epoch0())
    assert len({b.buffer_address for b in held}) == len(held)
    assert loader.stats()["buffers_reused"] <= before + 4  # only what `reference` let go
    assert all(np.array_equal(b.image, expected) for b, expected in zip(held, reference))

    # A view of the image, or a tensor over it, keeps the buffer from being reused.
    views = [b.image[1:] for b in epoch0()]
    tensors = [torch.from_numpy(b.image) for b in epoch0()]
    again = [b.image.copy() for b in epoch0()]
    assert all(np.array_equal(v, e[1:]) for v, e in zip(views, reference))
    assert all(np.array_equal(t.numpy(), e) for t, e in zip(tensors, reference))
    assert all(np.array_equal(a, e) for a, e in zip(again, reference))
