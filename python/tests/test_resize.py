"""``resize`` and ``random_resized_crop`` in every interpolation mode against
``torchvision.transforms.v2.functional.resize`` / ``resized_crop``.

Each mode runs on a lossless PNG (so only the resampler is compared) and on a JPEG, where
the decode is fused with the crop: an antialiased filter may let the IDCT shrink the window
by 1/2, 1/4 or 1/8 first (a stated tolerance, below); the other modes decode it unscaled and
must match torchvision's resampling of the full-size decode.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, List, Tuple

import numpy as np
import pytest

import sluice

torch = pytest.importorskip("torch")
tvf = pytest.importorskip("torchvision.transforms.v2.functional")
InterpolationMode = pytest.importorskip("torchvision.transforms.v2").InterpolationMode
PIL_Image = pytest.importorskip("PIL.Image")

H, W = 37, 53

#: (interpolation, antialias, max abs difference on u8). torch computes the antialiased and
#: the u8 bilinear/bicubic filters in fixed point with its own rounding: at most 1 off.
MODES: List[Tuple[str, bool, int]] = [
    ("bilinear", True, 1),
    ("bilinear", False, 1),
    ("bicubic", True, 1),
    ("bicubic", False, 1),
    ("nearest", False, 0),
    ("nearest_exact", False, 0),
]
MODE_IDS = [f"{m}-{'aa' if aa else 'noaa'}" for m, aa, _ in MODES]

TV_MODES = {
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
    "nearest": InterpolationMode.NEAREST,
    "nearest_exact": InterpolationMode.NEAREST_EXACT,
}


def pattern(h: int, w: int) -> np.ndarray:
    """Gradients, a hard-edged block and a high-frequency channel: every filter shows."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // (w - 1)), (y * 255 // (h - 1)), ((x * 7 + y * 13) % 256)], axis=-1)
    img[h // 4 : h // 2, w // 4 : w // 2] = [250, 30, 90]
    return img.astype(np.uint8)


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, np.ndarray]:
    img = pattern(H, W)
    root = tmp_path_factory.mktemp("resize") / "train"
    (root / "a").mkdir(parents=True)
    PIL_Image.fromarray(img).save(root / "a" / "x.png")
    return root, img


def smooth(h: int, w: int) -> np.ndarray:
    """A photo-like image: low-frequency shapes, no single-pixel detail."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / 23.0) * np.cos(y / 31.0)
    g = 128 + 90 * np.cos((x + y) / 41.0)
    b = np.where((x - w / 2) ** 2 + (y - h / 2) ** 2 < (h / 3) ** 2, 200.0, 40.0)
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, np.ndarray]:
    """A 320x240 JPEG, and its pixels as sluice decodes it whole (a center crop of the
    full size decodes unscaled)."""
    root = tmp_path_factory.mktemp("resize_jpeg") / "train"
    (root / "a").mkdir(parents=True)
    PIL_Image.fromarray(smooth(240, 320)).save(root / "a" / "x.jpg", quality=92)
    return root, run(root, lambda p: p.center_crop((240, 320)))


def run(root: Path, build: Callable[[sluice.Pipeline], sluice.Pipeline]) -> np.ndarray:
    pipe = build(sluice.Pipeline.image_folder(root).decode()).batch(1).threads(1)
    (batch,) = list(sluice.Loader(pipe))
    return np.asarray(batch.image)[0]


def chw(img: np.ndarray) -> Any:
    return torch.from_numpy(img).permute(2, 0, 1).contiguous()


def hwc(t: Any) -> np.ndarray:
    return np.asarray(t.permute(1, 2, 0).numpy())


def max_diff(a: np.ndarray, b: np.ndarray) -> int:
    assert a.shape == b.shape, (a.shape, b.shape)
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


def tv_resize(img: np.ndarray, size: List[int], mode: str, antialias: bool) -> np.ndarray:
    return hwc(tvf.resize(chw(img), size, interpolation=TV_MODES[mode], antialias=antialias))


@pytest.mark.parametrize("mode,antialias,tol", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("size", [16, 30, 61])
def test_resize_matches_torchvision(
    picture: Tuple[Path, np.ndarray], mode: str, antialias: bool, tol: int, size: int
) -> None:
    """Shrinking a lot, a little and enlarging; then a center crop, fused with the decode
    (``resize`` first) and not (after an op that keeps the image)."""
    root, img = picture
    theirs = tv_resize(img, [size], mode, antialias)
    crop = theirs.shape[:2]  # the whole image: the borders are where filters differ most
    for first in (True, False):

        def build(p: sluice.Pipeline, first: bool = first) -> sluice.Pipeline:
            p = p if first else p.random_vertical_flip(p=0.0)
            return p.resize(size, interpolation=mode, antialias=antialias).center_crop(crop)

        ours = run(root, build)
        assert max_diff(ours, theirs) <= tol, f"{mode} antialias={antialias} size={size} fused={first}"


def rrc_outcomes(img: np.ndarray, scale: float, ratio: float, size: Tuple[int, int], mode: str, aa: bool) -> Any:
    """Every crop torchvision's RandomResizedCrop could take at a pinned scale and ratio
    (its size is then fixed; only its position is drawn), resized."""
    h_img, w_img = img.shape[:2]
    area = h_img * w_img * scale
    w = int(round(math.sqrt(area * ratio)))
    h = int(round(math.sqrt(area / ratio)))
    t = chw(img)
    for top in range(h_img - h + 1):
        for left in range(w_img - w + 1):
            yield hwc(tvf.resized_crop(t, top, left, h, w, list(size), interpolation=TV_MODES[mode], antialias=aa))


@pytest.mark.parametrize("mode,antialias,tol", MODES, ids=MODE_IDS)
def test_random_resized_crop_is_one_of_torchvisions_outcomes(
    picture: Tuple[Path, np.ndarray], mode: str, antialias: bool, tol: int
) -> None:
    """torchvision crops, then resizes the crop alone: its filter never reads a pixel
    outside the crop, so the crop's edge pixels must match too."""
    root, img = picture
    size = (14, 18)
    ours = run(
        root,
        lambda p: p.random_resized_crop(
            size, scale=(0.4, 0.4), ratio=(1.3, 1.3), interpolation=mode, antialias=antialias
        ),
    )
    best = min(max_diff(ours, o) for o in rrc_outcomes(img, 0.4, 1.3, size, mode, antialias))
    assert best <= tol, f"closest torchvision outcome differs by {best}"


