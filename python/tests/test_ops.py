"""Every pixel op against ``torchvision.transforms.v2.functional`` on the same parameters.

Each case runs a one-image pipeline ``decode → op → center_crop`` on a lossless PNG and the
torchvision functional on the same decoded pixels, then compares u8 outputs. Random ops are
pinned to one outcome through their parameters (``p = 1``, a range of width zero), so the
comparison is of pixels, not of random streams.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

import sluice

torch = pytest.importorskip("torch")
tvf = pytest.importorskip("torchvision.transforms.v2.functional")
PIL_Image = pytest.importorskip("PIL.Image")

H, W = 37, 53


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, np.ndarray]:
    """One 53x37 PNG with smooth gradients, edges and every channel used."""
    y, x = np.mgrid[0:H, 0:W]
    img = np.stack([(x * 255 // (W - 1)), (y * 255 // (H - 1)), ((x * 7 + y * 13) % 256)], axis=-1)
    img[10:20, 15:30] = [250, 30, 90]
    img = img.astype(np.uint8)
    root = tmp_path_factory.mktemp("ops") / "train"
    (root / "a").mkdir(parents=True)
    PIL_Image.fromarray(img).save(root / "a" / "x.png")
    return root, img


def run_sluice(root: Path, build: Callable[[sluice.Pipeline], sluice.Pipeline], out: Tuple[int, int]) -> np.ndarray:
    pipe = build(sluice.Pipeline.image_folder(root).decode()).center_crop(out).batch(1).threads(1)
    (batch,) = list(sluice.Loader(pipe))
    return np.asarray(batch.image)[0]


def run_torchvision(img: np.ndarray, fn: Callable[[Any], Any], out: Tuple[int, int]) -> np.ndarray:
    t = torch.from_numpy(img).permute(2, 0, 1).contiguous()
    t = tvf.center_crop(fn(t), list(out))
    return t.permute(1, 2, 0).numpy()


#: (name, sluice builder step, torchvision functional, output size, max abs difference).
CASES: List[Tuple[str, Callable[[sluice.Pipeline], sluice.Pipeline], Callable[[Any], Any], Tuple[int, int], int]] = [
    ("center_crop", lambda p: p.center_crop((21, 30)), lambda t: t, (21, 30), 0),
    ("resize", lambda p: p.resize(24), lambda t: tvf.resize(t, [24], antialias=True), (24, 34), 1),
    ("invert", lambda p: p.invert(), tvf.invert, (H, W), 0),
    ("random_vertical_flip", lambda p: p.random_vertical_flip(p=1.0), tvf.vertical_flip, (H, W), 0),
]


@pytest.mark.parametrize("name,build,fn,out,tol", CASES, ids=[c[0] for c in CASES])
def test_op_matches_torchvision(
    picture: Tuple[Path, np.ndarray],
    name: str,
    build: Callable[[sluice.Pipeline], sluice.Pipeline],
    fn: Callable[[Any], Any],
    out: Tuple[int, int],
    tol: int,
) -> None:
    root, img = picture
    ours = run_sluice(root, build, out)
    theirs = run_torchvision(img, fn, out)
    assert ours.shape == theirs.shape, name
    diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    assert int(diff.max()) <= tol, f"{name}: max abs difference {int(diff.max())} > {tol}"


def test_a_random_op_draws_per_sample_and_its_probability_is_respected(picture: Tuple[Path, np.ndarray]) -> None:
    root, img = picture
    never = run_sluice(root, lambda p: p.random_vertical_flip(p=0.0), (H, W))
    assert np.array_equal(never, img)


def test_op_parameters_are_checked_with_the_field_named(picture: Tuple[Path, np.ndarray]) -> None:
    root, _ = picture
    with pytest.raises(sluice.SpecError) as e:
        sluice.Pipeline.image_folder(root).decode().random_vertical_flip(p=1.5).center_crop(8).batch(1).validate()
    assert e.value.field == "ops[1].p"


def test_every_case_names_a_different_op() -> None:
    names: Dict[str, int] = {}
    for c in CASES:
        names[c[0]] = names.get(c[0], 0) + 1
    assert all(n == 1 for n in names.values())
