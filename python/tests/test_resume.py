"""Exact resumption: stop mid-epoch, save state_dict(), load it in a NEW process, and the
remaining batches (keys and pixels) are those an uninterrupted run produces."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import List

import pytest

import sluice
from conftest import run_python

# Runs `epochs` epochs of a fixed pipeline and records every batch's keys and a pixel
# checksum. With --stop-after K it quits after K batches of the first epoch it runs and
# writes state_dict() to --state-out; with --state-in it resumes from that file first.
SCRIPT = """
import argparse, json, hashlib, sys
import sluice

ap = argparse.ArgumentParser()
ap.add_argument("--data"); ap.add_argument("--out")
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--stop-after", type=int, default=-1)
ap.add_argument("--state-out"); ap.add_argument("--state-in")
a = ap.parse_args()

pipe = (sluice.Pipeline.image_folder(a.data).decode().random_resized_crop(24)
        .random_horizontal_flip().batch(7).seed(11).threads(2))
loader = sluice.Loader(pipe)
if a.state_in:
    with open(a.state_in) as f:
        loader.load_state_dict(json.load(f))
seen = []
for e in range(a.epochs):
    for i, b in enumerate(loader):
        seen.append({"epoch": b.epoch, "index": b.index, "keys": b.key.tolist(),
                     "sha": hashlib.sha1(b.image.tobytes()).hexdigest()})
        if len(seen) == a.stop_after:
            with open(a.state_out, "w") as f:
                json.dump(loader.state_dict(), f)
            with open(a.out, "w") as f:
                json.dump(seen, f)
            sys.exit(0)
with open(a.out, "w") as f:
    json.dump(seen, f)
"""


def run(*args: str) -> None:
    r = run_python(SCRIPT, *args)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("stop_after", [3, 8])  # mid first epoch; mid second epoch
def test_resume_in_a_new_process_matches_an_uninterrupted_run(dataset: Path, tmp_path: Path, stop_after: int) -> None:
    full, head, tail, state = (tmp_path / n for n in ("full.json", "head.json", "tail.json", "state.json"))
    run("--data", str(dataset), "--out", str(full), "--epochs", "2")
    run(
        "--data",
        str(dataset),
        "--out",
        str(head),
        "--epochs",
        "2",
        "--stop-after",
        str(stop_after),
        "--state-out",
        str(state),
    )
    saved = json.loads(state.read_text())
    per_epoch = 7  # 48 samples in batches of 7
    assert (saved["epoch"], saved["batch"]) == divmod(stop_after, per_epoch)
    # The resumed process finishes the interrupted epoch and runs one more.
    run("--data", str(dataset), "--out", str(tail), "--epochs", "2", "--state-in", str(state))

    uninterrupted = json.loads(full.read_text())
    before, after = json.loads(head.read_text()), json.loads(tail.read_text())
    assert len(uninterrupted) == 2 * per_epoch
    assert before == uninterrupted[:stop_after]
    assert after[0]["index"] == saved["batch"] and after[0]["epoch"] == saved["epoch"]
    # Remaining key sequence (and pixels) equal the uninterrupted run's.
    assert after[: len(uninterrupted) - stop_after] == uninterrupted[stop_after:]


def test_state_of_another_loader_is_refused(dataset: Path) -> None:
    pipe = sluice.Pipeline.image_folder(dataset).decode().center_crop(16).batch(8)
    state = sluice.Loader(pipe.seed(1)).state_dict()
    other = sluice.Loader(pipe.seed(2))
    with pytest.raises(sluice.StateError, match="seed") as info:
        other.load_state_dict(state)
    assert isinstance(info.value, ValueError)
    # Another world size resumes only with the same global batch (8 = 1 × 8, not 2 × 8).
    with pytest.raises(sluice.StateError, match="same global batch"):
        sluice.Loader(pipe.seed(1), rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(sluice.StateError, match="rank/world_size"):
        sluice.Loader(pipe.seed(1), rank=1, world_size=2).load_state_dict(
            sluice.Loader(pipe.seed(1), rank=0, world_size=2).state_dict()
        )
    with pytest.raises(sluice.StateError, match="not a sluice loader state"):
        other.load_state_dict({"epoch": 1})
    with pytest.raises(sluice.StateError, match="past the end"):
        sluice.Loader(pipe.seed(1)).load_state_dict({**state, "batch": 99})
    with pytest.raises(TypeError):
        other.load_state_dict("epoch 1")  # type: ignore[arg-type]


def test_state_dict_round_trips_in_process(dataset: Path) -> None:
    pipe = sluice.Pipeline.image_folder(dataset).decode().center_crop(16).batch(8).seed(5)
    a = sluice.Loader(pipe)
    it = iter(a)
    next(it)
    state = a.state_dict()
    rest = [b.key.tolist() for b in it]
    b = sluice.Loader(pipe)
    b.load_state_dict(state)
    assert [x.key.tolist() for x in b] == rest
    assert b.epoch == 1


def _elastic_pipeline(data: Path, batch: int) -> sluice.Pipeline:
    return sluice.Pipeline.image_folder(data).decode().random_resized_crop(16).batch(batch).seed(5).threads(1)


def _global_batches(loaders: List[sluice.Loader], limit: int = -1) -> List[List[int]]:
    """Each step's global batch: the sorted keys of every rank's batch of that step."""
    per_rank = [
        [b.key.tolist() for b in itertools.islice(iter(loader), None if limit < 0 else limit)] for loader in loaders
    ]
    assert len({len(r) for r in per_rank}) == 1, "ranks handed out different numbers of batches"
    return [sorted(k for r in per_rank for k in r[g]) for g in range(len(per_rank[0]))]


def test_a_two_rank_checkpoint_resumes_on_three_ranks_with_the_same_global_batches(dataset: Path) -> None:
    # 48 samples, global batch 6: 2 ranks of 3, then 3 ranks of 2.
    uninterrupted = _global_batches(
        [sluice.Loader(_elastic_pipeline(dataset, 3), rank=r, world_size=2) for r in range(2)]
    )
    assert len(uninterrupted) == 8

    two = [sluice.Loader(_elastic_pipeline(dataset, 3), rank=r, world_size=2) for r in range(2)]
    before = _global_batches(two, limit=3)
    states = [json.loads(json.dumps(loader.state_dict())) for loader in two]
    assert [(s["epoch"], s["batch"], s["world_size"]) for s in states] == [(0, 3, 2)] * 2

    three = [sluice.Loader(_elastic_pipeline(dataset, 2), rank=r, world_size=3) for r in range(3)]
    for rank, loader in enumerate(three):
        loader.load_state_dict(states[rank % 2])
    after = _global_batches(three)

    assert before + after == uninterrupted
    delivered = [k for batch in before + after for k in batch]
    assert sorted(delivered) == list(range(48)), "every sample exactly once"


def test_a_resume_that_cannot_keep_the_global_batch_names_the_rule(dataset: Path) -> None:
    state = sluice.Loader(_elastic_pipeline(dataset, 3), rank=0, world_size=2).state_dict()
    with pytest.raises(sluice.StateError, match="does not split into 4 equal shares"):
        sluice.Loader(_elastic_pipeline(dataset, 2), rank=0, world_size=4).load_state_dict(state)
    with pytest.raises(sluice.StateError, match="set batch.size = 2"):
        sluice.Loader(_elastic_pipeline(dataset, 3), rank=2, world_size=3).load_state_dict(state)
