"""sluice.pack: a losslessly rewritten dataset loads to exactly the same batches; bad
files are copied and listed; errors are the usual sluice exceptions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sluice


def _epoch(root: Path) -> list:
    pipe = (
        sluice.Pipeline.image_folder(root)
        .decode()
        .random_resized_crop(64)
        .random_horizontal_flip()
        .batch(4)
        .seed(5)
        .on_error("skip")
    )
    loader = sluice.Loader(pipe)
    return [(b.key.copy(), b.image.copy()) for b in loader]


def test_packed_dataset_gives_the_same_batches(tmp_path: Path) -> None:
    src = tmp_path / "train"
    sluice.generate_dataset(src, images=10, classes=2, corrupt=2)
    out = sluice.pack(src, tmp_path / "packed")
    assert out["packed"] == 10
    assert out["bytes_out"] > 0
    reasons = dict(out["not_packed"])
    assert len(reasons) == 2 and all("bad_" in p for p in reasons)  # the bad .jpg files, copied as they are
    a, b = _epoch(src), _epoch(tmp_path / "packed")
    assert len(a) == len(b) == 3  # 10 good images in batches of 4
    for (ka, ia), (kb, ib) in zip(a, b):
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(ia, ib)


def test_pack_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(sluice.SourceNotFoundError) as e:
        sluice.pack(tmp_path / "missing", tmp_path / "out")
    assert "missing" in str(e.value)
    src = tmp_path / "train"
    sluice.generate_dataset(src, images=2, classes=1)
    with pytest.raises(sluice.SourceError, match="lies inside"):
        sluice.pack(src, src / "packed")
    with pytest.raises(ValueError):
        sluice.pack(src, tmp_path / "out", interval=0)
