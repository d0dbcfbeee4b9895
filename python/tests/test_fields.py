"""Metadata fields (docs/records.md, "Metadata fields"): a caption, a score, an id,
multi-label tags and JSON read from each sample's sidecar arrive in numpy batches (and as
torch tensors, text as lists of str) in their sample's row, in folders and tar shards; bad
values fail their sample by name; absurd specs are refused.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import sluice
from conftest import sluice_service
from sluice import _sluice

CLASSES = 3


def generated(tmp_path: Path, images: int = 12, classes: int = CLASSES) -> Path:
    root = tmp_path / "gen"
    _sluice.generate_dataset(str(root), images=images, classes=classes, texture=0, fields=True)
    # A JSON field too: each sidecar gets `meta`, an object naming its image.
    for side in root.glob("class_*/*.json"):
        data = json.loads(side.read_text())
        data["meta"] = {"i": data["id"], "flags": [True, None]}
        side.write_text(json.dumps(data))
    return root


def with_fields(pipe: sluice.Pipeline, classes: int = CLASSES) -> sluice.Pipeline:
    return (
        pipe.fields(id="int", caption="text", score="float", tags=("multi_label", classes), meta="json")
        .decode()
        .resize(16)
        .center_crop(16)
        .batch(5)
        .threads(2)
    )


def check(batches: List[Any], classes: int = CLASSES) -> List[int]:
    """Checks each row's fields against its label (the generator wrote image ``i`` of class
    ``c`` with id ``i``, caption ``"image i of class c"``, score ``i / 8`` and tags
    ``[c, c + 1]``); returns the ids in batch order."""
    ids: List[int] = []
    for b in batches:
        assert isinstance(b.caption, list) and all(isinstance(c, str) for c in b.caption)
        assert isinstance(b.meta, list)
        for row in range(len(b.caption)):
            i, c = int(b.id[row]), int(b.label[row])
            assert c == i % classes
            assert b.caption[row] == f"image {i} of class {c}"
            assert float(b.score[row]) == i / 8
            want = np.zeros(classes, np.float32)
            want[[c, (c + 1) % classes]] = 1.0
            np.testing.assert_array_equal(np.asarray(b.tags[row]), want)
            assert json.loads(b.meta[row]) == {"i": i, "flags": [True, None]}
            ids.append(i)
    return ids


def test_sidecar_fields_arrive_as_numpy_and_lists_in_their_rows(tmp_path: Path) -> None:
    root = generated(tmp_path)
    batches = list(sluice.Loader(with_fields(sluice.Pipeline.sidecar(root)).seed(3)))
    b = batches[0]
    assert b.id.dtype == np.int64 and b.id.shape == (5,)
    assert b.score.dtype == np.float32 and b.score.shape == (5,)
    assert b.tags.dtype == np.float32 and b.tags.shape == (5, CLASSES)
    ids = check(batches)
    assert sorted(ids) == list(range(12)) and ids != sorted(ids), "every sample once, shuffled"


def test_a_resumed_loader_gives_the_rest_with_their_fields(tmp_path: Path) -> None:
    root = generated(tmp_path)
    pipe = with_fields(sluice.Pipeline.sidecar(root)).seed(5)
    reference = check(list(sluice.Loader(pipe)))
    first = sluice.Loader(pipe)
    it = iter(first)
    head = check([next(it)])
    state = first.state_dict()
    resumed = sluice.Loader(pipe)
    resumed.load_state_dict(state)
    assert head + check(list(resumed)) == reference


def test_tar_sidecar_fields_follow_their_samples(tmp_path: Path) -> None:
    root = generated(tmp_path, images=8, classes=1)
    shard = tmp_path / "shard.tar"
    with tarfile.open(shard, "w") as tar:
        for image in sorted((root / "class_000").glob("*.jpg")):
            for suffix in (".jpg", ".json"):
                tar.add(image.with_suffix(suffix), arcname=f"class_000/{image.stem}{suffix}")
    batches = list(sluice.Loader(with_fields(sluice.Pipeline.tar(shard, sidecars=True), classes=1)))
    ids = check(batches, classes=1)
    keys = [int(k) for b in batches for k in b.key]
    assert ids == keys, "the shard's samples are in image order: key i has id i"


def test_torch_batches_have_tensors_for_numbers_and_lists_for_text(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from sluice.torch import to_device

    root = generated(tmp_path)
    b = next(iter(sluice.Loader(with_fields(sluice.Pipeline.sidecar(root)), output="torch")))
    assert b.id.dtype == torch.int64 and b.score.dtype == torch.float32 and b.tags.shape == (5, CLASSES)
    assert isinstance(b.caption, list) and isinstance(b.meta, list)
    check([b])
    out = to_device(b, "cpu")
    assert isinstance(out.tags, torch.Tensor) and out.tags.dtype == torch.float32
    assert torch.equal(out.id, b.id) and out.caption == b.caption and out.meta == b.meta


def invert(image: Any, sample: Any) -> Any:
    """A ``map`` op: the image inverted."""
    return 255 - image


def same_batch(batch: Dict[str, Any], info: Any) -> Dict[str, Any]:
    """A ``map_batch`` that gives the batch back as it came (text fields included)."""
    return batch


@pytest.mark.parametrize("processes", [0, 2])
def test_fields_pass_through_map_worker_processes(tmp_path: Path, processes: int) -> None:
    root = generated(tmp_path)
    pipe = with_fields(sluice.Pipeline.sidecar(root))
    fields = sluice.Pipeline.sidecar(root).fields(
        id="int", caption="text", score="float", tags=("multi_label", CLASSES), meta="json"
    )
    mapped = fields.decode().map(invert).resize(16).center_crop(16).batch(5).threads(2)
    ids = check(list(sluice.Loader(mapped, processes=processes)))
    assert sorted(ids) == list(range(12))
    ids = check(list(sluice.Loader(pipe.map_batch(same_batch), processes=processes)))
    assert sorted(ids) == list(range(12))


def test_a_bad_field_fails_its_sample_naming_it(tmp_path: Path) -> None:
    root = generated(tmp_path)
    side = root / "class_000" / "img_0000003.json"
    data = json.loads(side.read_text())
    data["score"] = "high"
    side.write_text(json.dumps(data))
    pipe = with_fields(sluice.Pipeline.sidecar(root))
    with pytest.raises(sluice.SampleError) as e:
        list(sluice.Loader(pipe))
    msg = str(e.value)
    assert "img_0000003" in msg and "field `score`: expected a number, found a string" in msg, msg
    loader = sluice.Loader(pipe.on_error("skip"))
    assert sorted(check(list(loader))) == [i for i in range(12) if i != 3]
    (skipped,) = loader.stats()["skipped"]
    assert "img_0000003.jpg" in skipped["path"] and "`score`" in skipped["error"]


def test_absurd_field_specs_are_refused(tmp_path: Path) -> None:
    root = generated(tmp_path, images=2)
    base = sluice.Pipeline.sidecar(root).decode().center_crop(8).batch(1)
    for pipe, says in [
        (base.fields(tags=("multi_label", 0)), "fields[0].classes"),
        (base.fields(tags=("multi_label", 10**9)), "fields[0].classes"),
        (base.fields(boxes="json"), "fields[0].name"),
        (base.fields(score="complex"), "fields"),
    ]:
        with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
            sluice.Loader(pipe)
    with pytest.raises(ValueError, match="sidecars"):
        sluice.Loader(sluice.Pipeline.image_folder(root).fields(score="float").decode().center_crop(8).batch(1))


def test_a_remote_loader_yields_the_fields_a_local_one_does(tmp_path: Path) -> None:
    root = generated(tmp_path)
    pipe = with_fields(sluice.Pipeline.sidecar(root)).seed(2)
    local = check(list(sluice.Loader(pipe)))
    with sluice_service([root], tmp_path / "journal", workers=2) as addr:
        remote = sluice.RemoteLoader(pipe, dispatcher=addr, job="fields")
        batches = list(remote)
    assert sorted(check(batches)) == sorted(local) == list(range(12))
    assert isinstance(batches[0].caption, list) and batches[0].tags.shape[1] == CLASSES
