"""Errors cross into Python as clear exceptions that carry their context."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import sluice
from conftest import small_pipeline


def test_missing_root_is_a_file_not_found_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(sluice.SourceNotFoundError) as info:
        sluice.Loader(small_pipeline(missing))
    err = info.value
    assert isinstance(err, FileNotFoundError) and isinstance(err, sluice.SourceError)
    assert isinstance(err, OSError) and isinstance(err, sluice.SluiceError)
    assert err.path == str(missing)
    assert str(missing) in str(err)


def test_empty_root_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(sluice.SourceError, match="no class folders") as info:
        sluice.Loader(small_pipeline(tmp_path))
    assert not isinstance(info.value, FileNotFoundError)
    assert info.value.path == str(tmp_path)


def test_bad_spec_field_raises_spec_error_from_the_loader(dataset: Path) -> None:
    spec = small_pipeline(dataset).to_dict()
    spec["ops"][1]["size"] = 0
    with pytest.raises(sluice.SpecError) as info:
        sluice.Loader(spec)
    assert info.value.field == "ops[1].size"
    spec["threadz"] = 3
    with pytest.raises(ValueError, match="threadz"):
        sluice.Loader(spec)


def test_corrupt_file_under_fail_policy_names_key_and_path(bad_dataset: dict) -> None:
    pipe = small_pipeline(bad_dataset["root"]).shuffle("none").batch(64)
    loader = sluice.Loader(pipe)
    with pytest.raises(sluice.SampleError) as info:
        for _ in loader:
            pass
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.path in bad_dataset["bad_files"] and err.key is not None
    assert loader.path_of(err.key) == err.path
    assert err.stage in ("read", "decode")
    assert err.path in str(err) and f"#{err.key}" in str(err)
    assert err.reason


def test_skip_policy_reports_every_skipped_key_and_path(bad_dataset: dict) -> None:
    loader = sluice.Loader(small_pipeline(bad_dataset["root"]).on_error("skip"))
    keys = [int(k) for b in loader for k in b.key]
    assert len(keys) == bad_dataset["good"]
    skipped = loader.stats()["skipped"]
    assert sorted(s["path"] for s in skipped) == sorted(bad_dataset["bad_files"])
    for s in skipped:
        assert loader.path_of(s["key"]) == s["path"]
        assert s["key"] not in keys
        assert os.path.basename(s["path"]).startswith("bad_") and s["error"]
    assert sorted(keys + [s["key"] for s in skipped]) == list(range(loader.num_samples))


def test_errors_pickle_with_their_attributes() -> None:
    import pickle

    err = sluice.SampleError("boom", key=3, path="/x.jpg", stage="decode", reason="corrupt")
    back = pickle.loads(pickle.dumps(err))
    assert (back.key, back.path, back.stage, str(back)) == (3, "/x.jpg", "decode", "boom")
    spec = pickle.loads(pickle.dumps(sluice.SpecError("bad", field="batch.size")))
    assert spec.field == "batch.size"