@pytest.mark.parametrize("mode,antialias,tol", MODES, ids=MODE_IDS)
def test_fused_jpeg_crop_resize_against_torchvision_on_the_full_decode(
    jpeg: Tuple[Path, np.ndarray], mode: str, antialias: bool, tol: int
) -> None:
    """The decode fused with ``resize``: antialiased bilinear and bicubic let the IDCT scale
    the window (here by 1/4: 320x240 -> 80x60, then 40x30), which box-averages each 4x4
    block where torchvision's wider filter weighs the full-size pixels. On smooth content
    that is within a level or two; across a hard edge it shows: the circle's 160-level edge
    here moves by up to 22 (bilinear) and 15 (bicubic), about 1/8 of the edge, with the mean
    under 1. The other modes decode unscaled and match as on a PNG."""
    root, full = jpeg
    ours = run(root, lambda p: p.resize(30, interpolation=mode, antialias=antialias).center_crop((30, 40)))
    theirs = tv_resize(full, [30], mode, antialias)
    scaled = antialias and mode in ("bilinear", "bicubic")
    diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    if scaled:
        assert int(diff.max()) <= 160 // 6 and float(diff.mean()) < 1.0, (int(diff.max()), float(diff.mean()))
    else:
        assert int(diff.max()) <= tol, int(diff.max())


def test_defaults_are_torchvisions_and_stay_out_of_the_spec(picture: Tuple[Path, np.ndarray]) -> None:
    """torchvision v2's defaults (bilinear, antialias=True) are what an op without the
    arguments gets, and they are left out of the spec so existing specs (and cache keys
    derived from them) are unchanged."""
    root, _ = picture
    base = sluice.Pipeline.image_folder(root).decode()
    plain = base.resize(20).center_crop(16).batch(1)
    assert '"interpolation"' not in plain.to_json() and '"antialias"' not in plain.to_json()
    explicit = base.resize(20, interpolation="bilinear", antialias=True).center_crop(16).batch(1)
    assert np.array_equal(
        run(root, lambda p: p.resize(20).center_crop(16)),
        run(root, lambda p: p.resize(20, interpolation="bilinear", antialias=True).center_crop(16)),
    )
    assert explicit.to_json() == plain.to_json()


def test_interpolation_is_checked_with_the_field_named(picture: Tuple[Path, np.ndarray]) -> None:
    root, _ = picture
    base = sluice.Pipeline.image_folder(root).decode()
    for bad, field, says in [
        # An unknown mode fails to parse: the error names the op and lists the modes.
        (base.resize(20, interpolation="lanczos").center_crop(8), "ops[1]", "nearest_exact"),
        (base.random_resized_crop(8, interpolation="area"), "ops[1]", "unknown variant `area`"),
        # The warps have no bicubic or nearest-exact kernel (torchvision's tensor warps).
        (base.random_rotation(10, interpolation="nearest_exact").center_crop(8), "ops[1].interpolation", "bilinear"),
    ]:
        with pytest.raises(sluice.SpecError) as e:
            bad.batch(1).validate()
        assert e.value.field == field and says in str(e.value), e.value
