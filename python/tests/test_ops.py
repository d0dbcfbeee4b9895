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
BILINEAR = pytest.importorskip("torchvision.transforms.v2").InterpolationMode.BILINEAR

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
    # ---- colour: ranges of width zero pin ColorJitter's factors, p = 1 the Random* ops.
    (
        "color_jitter[brightness]",
        lambda p: p.color_jitter(brightness=(1.4, 1.4)),
        lambda t: tvf.adjust_brightness(t, 1.4),
        (H, W),
        0,
    ),
    (
        "color_jitter[contrast]",
        lambda p: p.color_jitter(contrast=(0.6, 0.6)),
        lambda t: tvf.adjust_contrast(t, 0.6),
        (H, W),
        # torch sums the grayscale mean in float32 in its own order; we sum exactly.
        1,
    ),
    (
        "color_jitter[saturation]",
        lambda p: p.color_jitter(saturation=(1.7, 1.7)),
        lambda t: tvf.adjust_saturation(t, 1.7),
        (H, W),
        0,
    ),
    ("color_jitter[hue+]", lambda p: p.color_jitter(hue=(0.2, 0.2)), lambda t: tvf.adjust_hue(t, 0.2), (H, W), 1),
    ("color_jitter[hue-]", lambda p: p.color_jitter(hue=(-0.35, -0.35)), lambda t: tvf.adjust_hue(t, -0.35), (H, W), 1),
    ("grayscale", lambda p: p.grayscale(), lambda t: tvf.rgb_to_grayscale(t, num_output_channels=3), (H, W), 0),
    (
        "random_grayscale",
        lambda p: p.random_grayscale(p=1.0),
        lambda t: tvf.rgb_to_grayscale(t, num_output_channels=3),
        (H, W),
        0,
    ),
    ("solarize", lambda p: p.solarize(128), lambda t: tvf.solarize(t, 128), (H, W), 0),
    ("posterize", lambda p: p.posterize(3), lambda t: tvf.posterize(t, 3), (H, W), 0),
    ("equalize", lambda p: p.equalize(), tvf.equalize, (H, W), 0),
    ("autocontrast", lambda p: p.autocontrast(), tvf.autocontrast, (H, W), 0),
    ("adjust_sharpness[2]", lambda p: p.adjust_sharpness(2.0), lambda t: tvf.adjust_sharpness(t, 2.0), (H, W), 1),
    ("adjust_sharpness[0.3]", lambda p: p.adjust_sharpness(0.3), lambda t: tvf.adjust_sharpness(t, 0.3), (H, W), 1),
    (
        "gaussian_blur",
        lambda p: p.gaussian_blur((5, 3), sigma=(1.2, 1.2)),
        lambda t: tvf.gaussian_blur(t, [5, 3], [1.2, 1.2]),
        (H, W),
        # two float32 1-D passes instead of one 2-D convolution: rounding may differ by 1.
        1,
    ),
    (
        "gaussian_blur[wide]",
        lambda p: p.gaussian_blur(9, sigma=3.0),
        lambda t: tvf.gaussian_blur(t, [9, 9], [3.0, 3.0]),
        (H, W),
        1,
    ),
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


def test_a_random_op_draws_per_sample_and_its_probability_is_respected(picture: Tuple[Path, np.ndarray]) -> None:
    root, img = picture
    never = run_sluice(root, lambda p: p.random_vertical_flip(p=0.0), (H, W))
    assert np.array_equal(never, img)


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


def test_op_parameters_are_checked_with_the_field_named(picture: Tuple[Path, np.ndarray]) -> None:
    root, _ = picture
    with pytest.raises(sluice.SpecError) as e:
        sluice.Pipeline.image_folder(root).decode().random_vertical_flip(p=1.5).center_crop(8).batch(1).validate()
    assert e.value.field == "ops[1].p"


