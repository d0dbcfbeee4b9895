"""The augmentation policies (``trivial_augment_wide``, ``rand_augment``, ``auto_augment``)
against ``torchvision.transforms.v2``.

A policy's output depends on its draws, and sluice draws from its own per-sample generator,
not torch's, so the tests check each *branch*: the op tables are torchvision's
``_AUGMENTATION_SPACE`` (names, order, magnitudes, signs), each sub-op at a magnitude gives
the pixels torchvision's dispatch (``_apply_image_or_video_transform``) gives at that
magnitude, and a whole policy's output for each sample is one of the outcomes torchvision
could draw.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import sluice
from sluice import _sluice

torch = pytest.importorskip("torch")
v2 = pytest.importorskip("torchvision.transforms.v2")
PIL_Image = pytest.importorskip("PIL.Image")

H, W = 37, 53
SAMPLES = 12


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, np.ndarray]:
    """``SAMPLES`` copies of one 53x37 PNG (each file a sample with its own draws)."""
    y, x = np.mgrid[0:H, 0:W]
    img = np.stack([(x * 255 // (W - 1)), (y * 255 // (H - 1)), ((x * 7 + y * 13) % 256)], axis=-1)
    img[10:20, 15:30] = [250, 30, 90]
    img = img.astype(np.uint8)
    root = tmp_path_factory.mktemp("policy") / "train"
    (root / "a").mkdir(parents=True)
    for i in range(SAMPLES):
        PIL_Image.fromarray(img).save(root / "a" / f"x{i:02}.png")
    return root, img


def policies() -> List[Tuple[str, Any, int]]:
    """(sluice name, torchvision transform, bins) for each policy."""
    return [
        ("trivial_augment_wide", v2.TrivialAugmentWide(), 31),
        ("rand_augment", v2.RandAugment(), 31),
        ("auto_augment", v2.AutoAugment(), 10),
    ]


def chw(img: np.ndarray) -> Any:
    return torch.from_numpy(img).permute(2, 0, 1).contiguous()


def hwc(t: Any) -> np.ndarray:
    return np.asarray(t.permute(1, 2, 0).numpy())


def max_diff(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


@pytest.mark.parametrize("name,tv,bins", policies(), ids=[p[0] for p in policies()])
def test_op_tables_are_torchvisions(name: str, tv: Any, bins: int) -> None:
    ours = _sluice.policy_space(name, bins, H, W)
    space = tv._AUGMENTATION_SPACE
    assert [op for op, _, _ in ours] == list(space), "op names or order differ"
    for (op, mags, signed), (fn, tv_signed) in zip(ours, space.values()):
        theirs = fn(bins, H, W)
        assert signed == tv_signed, op
        if theirs is None:
            assert mags is None, op
        else:
            assert mags is not None, op
            # Exact: the same float32 values torchvision computes.
            assert np.array_equal(np.asarray(mags, dtype=np.float32), theirs.to(torch.float32).numpy()), op


def branch_cases() -> List[Tuple[str, str, Optional[Sequence[int]]]]:
    return [
        ("trivial_augment_wide", "nearest", None),
        ("trivial_augment_wide", "bilinear", None),
        ("rand_augment", "bilinear", (10, 200, 30)),
        ("auto_augment", "nearest", (5, 6, 7)),
    ]


@pytest.mark.parametrize("name,interpolation,fill", branch_cases())
def test_each_sub_op_at_each_magnitude_is_torchvisions(
    pictures: Tuple[Path, np.ndarray], name: str, interpolation: str, fill: Optional[Sequence[int]]
) -> None:
    """Every op of the space at the first, a middle and the last bin, with both signs, equals
    torchvision's dispatch at the same magnitude (bilinear warps and contrast: within 1, as
    the single ops in test_ops.py)."""
    _, img = pictures
    tv, bins = {p[0]: (p[1], p[2]) for p in policies()}[name]
    tv = type(tv)(interpolation=interpolation, fill=None if fill is None else list(fill))
    t = chw(img)
    for op, mags, signed in _sluice.policy_space(name, bins, H, W):
        values = [0.0] if mags is None else [mags[0], mags[bins // 2], mags[-1], mags[bins // 3]]
        for m in values:
            for sign in (1.0, -1.0) if signed else (1.0,):
                mag = float(np.float32(m)) * sign
                ours = _sluice.policy_op(op, mag, img.tobytes(), W, H, interpolation, None if fill is None else fill)
                ours_img = np.frombuffer(ours, dtype=np.uint8).reshape(H, W, 3)
                theirs = hwc(tv._apply_image_or_video_transform(t, op, mag, tv.interpolation, tv._fill))
                d = max_diff(ours_img, theirs)
                assert d <= 1, f"{name} {op} at {mag} ({interpolation}, fill {fill}): max abs difference {d}"


def run_policy(root: Path, build: Any, threads: int = 1) -> List[np.ndarray]:
    pipe = build(sluice.Pipeline.image_folder(root).decode()).center_crop((H, W)).batch(SAMPLES).threads(threads)
    (batch,) = list(sluice.Loader(pipe.seed(5)))
    return list(np.asarray(batch.image))


def closest(ours: np.ndarray, outcomes: List[Tuple[str, np.ndarray]]) -> Tuple[int, str]:
    return min((max_diff(ours, o), label) for label, o in outcomes)


def outcomes_one_op(tv: Any, name: str, img: np.ndarray, bins: int, magnitudes: Sequence[int]) -> List[Tuple[str, Any]]:
    """Every (op, bin, sign) torchvision could draw, with its pixels."""
    t = chw(img)
    out = []
    for op, (fn, signed) in tv._AUGMENTATION_SPACE.items():
        mags = fn(bins, H, W)
        for b in magnitudes if mags is not None else [None]:
            m = 0.0 if b is None or mags is None else float(mags[b])
            for sign in (1.0, -1.0) if signed and mags is not None else (1.0,):
                res = tv._apply_image_or_video_transform(t, op, m * sign, tv.interpolation, tv._fill)
                out.append((f"{op}({m * sign:g})", hwc(res)))
    return out


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_trivial_augment_wide_is_one_of_torchvisions_outcomes(
    pictures: Tuple[Path, np.ndarray], interpolation: str
) -> None:
    """Two bins: every op x bin x sign torchvision could draw (about 40 outcomes); each
    sample's output is within 1 of one of them, and the samples drew different ops."""
    root, img = pictures
    ours = run_policy(root, lambda p: p.trivial_augment_wide(num_magnitude_bins=2, interpolation=interpolation))
    tv = v2.TrivialAugmentWide(num_magnitude_bins=2, interpolation=interpolation)
    outcomes = outcomes_one_op(tv, "trivial_augment_wide", img, 2, [0, 1])
    matched = set()
    for i, o in enumerate(ours):
        d, label = closest(o, outcomes)
        assert d <= 1, f"sample {i}: the closest torchvision outcome {label} differs by {d}"
        matched.add(label)
    assert len(matched) >= 4, f"12 samples drew only {sorted(matched)}"


