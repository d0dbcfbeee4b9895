"""sluice.tf.dataset: a tf.data.Dataset over a loader (a training step, exact resume, the
output signature, and the copy TensorFlow's generator op makes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterator, List

import numpy as np
import pytest

import sluice
from conftest import N_CLASSES, N_IMAGES, small_pipeline

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow", reason="sluice.tf needs tensorflow (pip install tensorflow-cpu)")
from sluice.tf import dataset, output_signature  # noqa: E402


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


def test_a_linear_model_trains_one_step_on_a_tf_dataset(dataset_dir: Path) -> None:
    ds = dataset(sluice.Loader(small_pipeline(dataset_dir, batch=16)))
    assert isinstance(ds, tf.data.Dataset)
    batch = next(iter(ds))
    assert batch["image"].dtype == tf.uint8 and tuple(batch["image"].shape) == (16, 32, 32, 3)
    assert batch["label"].dtype == tf.int64 and "weight" not in batch

    w = tf.Variable(tf.zeros((32 * 32 * 3, N_CLASSES)))
    x = tf.reshape(tf.cast(batch["image"], tf.float32) / 255.0, (16, -1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(batch["label"], x @ w))
    w.assign_sub(0.001 * tape.gradient(loss, w))
    loss2 = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(batch["label"], x @ w))
    assert np.isfinite(float(loss)) and np.isclose(float(loss), np.log(N_CLASSES), atol=1e-5)
    assert float(loss2) < float(loss)


def test_tf_dataset_resumes_mid_epoch_exactly(dataset_dir: Path) -> None:
    full = dataset(sluice.Loader(small_pipeline(dataset_dir, seed=4)))
    full.set_epoch(1)
    expected = [b["key"].numpy().tolist() for b in full]
    assert len(expected) == 6

    first = dataset(sluice.Loader(small_pipeline(dataset_dir, seed=4)))
    first.set_epoch(1)
    it = iter(first)
    got = [next(it)["key"].numpy().tolist() for _ in range(2)]
    time.sleep(1.0)  # a training step: time enough for anything prefetching to pull ahead
    state = first.state_dict()
    assert state["epoch"] == 1 and state["batch"] == 2

    resumed = dataset(sluice.Loader(small_pipeline(dataset_dir, seed=4)))
    resumed.load_state_dict(state)
    got += [b["key"].numpy().tolist() for b in resumed]
    assert got == expected
    assert resumed.stats()["samples"] == N_IMAGES - 16


def test_tf_tensors_hold_the_loaders_batches_in_order(dataset_dir: Path) -> None:
    source = Recording(sluice.Loader(small_pipeline(dataset_dir)))
    got = list(dataset(source))
    assert len(got) == len(source.batches) == 6
    for tensors, batch in zip(got, source.batches):
        np.testing.assert_array_equal(tensors["image"].numpy(), batch.image)
        np.testing.assert_array_equal(tensors["label"].numpy(), batch.label)
        np.testing.assert_array_equal(tensors["key"].numpy(), batch.key)


def test_output_signature_follows_the_pipeline(dataset_dir: Path) -> None:
    pipe = sluice.Pipeline.image_folder(dataset_dir).decode().center_crop(16).normalize().layout("chw").batch(4)
    sig = output_signature(sluice.Loader(pipe))
    assert sig["image"].dtype == tf.float32 and set(sig) == {"image", "label", "key"}
    batch = next(iter(dataset(sluice.Loader(pipe))))
    assert batch["image"].dtype == tf.float32 and tuple(batch["image"].shape) == (4, 3, 16, 16)
    with pytest.raises(ValueError, match="image_dtype"):
        output_signature(sluice.Loader(pipe), image_dtype="f16")


@pytest.fixture
def dataset_dir(dataset: Path) -> Path:
    return dataset
