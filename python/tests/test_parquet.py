"""Parquet sources through ``sluice.Pipeline.parquet``: a dataset written by Hugging Face
``datasets`` (the Hub's layout: ``image`` a struct ``{bytes, path}``, ``label`` an int64)
gives exactly the batches of the same JPEGs as an image folder, shuffled alike, resumes
exactly, and bad files fail with errors naming them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import List, Tuple

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sluice
from conftest import sluice_binary, sluice_service


def _images(root: Path) -> List[Tuple[Path, int]]:
    """The image folder's samples in its manifest order: classes by name, files by name."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [(p, classes.index(c)) for c in classes for p in sorted((root / c).glob("*.jpg"))]


@pytest.fixture(scope="module")
def hf_parquet(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared 48-JPEG dataset written by ``datasets`` in row groups of 10 rows."""
    rows = _images(dataset)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": p.read_bytes(), "path": p.name} for p, _ in rows],
            "label": [label for _, label in rows],
        },
        features=features,
    )
    out = tmp_path_factory.mktemp("hf") / "train-00000-of-00001.parquet"
    ds.to_parquet(str(out), batch_size=10)
    meta = pq.ParquetFile(out).metadata
    assert meta.num_row_groups == 5 and meta.num_rows == 48
    assert pq.read_schema(out).field("image").type == pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return out


def _pipe(source: sluice.Pipeline) -> sluice.Pipeline:
    return source.decode().random_resized_crop(24).random_horizontal_flip().batch(7).seed(3).threads(2)


def _epoch(loader: sluice.Loader) -> List[Tuple[List[int], List[int], bytes]]:
    return [(b.key.tolist(), b.label.tolist(), np.asarray(b.image).tobytes()) for b in loader]


def test_a_datasets_parquet_file_gives_the_image_folders_batches(dataset: Path, hf_parquet: Path) -> None:
    parquet = sluice.Loader(_pipe(sluice.Pipeline.parquet(hf_parquet)))
    folder = sluice.Loader(_pipe(sluice.Pipeline.image_folder(dataset)))
    for epoch in range(2):
        got, want = _epoch(parquet), _epoch(folder)
        assert got == want, f"epoch {epoch}"
        keys = [k for b in got for k in b[0]]
        assert sorted(keys) == list(range(48)) and keys != list(range(48))


def test_a_parquet_loader_resumes_exactly_from_its_state(hf_parquet: Path) -> None:
    pipe = _pipe(sluice.Pipeline.parquet(hf_parquet, label_column="label"))
    a = sluice.Loader(pipe)
    it = iter(a)
    first = [next(it), next(it)]
    state = a.state_dict()
    rest = [(b.key.tolist(), np.asarray(b.image).tobytes()) for b in it]
    b = sluice.Loader(pipe)
    b.load_state_dict(state)
    assert [(x.key.tolist(), np.asarray(x.image).tobytes()) for x in b] == rest
    assert len(first) + len(rest) == 7


@pytest.mark.parametrize("page_index", [True, False])
def test_a_small_window_reads_pages_and_gives_the_same_batches(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page_index: bool
) -> None:
    """A window smaller than the data (here 0 MiB) reads single pages (2 rows each), located
    by the offset index or by their headers, and gives the image folder's batches and the
    large window's, resuming alike."""
    rows = _images(dataset)
    table = pa.table(
        {
            "image": [{"bytes": p.read_bytes(), "path": p.name} for p, _ in rows],
            "label": pa.array([label for _, label in rows], pa.int64()),
        }
    )
    paged = tmp_path / "paged.parquet"
    pq.write_table(
        table,
        paged,
        row_group_size=10,
        use_dictionary=False,
        data_page_size=1,
        write_batch_size=2,
        write_page_index=page_index,
    )
    assert pq.ParquetFile(paged).metadata.row_group(0).column(0).has_offset_index == page_index
    large = sluice.Loader(_pipe(sluice.Pipeline.parquet(paged)))
    monkeypatch.setenv("SLUICE_PARQUET_CACHE_MB", "0")
    small = sluice.Loader(_pipe(sluice.Pipeline.parquet(paged)))
    folder = sluice.Loader(_pipe(sluice.Pipeline.image_folder(dataset)))
    for epoch in range(2):
        want = _epoch(folder)
        assert _epoch(small) == want, f"epoch {epoch}: small window"
        assert _epoch(large) == want, f"epoch {epoch}: large window"
    it = iter(small)
    next(it), next(it)
    state = small.state_dict()
    rest = [(b.key.tolist(), np.asarray(b.image).tobytes()) for b in it]
    resumed = sluice.Loader(_pipe(sluice.Pipeline.parquet(paged)))
    resumed.load_state_dict(state)
    assert [(b.key.tolist(), np.asarray(b.image).tobytes()) for b in resumed] == rest


def test_pyarrow_binary_column_and_bad_files(dataset: Path, tmp_path: Path) -> None:
    rows = _images(dataset)[:12]
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"jpeg": [p.read_bytes() for p, _ in rows]}), plain, row_group_size=5)
    loader = sluice.Loader(sluice.Pipeline.parquet(plain, image_column="jpeg").decode().center_crop(16).batch(4))
    batches = list(loader)
    assert sum(len(b.key) for b in batches) == 12
    assert all((b.label == -1).all() for b in batches)

    with pytest.raises(Exception, match=r"plain\.parquet: no column `image` \(the file has: jpeg\)"):
        sluice.Loader(sluice.Pipeline.parquet(plain).decode().center_crop(16).batch(4))
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(plain.read_bytes()[:-20])
    with pytest.raises(Exception, match=r"truncated\.parquet: (not a Parquet file|corrupt footer)"):
        sluice.Loader(sluice.Pipeline.parquet(truncated, image_column="jpeg").decode().center_crop(16).batch(4))


def test_the_cli_runs_a_parquet_spec(hf_parquet: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f"""
[source]
kind = "parquet"
path = "{hf_parquet}"
label_column = "label"

[[ops]]
op = "decode"

[[ops]]
op = "center_crop"
size = 16

[batch]
size = 8
"""
    )
    out = subprocess.run(
        [str(sluice_binary()), "run", str(spec), "--epochs", "2", "--json"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["samples"] == 96


def test_the_service_serves_a_parquet_dataset_exactly_once(hf_parquet: Path, tmp_path: Path) -> None:
    with sluice_service([hf_parquet.parent], tmp_path / "journal") as addr:
        pipe = sluice.Pipeline.parquet(hf_parquet).decode().center_crop(16).batch(8).seed(2)
        remote = sluice.RemoteLoader(pipe, dispatcher=addr, job="parquet")
        got = {int(k): int(label) for b in remote for k, label in zip(b.key, b.label)}
        assert sorted(got) == list(range(48))
        local = {int(k): int(label) for b in sluice.Loader(pipe) for k, label in zip(b.key, b.label)}
        assert got == local
