"""``Pipeline.map`` on a source with segmentation masks (docs/map.md, "Masks"): the
function gets the mask as ``sample.mask`` and edits it in place or returns ``(image,
mask)``; in-process, in worker processes and through the service the masks come out the
same.

The map functions live at the top of this module so worker processes and the service's
Python children can import them (``test_map_masks:...``, this folder on their path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import sluice
from conftest import sluice_service


def flip_both(image: np.ndarray, sample: Any) -> np.ndarray:
    """Flips image and mask left-right in place."""
    image[:] = image[:, ::-1].copy()
    sample.mask[:] = sample.mask[:, ::-1].copy()
    return image


def corner_both(image: np.ndarray, sample: Any) -> Tuple[np.ndarray, np.ndarray]:
    """A new, smaller image and its mask: the top-left 16x24."""
    return image[:16, :24].copy(), sample.mask[:16, :24].copy()


def corner_image_only(image: np.ndarray, sample: Any) -> np.ndarray:
    """Changes the image's size but leaves the mask as it was."""
    return image[:16]


def mask_as_int32(image: np.ndarray, sample: Any) -> Tuple[np.ndarray, np.ndarray]:
    return image, sample.mask.astype(np.int32)


def pair_without_mask(image: np.ndarray, sample: Any) -> Tuple[np.ndarray, Any]:
    assert sample.mask is None
    return image, np.zeros(image.shape[:2], np.uint8)


def noisy_mask(image: np.ndarray, sample: Any) -> np.ndarray:
    """Random (from the sample's generator) edits of both: what workers must reproduce."""
    image ^= sample.rng.integers(0, 256, size=image.shape, dtype=np.uint8)
    sample.mask[:] = np.roll(sample.mask, int(sample.rng.integers(0, 8)), axis=1)
    sample.mask[0, 0] = sample.key % 256
    return image


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("map_masks")
    sluice.generate_dataset(root, images=12, classes=3, seed=4, masks=True)
    return root


def _pipe(root: Path, masks: bool = True) -> sluice.Pipeline:
    return sluice.Pipeline.sidecar(root, masks=masks).decode().center_crop(32).shuffle(False).seed(3)


def _batches(loader: Any) -> List[Dict[str, np.ndarray]]:
    return [{k: np.asarray(b[k]) for k in ("key", "image", "masks", "boxes", "box_count")} for b in loader]


def test_a_map_flipping_image_and_mask_in_place_equals_the_native_flip(masked: Path) -> None:
    native = _batches(sluice.Loader(_pipe(masked).random_horizontal_flip(1.0).batch(4)))
    mapped = _batches(sluice.Loader(_pipe(masked).map(flip_both).batch(4), processes=0))
    assert len(mapped) == 3 and len(np.unique(native[0]["masks"])) > 1
    for n, m in zip(native, mapped):
        np.testing.assert_array_equal(m["key"], n["key"])
        np.testing.assert_array_equal(m["image"], n["image"])
        np.testing.assert_array_equal(m["masks"], n["masks"])


def test_a_map_returning_a_new_image_and_mask_sets_both(masked: Path) -> None:
    plain = _batches(sluice.Loader(_pipe(masked).batch(4)))
    mapped = _batches(sluice.Loader(_pipe(masked).map(corner_both).center_crop((16, 24)).batch(4), processes=0))
    for p, m in zip(plain, mapped):
        assert m["image"].shape == (4, 16, 24, 3) and m["masks"].shape == (4, 16, 24)
        np.testing.assert_array_equal(m["image"], p["image"][:, :16, :24])
        np.testing.assert_array_equal(m["masks"], p["masks"][:, :16, :24])


@pytest.mark.parametrize(
    "fn,says",
    [
        (corner_image_only, "changed the image to 32x16 but returned no mask of that size"),
        (mask_as_int32, "uint8"),
    ],
)
def test_a_map_that_leaves_no_fitting_mask_fails_the_sample_naming_the_op(masked: Path, fn: Any, says: str) -> None:
    pipe = _pipe(masked).map(fn).batch(4)
    with pytest.raises(sluice.SampleError) as e:
        list(sluice.Loader(pipe, processes=0))
    msg = str(e.value)
    assert f"test_map_masks:{fn.__name__}" in msg and says in msg and "img_" in msg, msg


def test_without_masks_the_sample_has_none_and_a_pair_is_refused(masked: Path) -> None:
    pipe = _pipe(masked, masks=False).map(pair_without_mask).batch(4)
    with pytest.raises(sluice.SampleError) as e:
        list(sluice.Loader(pipe, processes=0))
    msg = str(e.value)
    assert "test_map_masks:pair_without_mask" in msg and "no mask" in msg, msg


