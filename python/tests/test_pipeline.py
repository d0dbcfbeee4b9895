"""The pipeline builder: chaining, immutability, round trips through dict/JSON/TOML and
files, and errors that name the offending field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict

import pytest

import sluice
from sluice import Pipeline, SpecError


def standard(root: str = "/data/train") -> Pipeline:
    return Pipeline.image_folder(root).decode().random_resized_crop(224).random_horizontal_flip().batch(256)


def test_chain_builds_the_spec_and_fills_defaults() -> None:
    d = standard().to_dict()
    assert d["source"] == {"kind": "image_folder", "root": "/data/train"}
    assert [op["op"] for op in d["ops"]] == ["decode", "random_resized_crop", "random_horizontal_flip"]
    assert d["ops"][1]["size"] == 224
    assert d["ops"][1]["scale"] == [0.08, 1.0]
    assert d["ops"][2]["p"] == 0.5
    assert d["batch"] == {"size": 256, "drop_last": False}
    # Defaults come from Rust.
    assert d["shuffle"] == {"kind": "global"}
    assert d["storage"] == {"kind": "local"}
    assert d["prefetch"] == 4 and d["threads"] == 0 and d["seed"] == 0 and d["on_error"] == "fail"


def test_builder_is_immutable() -> None:
    base = Pipeline.image_folder("/d").decode()
    a = base.center_crop(64).batch(8)
    b = base.random_resized_crop(32).batch(4)
    assert len(base.ops) == 1
    assert a.ops[1] == {"op": "center_crop", "size": 64}
    assert b.ops[1]["op"] == "random_resized_crop"
    assert a != b and base.ops == (dict(op="decode"),)


def test_every_option_round_trips(tmp_path: Path) -> None:
    pipe = (
        Pipeline.file_list(tmp_path / "list.txt", root=tmp_path)
        .decode()
        .resize(256)
        .center_crop((224, 200))
        .random_horizontal_flip(0.25)
        .normalize()
        .layout("chw")
        .shuffle("buffer", size=100)
        .batch(32, drop_last=True)
        .prefetch(2)
        .threads(3)
        .seed(7)
        .on_error("skip")
        .throttled(latency_ms=5, bandwidth_mb_s=100)
        .limits(max_pixels=10_000_000)
    )
    d = pipe.to_dict()
    assert d["source"] == {"kind": "file_list", "path": str(tmp_path / "list.txt"), "root": str(tmp_path)}
    assert d["ops"][2] == {"op": "center_crop", "size": [224, 200]}
    assert d["ops"][4]["op"] == "normalize" and d["ops"][4]["mean"] == pytest.approx(list(sluice.IMAGENET_MEAN))
    assert d["shuffle"] == {"kind": "buffer", "size": 100}
    assert d["storage"] == {"kind": "throttled", "latency_ms": 5.0, "bandwidth_mb_s": 100.0}
    assert d["limits"]["max_pixels"] == 10_000_000
    assert (d["seed"], d["threads"], d["prefetch"], d["on_error"]) == (7, 3, 2, "skip")

    assert Pipeline.from_dict(d).to_dict() == d
    assert Pipeline.from_json(pipe.to_json()).to_dict() == d
    assert Pipeline.from_toml(pipe.to_toml()).to_dict() == d
    for name in ("spec.toml", "spec.json"):
        pipe.save(tmp_path / name)
        assert Pipeline.load(tmp_path / name).to_dict() == d
    assert "[[ops]]" in (tmp_path / "spec.toml").read_text()
    assert json.loads((tmp_path / "spec.json").read_text()) == d


def test_cache_sampling_and_importance_options_round_trip() -> None:
    pipe = (
        standard()
        .cache("512MB", level="resized", resize=256, policy="lru")
        .sampling("importance", floor=0.1, coverage_epochs=5)
        .importance(ema=0.5)
    )
    d = pipe.to_dict()
    assert d["cache"]["level"] == "resized" and d["cache"]["resize"] == 256 and d["cache"]["policy"] == "lru"
    assert d["cache"]["budget"] == 512_000_000
    assert d["sampling"]["kind"] == "importance" and d["sampling"]["floor"] == 0.1
    assert d["sampling"]["coverage_epochs"] == 5 and "miss_discount" in d["sampling"]
    assert d["importance"] == {"ema": 0.5}
    assert Pipeline.from_toml(pipe.to_toml()).to_dict() == d
    assert "cache" not in pipe.cache(None).to_dict()
    assert standard().to_dict()["sampling"] == {"kind": "uniform"}
    for bad, field in (
        (standard().cache("0%"), "cache.budget"),
        (standard().cache("1GB", level="resized"), "cache.level"),
        (standard().sampling("importance", floor=0), "sampling.floor"),
        (standard().importance(ema=2), "importance.ema"),
    ):
        with pytest.raises(SpecError) as info:
            bad.to_json()
        assert info.value.field == field, str(info.value)


def test_cache_disk_tier_round_trips_and_refuses_a_fraction(tmp_path: Path) -> None:
    pipe = standard().cache("512MB", disk={"dir": tmp_path / "tier", "budget": "2GiB", "policy": "lru"})
    d = pipe.to_dict()
    assert d["cache"]["disk"] == {"dir": str(tmp_path / "tier"), "budget": 2 << 30, "policy": "lru"}
    assert Pipeline.from_toml(pipe.to_toml()).to_dict() == d
    assert (
        standard().cache("1GB", disk={"dir": "/t", "budget": 1 << 30}).to_dict()["cache"]["disk"]["policy"] == "belady"
    )
    for disk, field in (
        ({"dir": "/t", "budget": "25%"}, "cache.disk.budget"),
        ({"dir": "", "budget": 1 << 30}, "cache.disk.dir"),
    ):
        with pytest.raises(SpecError) as info:
            standard().cache("1GB", disk=disk).to_json()
        assert info.value.field == field, str(info.value)


def test_tar_source_and_shuffle_shortcuts() -> None:
    d = Pipeline.tar(["/s/a.tar", "/s/b.tar"]).decode().center_crop(8).shuffle(False).batch(2).to_dict()
    assert d["source"] == {"kind": "tar", "shards": ["/s/a.tar", "/s/b.tar"]}
    assert d["shuffle"] == {"kind": "none"}
    assert Pipeline.tar("/s/one.tar").decode().center_crop(8).batch(1).to_dict()["source"]["shards"] == ["/s/one.tar"]


def test_relative_roots_become_absolute_and_spec_files_resolve_against_their_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert Pipeline.image_folder("train").decode().center_crop(8).batch(1).to_dict()["source"]["root"] == str(
        tmp_path / "train"
    )
    spec = tmp_path / "conf" / "spec.toml"
    spec.parent.mkdir()
    spec.write_text(
        '[source]\nkind = "image_folder"\nroot = "imgs"\n\n[[ops]]\nop = "decode"\n\n'
        '[[ops]]\nop = "center_crop"\nsize = 16\n\n[batch]\nsize = 4\n'
    )
    assert Pipeline.load(spec).to_dict()["source"]["root"] == str(tmp_path / "conf" / "imgs")


@pytest.mark.parametrize(
    "pipe, field, words",
    [
        (lambda: standard().batch(0), "batch.size", "at least 1"),
        (lambda: standard().prefetch(0), "prefetch", "at least 1"),
        (
            lambda: Pipeline.image_folder("/d").decode().random_resized_crop(0).batch(1),
            "ops[1].size",
            "must be in 1..=65535",
        ),
        (lambda: standard().random_horizontal_flip(2.0), "ops[3].p", "[0, 1]"),
        (lambda: Pipeline.image_folder("/d").center_crop(8).decode().batch(1), "ops[0]", "decode"),
        (lambda: Pipeline.image_folder("/d").decode().resize(64).batch(1), "ops", "center_crop"),
        (lambda: standard().normalize(std=(0.2, 0.0, 0.2)), "ops[3].std", "> 0"),
        (lambda: standard().throttled(latency_ms=-1, bandwidth_mb_s=10), "storage.latency_ms", "must be in [0, 60000]"),
        (lambda: standard().shuffle("buffer", size=0), "shuffle.size", "at least 1"),
        (lambda: standard().on_error("ignore"), "on_error", "skip"),
        (lambda: standard().dtype("f16"), "ops[3]", "f32"),
        (lambda: Pipeline.image_folder("/d").decode().center_crop(8), "batch", "batch"),
    ],
)
def test_errors_name_the_field(pipe, field: str, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError) as info:
        pipe().to_json()
    err = info.value
    assert isinstance(err, ValueError)
    assert err.field == field, str(err)
    assert words in str(err), str(err)
    assert field in str(err)


def test_bad_toml_and_file_extension(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        Pipeline.from_toml(standard().to_toml().replace("size = 224", 'size = "big"'))
    assert info.value.field == "ops[1]"
    assert "side length" in str(info.value)
    with pytest.raises(SpecError) as info:
        standard().save(tmp_path / "spec.yaml")
    assert ".toml or .json" in str(info.value)
    with pytest.raises(SpecError) as info:
        Pipeline.load(tmp_path / "missing.toml")
    assert "cannot read" in str(info.value)


def test_validate_returns_the_pipeline_and_repr_shows_the_spec() -> None:
    p = standard()
    assert p.validate() is p
    assert "random_resized_crop" in repr(p)
    assert hash(p) == hash(standard())


def test_a_pipeline_equals_itself_saved_and_loaded_back(tmp_path: Path) -> None:
    pipe = Pipeline.image_folder(tmp_path).decode().random_resized_crop(64).random_horizontal_flip().batch(16)
    for name in ("spec.toml", "spec.json"):
        pipe.save(tmp_path / name)
        loaded = Pipeline.load(tmp_path / name)
        assert loaded == pipe and pipe == loaded and hash(loaded) == hash(pipe)
    assert Pipeline.from_dict(pipe.to_dict()) == pipe
    # Spelling a default out does not change what a pipeline means; changing a value does.
    assert pipe.prefetch(4).seed(0) == pipe
    assert pipe.seed(1) != pipe and pipe.batch(17) != pipe
    # A spec that does not validate equals only the same spec.
    unfinished = Pipeline.image_folder(tmp_path).decode()
    assert unfinished == Pipeline.image_folder(tmp_path).decode() and unfinished != pipe


@pytest.mark.parametrize(
    "build, op",
    [
        (lambda p: p.random_rotation(30), {"op": "random_rotation", "degrees": 30}),
        (lambda p: p.random_affine(15, shear=10), {"op": "random_affine", "degrees": 15, "shear": 10}),
        (lambda p: p.random_affine(0, shear=(-4, 6)), {"op": "random_affine", "degrees": 0, "shear": [-4, 6]}),
        (lambda p: p.pad(8), {"op": "pad", "padding": 8}),
        (lambda p: p.pad((2, 6)), {"op": "pad", "padding": [2, 6]}),
        (lambda p: p.random_crop(32, padding=4), {"op": "random_crop", "size": 32, "padding": 4}),
        (lambda p: p.random_perspective(fill=128), {"op": "random_perspective", "fill": 128}),
        (lambda p: p.trivial_augment_wide(fill=9), {"op": "trivial_augment_wide", "fill": 9}),
    ],
)
def test_a_spec_file_takes_torchvisions_scalar_forms(build: Callable[[Pipeline], Pipeline], op: Dict[str, Any]) -> None:
    # Before, a spec file refused them: "expected an array of length 2" (or 4).
    built = build(Pipeline.image_folder("/d").decode()).center_crop(32).batch(4).to_dict()
    ops = [{"op": "decode"}, op, {"op": "center_crop", "size": 32}]
    spec = {"source": {"kind": "image_folder", "root": "/d"}, "ops": ops, "batch": {"size": 4}}
    assert Pipeline.from_json(json.dumps(spec)).to_dict() == built
    table = "\n".join(f"{k} = {json.dumps(v)}" for k, v in op.items())
    text = f'[source]\nkind = "image_folder"\nroot = "/d"\n[[ops]]\nop = "decode"\n[[ops]]\n{table}\n'
    text += '[[ops]]\nop = "center_crop"\nsize = 32\n[batch]\nsize = 4\n'
    assert Pipeline.from_toml(text).to_dict() == built
