"""Pipeline.map: a user's Python between native ops, run in worker processes (docs/map.md).

The map functions live at the top of this module so the worker processes can import them
(``test_map:...``); each test runs real processes and stays bounded in time."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import sluice
from sluice.map_workers import MapWorkers

N = 48  # conftest's dataset


def mark(image: np.ndarray, sample: Any) -> np.ndarray:
    """Inverts the image and writes the key and label into its first pixel."""
    out = 255 - image
    out[0, 0] = [sample.key % 256, sample.label % 256, 7]
    return out


def noise(image: np.ndarray, sample: Any) -> np.ndarray:
    """Adds noise drawn from the sample's generator (so it depends on seed, epoch, key)."""
    return image ^ sample.rng.integers(0, 256, size=image.shape, dtype=np.uint8)


def slow_noise(image: np.ndarray, sample: Any) -> np.ndarray:
    time.sleep(0.01)
    return noise(image, sample)


def fail_on_key_5(image: np.ndarray, sample: Any) -> np.ndarray:
    if sample.key == 5:
        raise ValueError(f"cannot augment sample {sample.key}")
    return image


def pipe(root: Path, fn: Any = None, threads: int = 1, seed: int = 3) -> sluice.Pipeline:
    p = sluice.Pipeline.image_folder(root).decode().random_resized_crop(16)
    if fn is not None:
        p = p.map(fn)
    return p.random_horizontal_flip().batch(8).seed(seed).threads(threads)


def epoch(loader: sluice.Loader) -> List[Dict[str, np.ndarray]]:
    return [{k: np.asarray(v) for k, v in b.items()} for b in loader]