def test_worker_processes_give_the_in_process_masks(masked: Path) -> None:
    pipe = _pipe(masked).random_horizontal_flip().map(noisy_mask).batch(5).shuffle(True)
    want = _batches(sluice.Loader(pipe, processes=0))
    got = _batches(sluice.Loader(pipe, processes=2))
    assert len(got) == len(want) == 3
    for w, g in zip(want, got):
        assert set(g) == set(w)
        for k in w:
            np.testing.assert_array_equal(g[k], w[k], err_msg=k)


def test_a_remote_loader_with_a_map_yields_the_local_masks(masked: Path, tmp_path: Path) -> None:
    pipe = _pipe(masked).random_horizontal_flip().map(noisy_mask).map(corner_both).center_crop((16, 24)).batch(4)

    def by_key(loader: Any) -> Dict[int, Tuple[bytes, bytes]]:
        out = {}
        for b in loader:
            masks = np.asarray(b.masks)
            assert masks.shape == (len(b.key), 16, 24), masks.shape
            for k, img, m in zip(np.asarray(b.key).tolist(), np.asarray(b.image), masks):
                out[k] = (img.tobytes(), m.tobytes())
        return out

    local = by_key(sluice.Loader(pipe, processes=0))
    env = {"PYTHONPATH": str(Path(__file__).parent)}
    args = ["--python", sys.executable]
    with sluice_service(
        [masked], tmp_path / "journal", worker_args=args, worker_env=env, python_modules=["test_map_masks"]
    ) as addr:
        remote = by_key(sluice.RemoteLoader(pipe, dispatcher=addr, job="map-masks", output="numpy"))
    assert sorted(remote) == list(range(12))
    assert remote == local


def test_the_map_server_takes_and_answers_masks_over_its_pipes() -> None:
    """``python -m sluice.map_server``, driven as the worker drives it, with masks."""
    from sluice import map_server as ms

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}

    def serve(fn: str, requests: List[Tuple[int, np.ndarray, np.ndarray]]) -> List[Tuple[int, int, int, bytes, bytes]]:
        cmd = [sys.executable, "-m", "sluice.map_server", f"test_map_masks:{fn}"]
        with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env) as p:
            assert p.stdin is not None and p.stdout is not None
            assert ms.REPLY.unpack(p.stdout.read(ms.REPLY.size))[0] == ms.READY
            replies = []
            for key, image, mask in requests:
                h, w = mask.shape
                p.stdin.write(ms.REQUEST.pack(key, 0, 0, 1, w, h, 1) + image.tobytes() + mask.tobytes())
                p.stdin.flush()
                status, a, b = ms.REPLY.unpack(p.stdout.read(ms.REPLY.size))
                if status == ms.IMAGE:
                    replies.append((status, a, b, p.stdout.read(a * b * 3), p.stdout.read(a * b)))
                else:
                    replies.append((status, a, b, p.stdout.read(a), b""))
            p.stdin.close()
            assert p.wait(timeout=10) == 0
        return replies

    image = np.arange(32 * 40 * 3, dtype=np.uint8).reshape(32, 40, 3)
    mask = (np.arange(32 * 40) % 7).astype(np.uint8).reshape(32, 40)
    ((status, w, h, pixels, got),) = serve("corner_both", [(1, image, mask)])
    assert (status, w, h) == (ms.IMAGE, 24, 16)
    assert pixels == image[:16, :24].tobytes() and got == mask[:16, :24].tobytes()
    ((status, _, _, pixels, got),) = serve("flip_both", [(1, image, mask)])
    assert pixels == image[:, ::-1].tobytes() and got == mask[:, ::-1].tobytes()
    ((status, _, _, message, _),) = serve("corner_image_only", [(1, image, mask)])
    assert (status, message.decode()) == (ms.FAILED, "it changed the image to 40x16 but returned no mask of that size")


@pytest.mark.parametrize("level", ["raw", "decoded"])
def test_a_cached_epoch_gives_the_map_the_uncached_masks(masked: Path, level: str) -> None:
    # `map` is a user op: it runs after the cache, on the mask the entry kept (or re-read).
    pipe = _pipe(masked).map(noisy_mask).random_horizontal_flip().batch(6)
    plain = sluice.Loader(pipe, processes=0)
    cached = sluice.Loader(pipe.cache("16MB", level=level), processes=0)
    for epoch in range(2):
        for w, g in zip(_batches(plain), _batches(cached)):
            for k in w:
                np.testing.assert_array_equal(g[k], w[k], err_msg=f"{level} epoch {epoch} {k}")
    stats = cached.stats()["cache"]
    assert (stats["hits"], stats["misses"]) == (12, 12), stats