def test_rand_augment_is_one_of_torchvisions_outcomes(pictures: Tuple[Path, np.ndarray]) -> None:
    """Two ops at bin 2 of 3: every pair of (op, sign) torchvision could draw."""
    root, img = pictures
    ours = run_policy(root, lambda p: p.rand_augment(num_ops=2, magnitude=2, num_magnitude_bins=3))
    tv = v2.RandAugment(num_ops=2, magnitude=2, num_magnitude_bins=3)
    first = outcomes_one_op(tv, "rand_augment", img, 3, [2])
    outcomes = []
    for label, o in first:
        for label2, o2 in outcomes_one_op(tv, "rand_augment", o, 3, [2]):
            outcomes.append((f"{label} {label2}", o2))
    for i, o in enumerate(ours):
        d, label = closest(o, outcomes)
        assert d <= 1, f"sample {i}: the closest torchvision outcome {label} differs by {d}"


def test_auto_augment_is_one_of_torchvisions_outcomes(pictures: Tuple[Path, np.ndarray]) -> None:
    """ImageNet policy: each sub-policy with each of its ops applied or not, each sign."""
    root, img = pictures
    ours = run_policy(root, lambda p: p.auto_augment("imagenet"))
    tv = v2.AutoAugment()
    t = chw(img)
    outcomes = []
    for sub in tv._policies:
        choices = []
        for op, _, bin_ in sub:
            fn, signed = tv._AUGMENTATION_SPACE[op]
            mags = fn(10, H, W)
            m = 0.0 if mags is None else float(mags[bin_])
            choices.append([None] + [(op, m * s) for s in ((1.0, -1.0) if signed and mags is not None else (1.0,))])
        for a, b in itertools.product(*choices):
            x = t
            for step in (a, b):
                if step is not None:
                    x = tv._apply_image_or_video_transform(x, step[0], step[1], tv.interpolation, tv._fill)
            outcomes.append((f"{a} {b}", hwc(x)))
    for i, o in enumerate(ours):
        d, label = closest(o, outcomes)
        assert d <= 1, f"sample {i}: the closest torchvision outcome {label} differs by {d}"


def test_policies_are_deterministic_for_any_thread_count(pictures: Tuple[Path, np.ndarray]) -> None:
    root, img = pictures
    build = lambda p: p.rand_augment(num_ops=3, interpolation="bilinear").trivial_augment_wide().auto_augment("svhn")  # noqa: E731
    one = run_policy(root, build, threads=1)
    assert np.array_equal(one, run_policy(root, build, threads=1))
    assert np.array_equal(one, run_policy(root, build, threads=2))
    assert any(not np.array_equal(o, img) for o in one)


def test_policy_parameters_are_checked_with_the_field_named(pictures: Tuple[Path, np.ndarray]) -> None:
    root, _ = pictures
    base = sluice.Pipeline.image_folder(root).decode()
    for build, field in [
        (lambda p: p.rand_augment(magnitude=31), "ops[1].magnitude"),
        (lambda p: p.trivial_augment_wide(num_magnitude_bins=1), "ops[1].num_magnitude_bins"),
        (lambda p: p.auto_augment(interpolation="bicubic"), "ops[1].interpolation"),
    ]:
        with pytest.raises(sluice.SpecError) as e:
            build(base).center_crop(8).batch(1).validate()
        assert e.value.field == field
    ops = base.auto_augment("cifar10", fill=3).ops
    assert ops[-1] == {"op": "auto_augment", "policy": "cifar10", "interpolation": "nearest", "fill": [3, 3, 3]}