def assert_same(a: List[Dict[str, np.ndarray]], b: List[Dict[str, np.ndarray]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_map_output_equals_the_function_applied_by_hand(dataset: Path) -> None:
    plain = pipe(dataset).to_dict()
    # The flip comes after the map; the same pipeline with the map last is checkable by hand.
    plain["ops"] = plain["ops"][:2]
    mapped = sluice.Pipeline.from_dict(plain).map(mark)
    assert mapped.to_dict()["ops"][-1] == {"op": "map", "fn": "test_map:mark"}
    want = []
    for b in sluice.Loader(sluice.Pipeline.from_dict(plain), processes=0):
        images = np.stack([mark(img.copy(), _Sample(int(k), int(lab))) for img, k, lab in zip(b.image, b.key, b.label)])
        want.append({"image": images, "label": b.label, "key": b.key})
    for processes in (0, 2):
        loader = sluice.Loader(mapped, processes=processes)
        assert loader.processes == processes
        got = epoch(loader)
        assert_same(got, want)
        loader.close()


class _Sample:
    def __init__(self, key: int, label: int) -> None:
        self.key, self.label = key, label


def test_output_is_the_same_for_any_process_and_thread_count(dataset: Path) -> None:
    runs = {}
    for processes, threads in ((0, 1), (0, 2), (1, 1), (2, 1), (3, 2)):
        loader = sluice.Loader(pipe(dataset, noise, threads), processes=processes)
        runs[(processes, threads)] = [epoch(loader), epoch(loader)]
        loader.close()
    first = runs[(0, 1)]
    # The noise depends on the epoch: the second epoch differs from the first.
    assert not np.array_equal(first[0][0]["image"], first[1][0]["image"])
    for run in runs.values():
        for e in range(2):
            assert_same(run[e], first[e])
    assert sorted(np.concatenate([b["key"] for b in first[0]]).tolist()) == list(range(N))


def test_resume_mid_epoch_gives_the_same_remaining_batches(dataset: Path) -> None:
    whole = sluice.Loader(pipe(dataset, noise), processes=2)
    want = epoch(whole)
    whole.close()
    first = sluice.Loader(pipe(dataset, noise), processes=2)
    it = iter(first)
    head = [next(it), next(it)]
    state = first.state_dict()
    assert (state["epoch"], state["batch"]) == (0, 2)
    first.close()
    assert_same([{k: np.asarray(v) for k, v in b.items()} for b in head], want[:2])
    for processes in (2, 0):  # the state is the native loader's: either kind resumes it
        resumed = sluice.Loader(pipe(dataset, noise), processes=processes)
        resumed.load_state_dict(state)
        assert_same(epoch(resumed), want[2:])
        assert resumed.state_dict()["epoch"] == 1
        resumed.close()


def test_a_killed_worker_process_is_restarted_and_every_sample_comes_once(dataset: Path) -> None:
    want = epoch(sluice.Loader(pipe(dataset, noise), processes=0))
    loader = sluice.Loader(pipe(dataset, slow_noise), processes=2)
    workers = loader._workers
    assert isinstance(workers, MapWorkers)
    it = iter(loader)
    got = [next(it)]
    before = workers.pids()
    os.kill(before[1], signal.SIGKILL)
    got += list(it)
    assert workers.restarts >= 1
    assert workers.pids()[1] != before[1]
    keys = np.concatenate([np.asarray(b["key"]) for b in got]).tolist()
    assert sorted(keys) == list(range(N)), "every sample exactly once"
    assert_same([{k: np.asarray(v) for k, v in b.items()} for b in got], want)
    assert loader.stats()["process_restarts"] >= 1
    loader.close()


def test_a_lambda_or_closure_is_refused_naming_the_function(dataset: Path) -> None:
    with pytest.raises(sluice.SpecError, match=r"test_map:.*<lambda>.*importable"):
        pipe(dataset).map(lambda image, sample: image)

    def inner(image: np.ndarray, sample: Any) -> np.ndarray:
        return image

    with pytest.raises(sluice.SpecError, match=r"<locals>\.inner.*importable"):
        pipe(dataset).map(inner)
    spec = pipe(dataset).to_dict()
    spec["ops"].insert(2, {"op": "map", "fn": "test_map:<lambda>"})
    with pytest.raises(sluice.SpecError) as e:
        sluice.Loader(spec)
    assert e.value.field == "ops[2].fn"


def test_an_error_in_fn_names_the_sample_and_skip_leaves_it_out(dataset: Path) -> None:
    loader = sluice.Loader(pipe(dataset, fail_on_key_5), processes=2)
    with pytest.raises(sluice.SampleError) as e:
        epoch(loader)
    assert e.value.key == 5
    assert e.value.path and os.path.exists(e.value.path)
    assert "ValueError" in str(e.value) and "cannot augment sample 5" in str(e.value)
    assert "test_map:fail_on_key_5" in str(e.value)
    loader.close()

    skipping = sluice.Loader(pipe(dataset, fail_on_key_5).on_error("skip"), processes=2)
    keys = np.concatenate([b["key"] for b in epoch(skipping)]).tolist()
    assert sorted(keys) == [k for k in range(N) if k != 5]
    assert [s["key"] for s in skipping.stats()["skipped"]] == [5]
    skipping.close()


def test_stats_show_the_map_op_with_its_own_time(dataset: Path) -> None:
    loader = sluice.Loader(pipe(dataset, slow_noise), processes=2)
    epoch(loader)
    stats = loader.stats()
    assert stats["samples"] == N and stats["processes"] == 2
    # 10 ms of sleep per sample, counted once per sample whichever process ran it.
    assert stats["op_seconds"]["map"] >= 0.01 * N
    assert stats["op_seconds"]["map"] > stats["op_seconds"]["random_horizontal_flip"]
    assert stats["op_percentiles"]["map"]["p50_s"] >= 0.01
    loader.close()


KEPT: List[np.ndarray] = []


def invert_in_place_and_keep(image: np.ndarray, sample: Any) -> np.ndarray:
    """Edits sluice's buffer in place and keeps the array past the call."""
    np.subtract(255, image, out=image)
    KEPT.append(image)
    return image


def test_an_in_place_map_edits_the_view_and_a_kept_array_stays_valid(dataset: Path) -> None:
    plain = pipe(dataset).to_dict()
    plain["ops"] = plain["ops"][:2]
    want = np.concatenate([255 - b["image"] for b in epoch(sluice.Loader(sluice.Pipeline.from_dict(plain)))])
    KEPT.clear()
    loader = sluice.Loader(sluice.Pipeline.from_dict(plain).map(invert_in_place_and_keep), processes=0)
    got = np.concatenate([b["image"] for b in epoch(loader)])
    np.testing.assert_array_equal(got, want)
    # Each array the function kept still holds what it returned (its buffer was handed
    # over to it), though sluice went on with later samples in the same thread.
    assert len(KEPT) == N
    kept = {bytes(k.tobytes()) for k in KEPT}
    assert kept == {bytes(img.tobytes()) for img in got}


def batch_mark(batch: Dict[str, np.ndarray], info: Any) -> Dict[str, np.ndarray]:
    """Flips the images, doubles the labels and adds a float field."""
    return {
        "image": batch["image"][:, :, ::-1].copy(),
        "label": batch["label"] * 2,
        "key": batch["key"],
        "index": np.full(len(batch["key"]), info.index, np.int64),
        "mean": batch["image"].reshape(len(batch["key"]), -1).mean(axis=1).astype(np.float32),
    }


def batch_noise(batch: Dict[str, np.ndarray], info: Any) -> Dict[str, np.ndarray]:
    """Noise from the batch's generator, and a float32 image (4x the slot's bytes: it goes
    through the pipe rather than shared memory)."""
    image = batch["image"] ^ info.rng.integers(0, 256, size=batch["image"].shape, dtype=np.uint8)
    return {"image": image, "key": batch["key"], "big": image.astype(np.float32) / 255}


def batch_fail_on_key_5(batch: Dict[str, np.ndarray], info: Any) -> Dict[str, np.ndarray]:
    if 5 in batch["key"]:
        raise ValueError("no batch with sample 5")
    return batch


def test_map_batch_output_is_the_function_applied_to_each_batch(dataset: Path) -> None:
    plain = epoch(sluice.Loader(pipe(dataset), processes=0))
    want = [batch_mark(dict(b), _BatchInfo(i)) for i, b in enumerate(plain)]
    mapped = pipe(dataset).map_batch(batch_mark)
    assert mapped.to_dict()["map_batch"] == "test_map:batch_mark"
    for processes in (0, 2):
        loader = sluice.Loader(mapped, processes=processes)
        got = epoch(loader)
        assert_same(got, want)
        assert got[0]["mean"].dtype == np.float32
        loader.close()


class _BatchInfo:
    def __init__(self, index: int) -> None:
        self.index = index


def test_map_batch_is_the_same_for_any_process_count_and_resumes(dataset: Path) -> None:
    runs = {}
    for processes in (0, 1, 3):
        loader = sluice.Loader(pipe(dataset, noise).map_batch(batch_noise), processes=processes)
        runs[processes] = [epoch(loader), epoch(loader)]
        loader.close()
    first = runs[0]
    assert not np.array_equal(first[0][0]["image"], first[1][0]["image"]), "the draws depend on the epoch"
    assert not np.array_equal(first[0][0]["image"], first[0][1]["image"][: len(first[0][0]["image"])])
    for run in runs.values():
        for e in range(2):
            assert_same(run[e], first[e])
    loader = sluice.Loader(pipe(dataset, noise).map_batch(batch_noise), processes=2)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    loader.close()
    for processes in (2, 0):
        resumed = sluice.Loader(pipe(dataset, noise).map_batch(batch_noise), processes=processes)
        resumed.load_state_dict(state)
        assert_same(epoch(resumed), first[0][2:])
        resumed.close()


def test_a_map_batch_error_names_the_batch_and_its_keys(dataset: Path) -> None:
    for processes in (2, 0):
        loader = sluice.Loader(pipe(dataset).shuffle("none").map_batch(batch_fail_on_key_5), processes=processes)
        with pytest.raises(sluice.MapBatchError) as e:
            epoch(loader)
        assert (e.value.epoch, e.value.batch) == (0, 0)
        assert e.value.keys == list(range(8))
        assert "test_map:batch_fail_on_key_5" in str(e.value) and "ValueError: no batch with sample 5" in str(e.value)
        assert "batch 0 of epoch 0" in str(e.value)
        loader.close()


def test_a_map_batch_lambda_or_closure_is_refused(dataset: Path) -> None:
    with pytest.raises(sluice.SpecError, match=r"map_batch: test_map:.*<lambda>.*importable") as e:
        pipe(dataset).map_batch(lambda batch, info: batch)
    assert e.value.field == "map_batch"
    spec = pipe(dataset).to_dict()
    spec["map_batch"] = "test_map:outer.<locals>.inner"
    with pytest.raises(sluice.SpecError) as e:
        sluice.Loader(spec)
    assert e.value.field == "map_batch"
