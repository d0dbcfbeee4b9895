"""Iterating a loader: shapes, dtypes, labels, keys, epochs, stats, threads."""

from __future__ import annotations

from pathlib import Path
from typing import List

import numpy as np
import pytest

import sluice
from conftest import N_CLASSES, N_IMAGES, run_python, small_pipeline


def epoch_keys(loader: sluice.Loader) -> List[int]:
    return [int(k) for b in loader for k in b["key"]]


def test_batches_have_the_right_shapes_dtypes_and_labels(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset, batch=10, size=32))
    assert len(loader) == 5  # 48 samples in batches of 10: the last one short
    assert loader.num_samples == N_IMAGES and loader.samples_per_epoch == N_IMAGES
    assert loader.classes == [f"class_{c:03}" for c in range(N_CLASSES)]
    sizes = []
    for i, batch in enumerate(loader):
        assert (batch.epoch, batch.index) == (0, i)
        assert batch.image.dtype == np.uint8 and batch.image.shape[1:] == (32, 32, 3)
        assert batch.label.dtype == np.int64 and batch.key.dtype == np.int64
        assert batch.image.shape[0] == batch.size == len(batch.label) == len(batch.key)
        assert batch["image"] is batch.image and batch.weight is None and "weight" not in batch
        assert set(batch) == {"image", "label", "key"} and batch.layout == "hwc"
        assert batch.image.std() > 5  # real pixels, not a zeroed buffer
        for key, label in zip(batch.key, batch.label):
            # The label is the class folder of the sample's file.
            assert Path(loader.path_of(int(key))).parent.name == loader.classes[label]
        sizes.append(batch.size)
    assert sizes == [10, 10, 10, 10, 8]


def test_keys_cover_the_dataset_once_per_epoch_in_a_new_order(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset))
    first, second = epoch_keys(loader), epoch_keys(loader)
    assert sorted(first) == sorted(second) == list(range(N_IMAGES))
    assert first != second  # global shuffle: a new permutation each epoch
    assert loader.epoch == 2


def test_same_seed_same_batches_and_set_epoch_replays(dataset: Path) -> None:
    a = sluice.Loader(small_pipeline(dataset, seed=3))
    b = sluice.Loader(small_pipeline(dataset, seed=3))
    b.set_threads(1)  # output does not depend on the thread count
    for x, y in zip(a, b):
        assert np.array_equal(x.key, y.key)
        assert np.array_equal(x.image, y.image)
    b.set_epoch(0)
    again = next(iter(b))
    a.set_epoch(0)
    assert np.array_equal(next(iter(a)).image, again.image)
    c = sluice.Loader(small_pipeline(dataset, seed=4))
    assert epoch_keys(c) != epoch_keys(sluice.Loader(small_pipeline(dataset, seed=3)))


def test_an_abandoned_epoch_is_left_behind_like_a_dataloader(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset))
    it = iter(loader)
    next(it)
    next(it)
    assert loader.state_dict()["batch"] == 2
    second = iter(loader)  # a new pass: the next epoch, from its start
    assert second.epoch == 1 and second.remaining == len(loader)
    assert next(second).index == 0
    with pytest.raises(StopIteration):
        next(it)  # the old iterator is retired


def test_unshuffled_float_chw_output_and_drop_last(dataset: Path) -> None:
    pipe = (
        sluice.Pipeline.image_folder(dataset)
        .decode()
        .resize(40)
        .center_crop((24, 32))
        .normalize()
        .layout("chw")
        .shuffle("none")
        .batch(20, drop_last=True)
    )
    loader = sluice.Loader(pipe)
    batches = list(loader)
    assert len(loader) == len(batches) == 2
    assert batches[0].image.dtype == np.float32 and batches[0].image.shape == (20, 3, 24, 32)
    assert batches[0].layout == "chw"
    assert [int(k) for b in batches for k in b.key] == list(range(40))  # manifest order
    assert -3 < batches[0].image.min() < 0 < batches[0].image.max() < 3  # normalised


def test_stats_report_throughput_op_times_and_wait(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset))
    n = sum(b.size for b in loader)
    stats = loader.stats()
    assert stats["samples"] == n == N_IMAGES and stats["batches"] == len(loader)
    assert stats["samples_per_s"] > 0 and stats["bytes_read"] > N_IMAGES * 1000
    assert stats["wait_s"] >= 0 and stats["skipped"] == []
    assert list(stats["op_seconds"])[0] == "read"
    assert any("random_resized_crop" in name for name in stats["op_seconds"])
    assert sum(stats["op_seconds"].values()) > 0
    assert list(stats["op_percentiles"]) == list(stats["op_seconds"])
    for op, p in stats["op_percentiles"].items():
        assert p["samples"] == N_IMAGES, op
        # One sample's time in an op is at most all samples' time in it.
        assert 0 < p["p50_s"] <= p["p99_s"] <= stats["op_seconds"][op], op
    assert stats["threads"] == 2


def test_threads_can_change_while_iterating(dataset: Path) -> None:
    loader = sluice.Loader(small_pipeline(dataset))
    assert loader.threads == 2
    it = iter(loader)
    next(it)
    loader.set_threads(1)
    assert loader.threads == 1
    loader.threads = 3
    assert loader.threads == 3
    assert 1 + sum(1 for _ in it) == len(loader)
    assert "3 threads" in repr(loader)


def test_loader_accepts_dicts_and_spec_files(dataset: Path, tmp_path: Path) -> None:
    pipe = small_pipeline(dataset)
    pipe.save(tmp_path / "spec.toml")
    for spec in (pipe.to_dict(), tmp_path / "spec.toml", str(tmp_path / "spec.toml")):
        loader = sluice.Loader(spec)
        assert loader.pipeline.to_dict() == pipe.to_dict()
        assert epoch_keys(loader) == epoch_keys(sluice.Loader(pipe))
    with pytest.raises(TypeError):
        sluice.Loader(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sluice.Loader(pipe, output="jax")


def test_import_sluice_does_not_import_torch() -> None:
    r = run_python(
        """
        import sys, sluice
        assert "torch" not in sys.modules, "import sluice imported torch"
        print("ok", sluice.__version__)
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_generate_dataset_is_deterministic(tmp_path: Path) -> None:
    a = sluice.generate_dataset(tmp_path / "a", images=3, classes=2, seed=5, corrupt=2)
    b = sluice.generate_dataset(tmp_path / "b", images=3, classes=2, seed=5)
    assert a["images"] == b["images"] == 3 and len(a["bad_files"]) == 2 and a["bytes"] > 3000
    for rel in ("class_000/img_0000000.jpg", "class_001/img_0000001.jpg", "class_000/img_0000002.jpg"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    assert all(Path(p).exists() for p in a["bad_files"])
    with pytest.raises(ValueError, match="quality"):
        sluice.generate_dataset(tmp_path / "c", images=1, quality=0)
