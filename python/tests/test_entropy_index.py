"""The entropy index: crops cut with it give exactly the batches of the ordinary decode,
it is counted in stats(), kept in a folder that several processes share at once, and
made ahead by `sluice index`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

import sluice
from conftest import sluice_binary


def _pipeline(root: Path, index: bool, index_dir: Optional[Path] = None) -> sluice.Pipeline:
    return (
        sluice.Pipeline.image_folder(root)
        .decode()
        .random_resized_crop(48)
        .random_horizontal_flip()
        .batch(6)
        .seed(3)
        .threads(2)
        .entropy_index(index, dir=index_dir)
    )


def _epochs(loader: sluice.Loader, epochs: int) -> List[Tuple[np.ndarray, np.ndarray]]:
    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        out.extend((b.key.copy(), b.image.copy()) for b in loader)
    return out


def test_indexed_crops_are_the_ordinary_crops_and_are_counted(dataset: Path) -> None:
    indexed = sluice.Loader(_pipeline(dataset, True))
    plain = sluice.Loader(_pipeline(dataset, False))
    got, want = _epochs(indexed, 3), _epochs(plain, 3)
    assert len(got) == len(want) > 0
    for (ka, ia), (kb, ib) in zip(got, want):
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(ia, ib)
    stats = indexed.stats()["entropy_index"]
    assert stats["indexed"] == 48 and stats["unservable"] == 0 and stats["over_budget"] == 0
    assert stats["cut"] > 48, stats  # later epochs cut most crops
    assert "entropy_index" not in plain.stats()


_RUN = """
import json, sys
import sluice
pipe = (sluice.Pipeline.image_folder(sys.argv[1]).decode().random_resized_crop(48)
        .batch(6).seed(int(sys.argv[3])).threads(2).entropy_index(True, dir=sys.argv[2]))
loader = sluice.Loader(pipe)
n = sum(len(b.key) for b in loader)
print(json.dumps({"samples": n, **loader.stats()["entropy_index"]}))
"""


def _start(dataset: Path, index_dir: Path, seed: int) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_RUN), str(dataset), str(index_dir), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(p: "subprocess.Popen[str]") -> dict:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_processes_share_an_index_folder_at_once(dataset: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "indexes"
    # Two processes index the same files into one folder at the same time.
    first = [_result(p) for p in [_start(dataset, index_dir, 1), _start(dataset, index_dir, 2)]]
    assert all(r["samples"] == 48 for r in first)
    assert all(r["indexed"] == 48 and r["rejected"] == 0 for r in first), first
    stored = sorted(index_dir.glob("*.slix"))
    assert len(stored) == 48 and not list(index_dir.glob(".*.tmp"))
    # A third run reads every index instead of making it.
    third = _result(_start(dataset, index_dir, 3))
    assert third["loaded"] == 48 and third["rejected"] == 0, third
    # A damaged index is refused, made again and written over; the run is unaffected.
    damaged = stored[0].read_bytes()
    stored[0].write_bytes(damaged[: len(damaged) // 2])
    fourth = _result(_start(dataset, index_dir, 4))
    assert fourth["rejected"] == 1 and fourth["loaded"] == 47 and fourth["samples"] == 48, fourth
    assert stored[0].read_bytes() == damaged


def test_sluice_index_makes_the_indexes_ahead(dataset: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "ahead"
    cmd = [str(sluice_binary()), "index", str(dataset), str(index_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "indexed 48 JPEGs (0 already indexed)" in out.stdout, out.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert "indexed 0 JPEGs (48 already indexed)" in again.stdout, again.stdout
    run = _result(_start(dataset, index_dir, 5))
    assert run["loaded"] == 48 and run["indexed"] == 48, run
    bad = subprocess.run(
        [str(sluice_binary()), "index", str(tmp_path / "missing"), str(index_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "missing" in bad.stderr
