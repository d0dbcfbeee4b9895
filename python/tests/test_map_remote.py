"""Pipeline.map through the service (docs/map.md, "Through the service"): a real ``sluice
service worker`` runs the function in Python children (``--python``), and a
``sluice.RemoteLoader`` gets the same batches as a local ``sluice.Loader``.

The map functions live at the top of this module so the workers' children can import them
(``test_map_remote:...``, this folder on their ``PYTHONPATH``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pytest

import sluice
from conftest import N_IMAGES, sluice_service


def mark(image: np.ndarray, sample: Any) -> np.ndarray:
    """Adds noise from the sample's generator and writes key and label into pixel 0."""
    out: np.ndarray = image ^ sample.rng.integers(0, 256, size=image.shape, dtype=np.uint8)
    out[0, 0] = [sample.key % 256, sample.label % 256, sample.epoch % 256]
    return out


@pytest.fixture()
def service(dataset: Path, tmp_path: Path) -> Iterator[Tuple[str, Path]]:
    """A dispatcher and one worker whose map children run this Python with this folder on
    their path."""
    env = {"PYTHONPATH": str(Path(__file__).parent)}
    args = ["--python", sys.executable]
    with sluice_service(
        [dataset], tmp_path / "journal", worker_args=args, worker_env=env, python_modules=["test_map_remote"]
    ) as a:
        yield a, dataset


def _pipeline(root: Path) -> sluice.Pipeline:
    return sluice.Pipeline.image_folder(root).decode().random_resized_crop(16).map(mark).batch(8).seed(5)


def _by_key(batches: Any) -> Dict[int, bytes]:
    out: Dict[int, bytes] = {}
    for b in batches:
        for key, image in zip(np.asarray(b.key).tolist(), np.asarray(b.image)):
            assert key not in out, f"sample {key} came twice"
            out[key] = image.tobytes()
    return out


def test_a_map_runs_on_remote_workers_as_it_does_locally(service: Tuple[str, Path]) -> None:
    addr, root = service
    local = _by_key(sluice.Loader(_pipeline(root), processes=0, output="numpy"))
    loader = sluice.RemoteLoader(_pipeline(root), dispatcher=addr, job="py-map", output="numpy")
    remote = _by_key(loader)
    assert sorted(remote) == list(range(N_IMAGES))
    # The same function on the same (seed, epoch, key): the same pixels as in-process.
    assert remote == local
    first = np.frombuffer(remote[3], np.uint8)[:3].tolist()
    assert first[0] == 3 and first[2] == 0


def fail_on_key_5(image: np.ndarray, sample: Any) -> np.ndarray:
    if sample.key == 5:
        raise ValueError(f"cannot augment sample {sample.key}")
    return image[:2]


def test_the_map_server_answers_images_and_errors_over_its_pipes() -> None:
    """``python -m sluice.map_server``, the worker's child, driven as the worker drives it."""
    from sluice import map_server as ms

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "sluice.map_server", "test_map_remote:fail_on_key_5"]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env) as p:
        assert p.stdin is not None and p.stdout is not None

        def reply() -> Tuple[int, int, int, bytes]:
            status, a, b = ms.REPLY.unpack(p.stdout.read(ms.REPLY.size))  # type: ignore[union-attr]
            n = a * b * 3 if status == ms.IMAGE else a if status == ms.FAILED else 0
            return status, a, b, p.stdout.read(n)  # type: ignore[union-attr]

        assert reply()[0] == ms.READY
        image = np.arange(4 * 3 * 3, dtype=np.uint8).reshape(4, 3, 3)
        for key in (1, 5):
            p.stdin.write(ms.REQUEST.pack(key, 2, 0, 9, 3, 4, 0) + image.tobytes())
            p.stdin.flush()
        assert reply() == (ms.IMAGE, 3, 2, image[:2].tobytes())
        status, _, _, message = reply()
        assert status == ms.FAILED
        assert message.decode() == "test_map_remote:fail_on_key_5 raised ValueError: cannot augment sample 5"
        p.stdin.close()
        assert p.wait(timeout=10) == 0

    # A function it cannot import: one FAILED reply naming it, then it exits.
    bad = subprocess.run([*cmd[:3], "no_such_module:f"], input=b"", capture_output=True, env=env, timeout=30)
    assert bad.returncode == 1
    assert b"cannot import `no_such_module:f`: ModuleNotFoundError" in bad.stdout


def test_the_map_server_imports_only_what_the_name_says_and_not_from_the_working_folder(tmp_path: Path) -> None:
    """The child keeps ``module:qualname`` to the module's own function: no dunder
    attribute, no walk through a module, nothing the module imported, and no module from
    the folder it runs in."""
    here = str(Path(__file__).parent)
    # No empty entry: Python reads one as the current folder, which is what is tested here.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    env.pop("PYTHONSAFEPATH", None)
    # A module in the working folder, as `python -c` (what the worker runs) would find it.
    (tmp_path / "in_the_cwd.py").write_text("def f(image, sample):\n    return image\n")
    refused = {
        "test_map_remote:mark.__call__": "reaches through `__call__`",
        "test_map_remote:np.load": "walks through module `numpy`",
        "test_map_remote:sluice_service": "is defined in `conftest`",
        "in_the_cwd:f": "ModuleNotFoundError",
    }
    from sluice import map_server

    source = Path(map_server.__file__).read_text()
    for name, why in refused.items():
        bad = subprocess.run(
            [sys.executable, "-c", source, name], input=b"", capture_output=True, env=env, cwd=tmp_path, timeout=30
        )
        assert bad.returncode == 1, name
        assert f"cannot import `{name}`".encode() in bad.stdout and why.encode() in bad.stdout, bad.stdout