def test_color_jitter_applies_all_four_in_one_of_torchvisions_orders(picture: Tuple[Path, np.ndarray]) -> None:
    """With every factor pinned, the output is torchvision's for one of the 24 orders, and
    different samples (keys) draw different orders."""
    import itertools

    root, img = picture
    factors = {"brightness": 1.2, "contrast": 0.7, "saturation": 1.5, "hue": 0.1}
    fns = {
        "brightness": tvf.adjust_brightness,
        "contrast": tvf.adjust_contrast,
        "saturation": tvf.adjust_saturation,
        "hue": tvf.adjust_hue,
    }
    ours = run_sluice(root, lambda p: p.color_jitter(**{k: (v, v) for k, v in factors.items()}), (H, W))
    best = 255
    for order in itertools.permutations(factors):

        def chain(t: Any, order: Tuple[str, ...] = order) -> Any:
            for name in order:
                t = fns[name](t, factors[name])
            return t

        theirs = run_torchvision(img, chain, (H, W))
        best = min(best, int(np.abs(ours.astype(np.int16) - theirs.astype(np.int16)).max()))
    assert best <= 1, f"no order of torchvision's gives our pixels (closest: {best})"


def test_random_erasing_after_normalize_gives_torchvisions_values(
    tmp_path: Path, picture: Tuple[Path, np.ndarray]
) -> None:
    """``normalize, layout chw, random_erasing`` erases in normalized units, as torchvision's
    ToDtype + Normalize + RandomErasing: the rectangle has torchvision's size for the pinned
    scale and ratio, and outside it the tensor is untouched."""
    root, img = picture
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    base = sluice.Pipeline.image_folder(root).decode().center_crop((H, W)).normalize(mean, std).layout("chw")

    def one(pipe: sluice.Pipeline) -> np.ndarray:
        (batch,) = list(sluice.Loader(pipe.batch(1).threads(1)))
        return np.asarray(batch.image)[0]

    plain = one(base)
    t = tvf.normalize(
        tvf.to_dtype(torch.from_numpy(img).permute(2, 0, 1), torch.float32, scale=True), list(mean), list(std)
    )
    np.testing.assert_allclose(plain, t.numpy(), atol=1e-5)
    # torchvision's size for scale 0.1, ratio 1: round(sqrt(0.1 * H * W)) on each side.
    side = int(round((0.1 * H * W) ** 0.5))
    for value in (0.0, [0.5, -1.0, 2.0]):
        erased = one(base.random_erasing(p=1.0, scale=(0.1, 0.1), ratio=(1.0, 1.0), value=value))
        ys, xs = np.nonzero((erased != plain).any(axis=0))
        i, j = int(ys.min()), int(xs.min())
        v = torch.tensor([float(value)] if isinstance(value, float) else value)[:, None, None]
        theirs = tvf.erase(t, i, j, side, side, v)
        np.testing.assert_allclose(erased, theirs.numpy(), atol=1e-5)
    noisy = one(base.random_erasing(p=1.0, scale=(0.1, 0.1), ratio=(1.0, 1.0), value="random"))
    changed = noisy[:, (noisy != plain).any(axis=0)]
    assert changed.size == 3 * side * side and abs(float(changed.mean())) < 0.3 and 0.7 < float(changed.std()) < 1.3
    never = one(base.random_erasing(p=0.0))
    assert np.array_equal(never, plain)
    # u8 output: the value as a pixel.
    u8 = (
        sluice.Pipeline.image_folder(root)
        .decode()
        .center_crop((H, W))
        .random_erasing(p=1.0, value=7, scale=(0.1, 0.1), ratio=(1.0, 1.0))
    )
    got = one(u8)
    assert int((got == 7).all(axis=-1).sum()) >= side * side


def test_colour_op_parameters_are_checked_with_the_field_named(picture: Tuple[Path, np.ndarray]) -> None:
    root, _ = picture
    base = sluice.Pipeline.image_folder(root).decode()
    for bad, field in [
        (base.color_jitter(hue=0.7), "ops[1].hue"),
        (base.color_jitter(brightness=(1.5, 0.5)), "ops[1].brightness"),
        (base.solarize(300), "ops[1].threshold"),
        (base.posterize(9), "ops[1].bits"),
        (base.gaussian_blur(4), "ops[1].kernel_size"),
        (base.adjust_sharpness(-1.0), "ops[1].sharpness_factor"),
        (base.equalize(p=2.0), "ops[1].p"),
    ]:
        with pytest.raises(sluice.SpecError) as e:
            bad.center_crop(8).batch(1).validate()
        assert e.value.field == field
    with pytest.raises(sluice.SpecError) as e:
        base.random_erasing().center_crop(8).batch(1).validate()
    assert e.value.field == "ops[2]"


def test_every_case_names_a_different_op() -> None:
    names: Dict[str, int] = {}
    for c in CASES:
        names[c[0]] = names.get(c[0], 0) + 1
    assert all(n == 1 for n in names.values())
