"""sluice.jax.JaxLoader on the CPU backend: a training step, exact resume, zero copy
through DLPack (pointer equality) and a sharded device_put."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, List

import numpy as np
import pytest

import sluice
from conftest import N_CLASSES, N_IMAGES, small_pipeline

jax = pytest.importorskip("jax", reason="sluice.jax needs jax (pip install 'jax[cpu]')")
jnp = pytest.importorskip("jax.numpy")
from sluice.jax import JaxLoader  # noqa: E402


class Recording:
    """A real sluice.Loader that also keeps the numpy batches it handed out."""

    def __init__(self, loader: sluice.Loader) -> None:
        self.loader = loader
        self.batches: List[sluice.Batch] = []

    def __iter__(self) -> Iterator[sluice.Batch]:
        for b in self.loader:
            self.batches.append(b)
            yield b

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def test_a_linear_model_trains_one_step_on_jax_batches(dataset: Path) -> None:
    loader = JaxLoader(sluice.Loader(small_pipeline(dataset, batch=16)))
    batch = next(iter(loader))
    assert isinstance(batch["image"], jax.Array) and batch["image"].dtype == jnp.uint8
    assert batch["image"].shape == (16, 32, 32, 3) and batch["label"].shape == (16,)

    def loss_fn(w: Any, x: Any, y: Any) -> Any:
        logits = (x.reshape(x.shape[0], -1).astype(jnp.float32) / 255.0) @ w
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y])

    w = jnp.zeros((32 * 32 * 3, N_CLASSES))
    loss, grad = jax.value_and_grad(loss_fn)(w, batch["image"], batch["label"])
    w2 = w - 0.001 * grad
    loss2 = loss_fn(w2, batch["image"], batch["label"])
    assert np.isfinite(float(loss)) and np.isclose(float(loss), np.log(N_CLASSES), atol=1e-5)
    assert float(loss2) < float(loss)


def test_jax_loader_resumes_mid_epoch_exactly(dataset: Path) -> None:
    full = JaxLoader(sluice.Loader(small_pipeline(dataset, seed=3)))
    full.set_epoch(2)
    expected = [np.asarray(b["key"]).tolist() for b in full]
    assert len(expected) == len(full) == 6

    first = JaxLoader(sluice.Loader(small_pipeline(dataset, seed=3)))
    first.set_epoch(2)
    it = iter(first)
    got = [np.asarray(next(it)["key"]).tolist() for _ in range(2)]
    state = first.state_dict()
    assert state["epoch"] == 2 and state["batch"] == 2

    resumed = JaxLoader(sluice.Loader(small_pipeline(dataset, seed=3)))
    resumed.load_state_dict(state)
    got += [np.asarray(b["key"]).tolist() for b in resumed]
    assert got == expected
    assert resumed.stats()["samples"] == N_IMAGES - 16


def test_jax_arrays_share_sluices_buffer_on_cpu_when_aligned(dataset: Path) -> None:
    source = Recording(sluice.Loader(small_pipeline(dataset)))
    out = list(JaxLoader(source))
    assert len(out) == len(source.batches) == 6
    for arrays, batch in zip(out, source.batches):
        pointer = batch.image.__array_interface__["data"][0]
        assert pointer == batch.buffer_address
        # XLA's CPU backend takes a DLPack buffer as it is when it is 64-byte aligned and
        # copies it otherwise; sluice's batch buffers are 16-byte aligned.
        assert pointer % 16 == 0
        shared = arrays["image"].unsafe_buffer_pointer() == pointer
        assert shared == (pointer % 64 == 0), (pointer % 64, shared)
        np.testing.assert_array_equal(np.asarray(arrays["image"]), batch.image)
        # int64 labels become int32 under JAX's default 32-bit mode (a small copy).
        assert arrays["label"].dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(arrays["label"]), batch.label)


def test_jax_loader_device_puts_with_a_sharding(dataset: Path) -> None:
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.local_devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    source = Recording(sluice.Loader(small_pipeline(dataset)))
    batch = next(iter(JaxLoader(source, sharding=sharding)))
    assert batch["image"].sharding == sharding and batch["label"].sharding == sharding
    np.testing.assert_array_equal(np.asarray(batch["image"]), source.batches[0].image)
