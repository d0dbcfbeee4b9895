"""``augmix`` against ``torchvision.transforms.v2.AugMix``, tested as the other policies are
(test_policy.py): its op table is torchvision's, and each sample's output is one torchvision
could give. The mixing weights are continuous draws, so for one chain of one op the sample
is ``trunc(m0 * image + m1 * op(image))`` with ``m0 + m1 = 1``: for every (op, bin, sign)
torchvision could draw, the weight that fits best is solved for, and one outcome must match.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Tuple

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
    y, x = np.mgrid[0:H, 0:W]
    img = np.stack([(x * 255 // (W - 1)), (y * 255 // (H - 1)), ((x * 7 + y * 13) % 256)], axis=-1)
    img[10:20, 15:30] = [250, 30, 90]
    img = img.astype(np.uint8)
    root = tmp_path_factory.mktemp("augmix") / "train"
    (root / "a").mkdir(parents=True)
    for i in range(SAMPLES):
        PIL_Image.fromarray(img).save(root / "a" / f"x{i:02}.png")
    return root, img


def chw(img: np.ndarray) -> Any:
    return torch.from_numpy(img).permute(2, 0, 1).contiguous()


def hwc(t: Any) -> np.ndarray:
    return np.asarray(t.permute(1, 2, 0).numpy())


def test_op_table_is_torchvisions() -> None:
    """Names and order (the partial space first, as ``all_ops=False`` takes it), the 10-bin
    magnitudes in float32 and the signs."""
    ours = _sluice.policy_space("augmix", 10, H, W)
    space = v2.AugMix()._AUGMENTATION_SPACE
    assert [op for op, _, _ in ours] == list(space)
    assert list(v2.AugMix._PARTIAL_AUGMENTATION_SPACE) == [op for op, _, _ in ours[:9]]
    for (op, mags, signed), (fn, tv_signed) in zip(ours, space.values()):
        theirs = fn(10, H, W)
        assert signed == tv_signed, op
        if theirs is None:
            assert mags is None, op
        else:
            assert mags is not None
            assert np.array_equal(np.asarray(mags, dtype=np.float32), theirs.to(torch.float32).numpy()), op


def outcomes(img: np.ndarray, severity: int) -> List[Tuple[str, np.ndarray]]:
    """Every (op, bin below severity, sign) AugMix could apply, bilinear, fill None."""
    tv = v2.AugMix(severity=severity)
    t = chw(img)
    out = []
    for op, (fn, signed) in tv._AUGMENTATION_SPACE.items():
        mags = fn(10, H, W)
        for b in range(severity) if mags is not None else [None]:
            m = 0.0 if b is None or mags is None else float(mags[b])
            for sign in (1.0, -1.0) if signed and mags is not None else (1.0,):
                res = tv._apply_image_or_video_transform(t, op, m * sign, tv.interpolation, tv._fill)
                out.append((f"{op}({m * sign:g})", hwc(res)))
    return out


def fit(ours: np.ndarray, img: np.ndarray, aug: np.ndarray) -> Tuple[int, float]:
    """The blend weight m1 that best explains ``ours = trunc((1 - m1) * img + m1 * aug)``,
    and the largest difference left (torchvision's float32 mix, truncated)."""
    x, a, o = img.astype(np.float64), aug.astype(np.float64), ours.astype(np.float64)
    d = a - x
    if not d.any():
        return int(np.abs(o - x).max()), 0.0
    m1 = float(np.clip(((o + 0.5 - x) * d).sum() / (d * d).sum(), 0.0, 1.0))
    best = 256
    for m in (m1, m1 - 2e-3, m1 + 2e-3):
        w = np.float32(m)
        mix = np.float32(1.0 - m) * img.astype(np.float32) + w * aug.astype(np.float32)
        best = min(best, int(np.abs(mix.astype(np.uint8).astype(np.int16) - ours.astype(np.int16)).max()))
    return best, m1


def test_one_chain_of_one_op_is_one_of_torchvisions_outcomes(pictures: Tuple[Path, np.ndarray]) -> None:
    root, img = pictures
    pipe = (
        sluice.Pipeline.image_folder(root)
        .decode()
        .augmix(severity=4, mixture_width=1, chain_depth=1)
        .center_crop((H, W))
        .batch(SAMPLES)
        .threads(1)
        .seed(7)
    )
    (batch,) = list(sluice.Loader(pipe))
    cases = outcomes(img, 4)
    weights = []
    for i, ours in enumerate(np.asarray(batch.image)):
        d, m1, label = min((*fit(ours, img, aug), label) for label, aug in cases)
        # A bilinear warp is within 1 of torchvision's (test_ops.py), and the mix scales it.
        assert d <= 1, f"sample {i}: the closest torchvision outcome {label} differs by {d}"
        weights.append(m1)
    # The blend weight is drawn per sample (Beta(1, 1): spread over [0, 1]).
    assert max(weights) - min(weights) > 0.3, weights


def test_augmix_is_deterministic_and_mixes(pictures: Tuple[Path, np.ndarray]) -> None:
    """The default AugMix (3 chains of 1-3 ops) gives the same pixels for any thread
    count, and changes every sample."""
    root, img = pictures

    def run(threads: int) -> np.ndarray:
        pipe = sluice.Pipeline.image_folder(root).decode().augmix().center_crop((H, W)).batch(SAMPLES)
        (batch,) = list(sluice.Loader(pipe.threads(threads).seed(3)))
        return np.asarray(batch.image)

    one = run(1)
    assert np.array_equal(one, run(2))
    assert all(not np.array_equal(o, img) for o in one)


def test_augmix_parameters_are_checked_with_the_field_named(pictures: Tuple[Path, np.ndarray]) -> None:
    root, _ = pictures
    base = sluice.Pipeline.image_folder(root).decode()
    for pipe, field in [
        (base.augmix(severity=0), "ops[1].severity"),
        (base.augmix(severity=11), "ops[1].severity"),
        (base.augmix(mixture_width=0), "ops[1].mixture_width"),
        (base.augmix(alpha=0.0), "ops[1].alpha"),
        (base.augmix(interpolation="bicubic"), "ops[1].interpolation"),
    ]:
        with pytest.raises(sluice.SpecError) as e:
            pipe.center_crop(8).batch(1).validate()
        assert e.value.field == field
