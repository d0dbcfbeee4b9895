"""Several learners with locality-aware assignment: every step's global batch is the
plain split's, and each learner's cache holds only the samples placed on it."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

import sluice
from conftest import N_IMAGES, small_pipeline


def steps(loader: sluice.Loader) -> List[List[int]]:
    return [[int(k) for k in b.key] for b in loader]


@pytest.mark.parametrize("p", [2, 3])
def test_locality_keeps_every_steps_samples(dataset: Path, p: int) -> None:
    pipe = small_pipeline(dataset, batch=4).cache("64MiB", level="decoded", policy="lru")
    aware = [sluice.Loader(pipe, rank=r, world_size=p, locality={"cache_samples": [N_IMAGES // p]}) for r in range(p)]
    plain = [
        sluice.Loader(
            pipe, rank=r, world_size=p, locality={"cache_samples": [N_IMAGES // p], "assignment": "partitioned"}
        )
        for r in range(p)
    ]
    for _epoch in range(2):
        a = [steps(x) for x in aware]
        b = [steps(x) for x in plain]
        for step in range(len(a[0])):
            assert sorted(k for r in a for k in r[step]) == sorted(k for r in b for k in r[step])
            assert len({len(r[step]) for r in a}) == 1


def test_a_bad_locality_section_names_its_field(dataset: Path) -> None:
    pipe = small_pipeline(dataset).cache("64MiB", level="decoded", policy="lru")
    with pytest.raises(sluice.SpecError) as e:
        sluice.Loader(pipe, rank=0, world_size=3, locality={"cache_samples": [1, 2]})
    assert "locality.cache_samples" in str(e.value)
