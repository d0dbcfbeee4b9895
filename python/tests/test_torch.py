"""The torch adapter: SluiceDataset as an IterableDataset, and to_device."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sluice
from conftest import N_IMAGES, run_python, small_pipeline

torch = pytest.importorskip("torch")
from sluice.torch import SluiceDataset, to_device  # noqa: E402


def test_dataset_is_an_iterable_dataset_of_torch_batches(dataset: Path) -> None:
    ds = SluiceDataset(small_pipeline(dataset, batch=16))
    assert isinstance(ds, torch.utils.data.IterableDataset)
    assert len(ds) == 3
    batches = list(ds)
    assert all(isinstance(b.image, torch.Tensor) and b.image.dtype == torch.uint8 for b in batches)
    assert sorted(torch.cat([b.key for b in batches]).tolist()) == list(range(N_IMAGES))
    ds.set_epoch(0)
    assert torch.equal(next(iter(ds)).key, batches[0].key)
    assert ds.state_dict()["batch"] == 1 and ds.stats()["samples"] == N_IMAGES + 16


def test_dataset_works_inside_a_torch_dataloader(dataset: Path) -> None:
    ds = SluiceDataset(small_pipeline(dataset, batch=16))
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    got = list(dl)
    assert len(got) == 3
    assert got[0]["image"].shape == (16, 32, 32, 3) and got[0]["label"].dtype == torch.int64
    bad = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1)
    with pytest.raises(RuntimeError, match="num_workers=0"):
        list(bad)


def test_to_device_permutes_converts_and_normalises(dataset: Path) -> None:
    batch = next(iter(sluice.Loader(small_pipeline(dataset), output="torch")))
    out = to_device(batch, "cpu")
    assert out.image.shape == (8, 3, 32, 32) and out.image.dtype == torch.float32
    assert out.image.is_contiguous() and out.layout == "chw"
    mean = torch.tensor(sluice.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(sluice.IMAGENET_STD).view(1, 3, 1, 1)
    expected = (batch.image.permute(0, 3, 1, 2).float() / 255 - mean) / std
    torch.testing.assert_close(out.image, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.label, batch.label) and torch.equal(out.key, batch.key)
    assert (out.epoch, out.index) == (batch.epoch, batch.index)
    # The source batch is untouched (conversion happened on a copy).
    assert batch.image.dtype == torch.uint8

    cl = to_device(batch, "cpu", channels_last=True, dtype=torch.float64, mean=None, std=None)
    assert cl.image.is_contiguous(memory_format=torch.channels_last) and cl.image.dtype == torch.float64
    torch.testing.assert_close(cl.image, batch.image.permute(0, 3, 1, 2).double() / 255)


def test_to_device_takes_numpy_batches_and_float_chw_images(dataset: Path) -> None:
    np_batch = next(iter(sluice.Loader(small_pipeline(dataset))))
    out = to_device(np_batch, "cpu")
    assert isinstance(out.image, torch.Tensor) and out.image.shape == (8, 3, 32, 32)
    pipe = sluice.Pipeline.image_folder(dataset).decode().center_crop(16).normalize().layout("chw").batch(4)
    f = next(iter(sluice.Loader(pipe)))
    moved = to_device(f, "cpu")
    assert moved.image.shape == (4, 3, 16, 16)
    np.testing.assert_allclose(moved.image.numpy(), f.image)  # already normalised: only moved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_device_cuda(dataset: Path) -> None:
    batch = next(iter(sluice.Loader(small_pipeline(dataset), output="torch")))
    out = to_device(batch, "cuda", channels_last=True)
    assert out.image.is_cuda and out.label.is_cuda and not out.key.is_cuda
    assert out.image.is_contiguous(memory_format=torch.channels_last)
    ref = to_device(batch, "cpu")
    torch.testing.assert_close(out.image.cpu(), ref.image, rtol=1e-5, atol=1e-5)


def test_torch_distributed_rank_takes_precedence_over_env(dataset: Path) -> None:
    r = run_python(
        """
        import os, sys, socket
        import torch.distributed as dist
        import sluice
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        os.environ.update(RANK="1", WORLD_SIZE="3")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        pipe = sluice.Pipeline.image_folder(sys.argv[1]).decode().center_crop(8).batch(4)
        loader = sluice.Loader(pipe)
        print(loader.rank, loader.world_size)
        dist.destroy_process_group()
        """,
        str(dataset),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "1"]


def test_training_example_runs_end_to_end(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "train_torch.py"
    args = ["--data", str(tmp_path / "train"), "--images", "48", "--classes", "2", "--size", "32", "--batch", "16"]
    r = subprocess.run(
        [sys.executable, str(example), *args, "--epochs", "1"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "generated 48 images" in r.stdout
    assert "epoch 0: loss" in r.stdout and "images/s" in r.stdout
    assert "sluice: 48 samples" in r.stdout


def test_pinned_dataloader_batches_keep_working_with_to_device(dataset: Path) -> None:
    pipe = sluice.Pipeline.image_folder(dataset).decode().center_crop(16).layout("chw").batch(8)
    dl = torch.utils.data.DataLoader(SluiceDataset(pipe), batch_size=None, num_workers=0)
    batch = next(iter(dl))
    assert isinstance(batch, sluice.Batch) and batch.layout is None  # rebuilt by the DataLoader
    out = to_device(batch, "cpu", mean=None, std=None)
    assert out.image.shape == (8, 3, 16, 16)  # CHW recognised from the shape, not permuted again
    torch.testing.assert_close(out.image, batch["image"].float() / 255)