def stamp(fields: Dict[str, np.ndarray], info: Any) -> Dict[str, np.ndarray]:
    """A map_batch: noise from the batch's generator, and the batch's index per sample."""
    out = dict(fields)
    out["image"] = fields["image"] ^ info.rng.integers(0, 256, size=fields["image"].shape, dtype=np.uint8)
    out["batch"] = np.full(len(fields["key"]), info.index, np.int64)
    return out


def test_a_remote_loader_runs_map_batch_on_each_batch_as_the_local_loader_does(service: Tuple[str, Path]) -> None:
    addr, root = service
    pipe = sluice.Pipeline.image_folder(root).decode().center_crop(16).batch(8).seed(5).map_batch(stamp)
    local = {
        int(k): (img.tobytes(), int(b))
        for x in sluice.Loader(pipe, processes=0)
        for k, img, b in zip(x.key, x.image, x.batch)
    }
    remote = {
        int(k): (img.tobytes(), int(b))
        for x in sluice.RemoteLoader(pipe, dispatcher=addr, job="py-map-batch")
        for k, img, b in zip(x.key, x.image, x.batch)
    }
    assert sorted(remote) == list(range(N_IMAGES))
    assert remote == local


def test_a_remote_loader_yields_each_samples_boxes_as_the_local_loader_does(tmp_path: Path) -> None:
    root = tmp_path / "boxes"
    sluice.generate_dataset(root, images=16, classes=2, seed=3, boxes=True)
    pipe = sluice.Pipeline.sidecar(root).decode().center_crop(32).random_horizontal_flip().batch(4).seed(1)

    def by_key(loader: Any) -> Dict[int, Tuple[Any, ...]]:
        out = {}
        for b in loader:
            for i, k in enumerate(np.asarray(b.key).tolist()):
                n = int(b.box_count[i])
                out[k] = (np.asarray(b.boxes[i][:n]).tolist(), np.asarray(b.box_labels[i][:n]).tolist())
        return out

    local = by_key(sluice.Loader(pipe))
    assert sum(len(v[0]) for v in local.values()) > 0
    with sluice_service([root], tmp_path / "journal") as addr:
        remote = by_key(sluice.RemoteLoader(pipe, dispatcher=addr, job="boxes"))
    assert remote == local


def test_a_remote_loader_yields_each_batchs_masks_as_the_local_loader_does(tmp_path: Path) -> None:
    root = tmp_path / "masks"
    sluice.generate_dataset(root, images=16, classes=2, seed=3, masks=True)
    # The flip moves each mask with its pixels: the workers must apply it as the local loader does.
    pipe = sluice.Pipeline.sidecar(root, masks=True).decode().center_crop(32).random_horizontal_flip().batch(4).seed(1)

    def batches(loader: Any) -> List[Tuple[Tuple[int, ...], bytes]]:
        out = []
        for b in loader:
            masks = np.asarray(b.masks)
            assert masks.dtype == np.uint8 and masks.shape == (len(b.key), 32, 32), masks.shape
            out.append((tuple(np.asarray(b.key).tolist()), masks.tobytes()))
        return sorted(out)

    local = batches(sluice.Loader(pipe))
    assert any(any(m) for _, m in local), "no mask pixels to compare"
    with sluice_service([root], tmp_path / "journal") as addr:
        remote = batches(sluice.RemoteLoader(pipe, dispatcher=addr, job="masks"))
    assert remote == local


def test_a_map_timeout_is_a_bounded_field_of_the_op_and_a_dunder_name_is_refused(dataset: Path) -> None:
    base = sluice.Pipeline.image_folder(dataset).decode().random_resized_crop(16)
    timed = base.map(mark, timeout_ms=1500).batch(4)
    assert timed.to_dict()["ops"][-1] == {"op": "map", "fn": "test_map_remote:mark", "timeout_ms": 1500}
    # At its default (a minute) it is left out of the spec.
    assert base.map(mark).batch(4).to_dict()["ops"][-1] == {"op": "map", "fn": "test_map_remote:mark"}
    for bad in (0, 3_600_001):
        with pytest.raises(sluice.SpecError) as e:
            base.map(mark, timeout_ms=bad).batch(4).validate()
        assert e.value.field == "ops[2].timeout_ms"
    with pytest.raises(sluice.SpecError, match="dunder") as e:
        base.map("test_map_remote:mark.__call__.__call__").batch(4).validate()
    assert e.value.field == "ops[2].fn"
