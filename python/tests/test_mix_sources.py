"""Mixed sources (``Pipeline.mix``, ``kind = "mix"``): every batch holds the sources in
their weights' proportions, deterministically; a state_dict resumes exactly, and a spec
with other weights takes them from the next epoch. The service serves the same batches."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import sluice
from conftest import sluice_binary, sluice_service


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Path]:
    base = tmp_path_factory.mktemp("mix")
    a, b = base / "a", base / "b"
    sluice.generate_dataset(a, images=24, classes=2, seed=1)
    sluice.generate_dataset(b, images=16, classes=2, seed=2)
    return a, b


def _pipeline(a: Path, b: Path, weights: List[float]) -> sluice.Pipeline:
    mixed = sluice.Pipeline.mix([sluice.Pipeline.image_folder(a), sluice.Pipeline.image_folder(b)], weights=weights)
    return mixed.decode().center_crop(8).batch(8).seed(2).threads(1)


def _counts(batches: List[List[int]]) -> List[Tuple[int, int]]:
    # The joined manifest keeps the sources in order: keys 0..23 are a's, 24..39 b's.
    return [(sum(k < 24 for k in keys), sum(k >= 24 for k in keys)) for keys in batches]


def _epoch(loader: sluice.Loader) -> List[List[int]]:
    return [b.key.tolist() for b in loader]


def test_batches_hold_the_sources_in_proportion_and_resume_exactly(two_sources: Tuple[Path, Path]) -> None:
    a, b = two_sources
    loader = sluice.Loader(_pipeline(a, b, [3, 1]))
    # 6 of a and 2 of b per batch: a (24) runs out after 4 batches.
    assert len(loader) == 4
    reference = _epoch(loader)
    assert _counts(reference) == [(6, 2)] * 4
    assert len({k for keys in reference for k in keys}) == 32
    assert _epoch(sluice.Loader(_pipeline(a, b, [3, 1]))) == reference

    first = sluice.Loader(_pipeline(a, b, [3, 1]))
    it = iter(first)
    head = [next(it).key.tolist()]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = sluice.Loader(_pipeline(a, b, [3, 1]))
    resumed.load_state_dict(state)
    assert head + _epoch(resumed) == reference

    # Other weights: the checkpoint's epoch ends as it began, the next one is 4 + 4.
    reweighted = sluice.Loader(_pipeline(a, b, [1, 1]))
    reweighted.load_state_dict(state)
    assert _epoch(reweighted) == reference[1:]
    assert _counts(_epoch(reweighted)) == [(4, 4)] * 4


def test_mix_refuses_what_it_cannot_mix(two_sources: Tuple[Path, Path]) -> None:
    a, b = two_sources
    with pytest.raises(ValueError, match="one weight per source"):
        sluice.Pipeline.mix([sluice.Pipeline.image_folder(a)], weights=[1, 2])
    with pytest.raises(ValueError, match="no ops"):
        sluice.Pipeline.mix([sluice.Pipeline.image_folder(a).decode()], weights=[1])
    with pytest.raises(sluice.SpecError, match="weight") as info:
        sluice.Loader(_pipeline(a, b, [1, -1]))
    assert info.value.field == "source.sources[1].weight"


def test_the_cli_runs_a_mixed_spec(two_sources: Tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_sources
    spec = tmp_path / "mix.toml"
    _pipeline(a, b, [3, 1]).save(spec)
    assert 'kind = "mix"' in spec.read_text()
    out = subprocess.run(
        [str(sluice_binary()), "run", str(spec), "--json"], capture_output=True, text=True, timeout=120, check=True
    )
    stats = json.loads(out.stdout)
    assert (stats["batches"], stats["samples"]) == (4, 32)


def test_the_service_serves_a_mix_batch_by_batch_as_the_local_loader_and_resumes(
    two_sources: Tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two_sources
    reference = _epoch(sluice.Loader(_pipeline(a, b, [3, 1])))

    def by_index(batches: List[Any]) -> Dict[int, List[int]]:
        return {int(batch.index): batch.key.tolist() for batch in batches}

    with sluice_service([a.parent], tmp_path / "journal", workers=2) as addr:
        first = sluice.RemoteLoader(_pipeline(a, b, [3, 1]), dispatcher=addr, job="mixed")
        assert len(first) == 4
        it = iter(first)
        head = [next(it)]
        state = json.loads(json.dumps(first.state_dict()))
        del it, first
        resumed = sluice.RemoteLoader(_pipeline(a, b, [3, 1]), dispatcher=addr, job="mixed")
        resumed.load_state_dict(state)
        got = by_index(head)
        rest = by_index(list(resumed))
        assert not set(got) & set(rest), "a batch was delivered twice"
        got.update(rest)
    # Batch i holds the local loader's batch i: 6 of a and 2 of b, each sample once.
    assert got == dict(enumerate(reference))
