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
BILINEAR = pytest.importorskip("torchvision.transforms.v2").InterpolationMode.BILINEAR


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
    # ---- warps: the same f32 grid as torchvision's grid_sample path. Nearest is exact;
    # bilinear may round the other way where torchvision's f32 sums land on .5 (the
    # order of its additions differs from ours): at most 1.
    (
        "random_rotation_nearest",
        lambda p: p.random_rotation(degrees=(30, 30), fill=(10, 20, 30)),
        lambda t: tvf.rotate(t, 30.0, fill=[10, 20, 30]),
        (H, W),
        0,
    ),
    (
        "random_rotation_bilinear",
        lambda p: p.random_rotation(degrees=(-23, -23), interpolation="bilinear", fill=(200, 0, 50)),
        lambda t: tvf.rotate(t, -23.0, interpolation=BILINEAR, fill=[200, 0, 50]),
        (H, W),
        1,
    ),
    (
        "random_rotation_expand_center",
        lambda p: p.random_rotation(degrees=(40, 40), interpolation="bilinear", expand=True, center=(10, 5)),
        lambda t: tvf.rotate(t, 40.0, interpolation=BILINEAR, expand=True, center=[10, 5], fill=[0]),
        (50, 60),
        1,
    ),
    (
        "random_rotation_quarter_turn",
        lambda p: p.random_rotation(degrees=(90, 90), expand=True),
        lambda t: tvf.rotate(t, 90.0, expand=True, fill=[0]),
        (W, H),
        0,
    ),
    (
        "random_affine_nearest",
        lambda p: p.random_affine(degrees=(12, 12), scale=(0.9, 0.9), shear=(8, 8, -4, -4), fill=7),
        lambda t: tvf.affine(t, 12.0, [0, 0], 0.9, [8.0, -4.0], fill=[7]),
        (H, W),
        0,
    ),
    (
        "random_affine_bilinear",
        lambda p: p.random_affine(degrees=(-35, -35), scale=(1.3, 1.3), shear=(-12, -12), interpolation="bilinear"),
        lambda t: tvf.affine(t, -35.0, [0, 0], 1.3, [-12.0, 0.0], interpolation=BILINEAR, fill=[0]),
        (H, W),
        1,
    ),
    (
        # No distortion: the corners stay, so the map is the identity (the drawn case is
        # test_random_perspective_is_one_of_torchvisions_outcomes).
        "random_perspective",
        lambda p: p.random_perspective(distortion_scale=0.0, p=1.0),
        lambda t: tvf.perspective(
            t,
            [[0, 0], [W - 1, 0], [W - 1, H - 1], [0, H - 1]],
            [[0, 0], [W - 1, 0], [W - 1, H - 1], [0, H - 1]],
            fill=[0],
        ),
        (H, W),
        0,
    ),
    # ---- padding and random_crop: a crop the size of the padded image has one position.
    (
        "pad",
        lambda p: p.pad((1, 2, 3, 4), fill=(5, 6, 7)),
        lambda t: tvf.pad(t, [1, 2, 3, 4], fill=[5, 6, 7]),
        (H + 6, W + 4),
        0,
    ),
    (
        "random_crop_reflect",
        lambda p: p.random_crop((H + 8, W + 8), padding=4, padding_mode="reflect"),
        lambda t: tvf.pad(t, [4], padding_mode="reflect"),
        (H + 8, W + 8),
        0,
    ),
    (
        "random_crop_symmetric",
        lambda p: p.random_crop((H + 6, W + 2), padding=(1, 3), padding_mode="symmetric"),
        lambda t: tvf.pad(t, [1, 3], padding_mode="symmetric"),
        (H + 6, W + 2),
        0,
    ),
    (
        "random_crop_edge",
        lambda p: p.random_crop((H + 3, W + 5), padding=(2, 1, 3, 2), padding_mode="edge"),
        lambda t: tvf.pad(t, [2, 1, 3, 2], padding_mode="edge"),
        (H + 3, W + 5),
        0,
    ),
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


def test_random_perspective_is_one_of_torchvisions_outcomes(picture: Tuple[Path, np.ndarray]) -> None:
    """A drawn perspective can't be pinned by parameters, so torchvision warps the image for
    every corner draw it could make (distortion 0.06 gives 2 choices per coordinate on a
    53x37 image: 256 outcomes) and sluice's output must be one of them."""
    root, img = picture
    ours = run_sluice(root, lambda p: p.random_perspective(distortion_scale=0.06, p=1.0, fill=(1, 2, 3)), (H, W))
    t = torch.from_numpy(img).permute(2, 0, 1).contiguous()
    start = [[0, 0], [W - 1, 0], [W - 1, H - 1], [0, H - 1]]
    best = 256
    for bits in range(256):
        d = [(bits >> k) & 1 for k in range(8)]
        ends = [[d[0], d[1]], [W - 2 + d[2], d[3]], [W - 2 + d[4], H - 2 + d[5]], [d[6], H - 2 + d[7]]]
        theirs = tvf.perspective(t, start, ends, fill=[1, 2, 3]).permute(1, 2, 0).numpy()
        diff = int(np.abs(ours.astype(np.int16) - theirs.astype(np.int16)).max())
        if ends != start:
            best = min(best, diff)
    # Bilinear: at most 1 off (f32 rounding, as for the other warps).
    assert best <= 1, f"closest torchvision outcome differs by {best}"


def test_random_crop_pad_if_needed_is_one_of_torchvisions_outcomes(picture: Tuple[Path, np.ndarray]) -> None:
    """pad_if_needed pads both sides by the shortfall (torchvision's RandomCrop), so the crop
    still has a choice of position: sluice's must be one of torchvision's."""
    root, img = picture
    ours = run_sluice(root, lambda p: p.random_crop((H + 4, W + 2), pad_if_needed=True, fill=9), (H + 4, W + 2))
    t = tvf.pad(torch.from_numpy(img).permute(2, 0, 1).contiguous(), [2, 4], fill=9)
    outcomes = [tvf.crop(t, top, left, H + 4, W + 2).permute(1, 2, 0).numpy() for top in range(5) for left in range(3)]
    assert any(np.array_equal(ours, o) for o in outcomes)


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
