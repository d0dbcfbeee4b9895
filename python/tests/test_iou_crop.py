"""``random_iou_crop`` (torchvision v2's RandomIoUCrop) on samples with boxes: for the crop
window sluice drew (read back from the pixels, which encode their own coordinates), the
boxes and labels equal torchvision's ``F.crop`` on ``tv_tensors.BoundingBoxes`` + the
removal of boxes whose centre is outside + ``SanitizeBoundingBoxes``, within 1 px.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Tuple

import numpy as np
import pytest

import sluice

torch = pytest.importorskip("torch")
tvf = pytest.importorskip("torchvision.transforms.v2.functional")
tvt = pytest.importorskip("torchvision.transforms.v2")
tv_tensors = pytest.importorskip("torchvision.tv_tensors")
PIL_Image = pytest.importorskip("PIL.Image")

H, W = 48, 64
#: Inside, crossing the left edge, small, and tall at the right.
BOXES = [[10.0, 8.0, 30.0, 25.0], [-4.0, 20.0, 12.0, 40.0], [40.0, 30.0, 46.5, 35.0], [50.0, 2.0, 63.0, 47.0]]
LABELS = [1, 2, 3, 4]


def coded_image() -> np.ndarray:
    """Pixel (x, y) is ``[4x + 2, 5y + 1, 255]``: any pixel says where it came from, and
    the padding a following ``center_crop`` adds (0) is told apart by its blue."""
    y, x = np.mgrid[0:H, 0:W]
    return np.stack([x * 4 + 2, y * 5 + 1, np.full_like(x, 255)], axis=-1).astype(np.uint8)


def write(root: Path, boxes: List[List[float]], labels: List[int]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    PIL_Image.fromarray(coded_image()).save(root / "a.png")
    (root / "a.json").write_text(json.dumps({"boxes": boxes, "labels": labels}))
    return root


def run(root: Path, seed: int, **args: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """sluice's image, boxes and labels after ``random_iou_crop`` and a center crop (with
    padding) back to H x W."""
    pipe = sluice.Pipeline.sidecar(root).decode().random_iou_crop(**args).center_crop((H, W))
    (batch,) = list(sluice.Loader(pipe.batch(1).threads(1).seed(seed)))
    n = int(batch.box_count[0])
    return np.asarray(batch.image)[0], np.asarray(batch.boxes)[0, :n], np.asarray(batch.box_labels)[0, :n]


def window(img: np.ndarray) -> Tuple[int, int, int, int]:
    """The crop sluice chose (top, left, height, width) in the input, read off the pixels."""
    ys, xs = np.nonzero(img[..., 2] == 255)
    oy, ox = int(ys.min()), int(xs.min())
    ch, cw = int(ys.max()) + 1 - oy, int(xs.max()) + 1 - ox
    assert ch * cw == xs.size, "the crop is not one rectangle"
    r, g, _ = (int(v) for v in img[oy, ox])
    return (g - 1) // 5, (r - 2) // 4, ch, cw


def sanitize(b: Any, labels: Any) -> Tuple[Any, Any]:
    out = tvt.SanitizeBoundingBoxes(min_size=1)({"boxes": tvf.clamp_bounding_boxes(b), "labels": labels})
    return out["boxes"], out["labels"]


def torchvision_boxes(top: int, left: int, ch: int, cw: int) -> Tuple[np.ndarray, np.ndarray]:
    """The input's boxes (clamped and sanitized, as a source's are), cropped as
    RandomIoUCrop's ``transform`` crops them, those with a centre outside zeroed, then
    SanitizeBoundingBoxes, then the center crop back to H x W."""
    b = tv_tensors.BoundingBoxes(torch.tensor(BOXES), format="XYXY", canvas_size=(H, W))
    b, labels = sanitize(b, torch.tensor(LABELS))
    cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
    within = (left < cx) & (cx < left + cw) & (top < cy) & (cy < top + ch)
    cropped = tvf.crop(b, top, left, ch, cw)
    cropped[~within] = 0
    cropped, labels = sanitize(cropped, labels)
    moved, labels = sanitize(tvf.center_crop(cropped, [H, W]), labels)
    return moved.numpy(), labels.numpy()


def test_boxes_match_torchvision_for_the_crop_sluice_drew(tmp_path: Path) -> None:
    root = write(tmp_path / "d", BOXES, LABELS)
    crops = 0
    for seed in range(40):
        img, ours, our_labels = run(root, seed)
        top, left, ch, cw = window(img)
        if (ch, cw) != (H, W):
            crops += 1
            # torchvision's bounds: each side a truncated fraction in [0.3, 1], aspect in [0.5, 2].
            assert ch >= int(0.3 * H) and cw >= int(0.3 * W) and 0.5 <= cw / ch <= 2.0, (seed, ch, cw)
            assert len(ours) >= 1, f"seed {seed}: a chosen crop holds a box centre"
        theirs, their_labels = torchvision_boxes(top, left, ch, cw)
        where = f"seed {seed}, crop top={top} left={left} {ch}x{cw}: {ours} vs {theirs}"
        assert our_labels.tolist() == their_labels.tolist(), where
        assert np.abs(ours - theirs).max(initial=0.0) <= 1.0, where
    assert crops >= 10, f"only {crops} of 40 seeds cropped"


def test_a_threshold_of_one_and_a_sample_without_boxes_leave_the_image(tmp_path: Path) -> None:
    full = coded_image()
    img, boxes, labels = run(write(tmp_path / "one", BOXES, LABELS), 3, sampler_options=[1.0])
    assert np.array_equal(img, full) and labels.tolist() == LABELS
    for seed in range(5):
        img, boxes, _ = run(write(tmp_path / "none", [], []), seed)
        assert np.array_equal(img, full) and boxes.size == 0


def test_the_same_seed_draws_the_same_crop(tmp_path: Path) -> None:
    root = write(tmp_path / "d", BOXES, LABELS)
    a = [window(run(root, s)[0]) for s in range(8)]
    assert a == [window(run(root, s)[0]) for s in range(8)]
    assert len(set(a)) > 2, a


def test_bad_parameters_are_refused_naming_the_field(tmp_path: Path) -> None:
    base = sluice.Pipeline.sidecar(write(tmp_path / "d", BOXES, LABELS)).decode()
    for args, field in [
        ({"min_scale": 0.9, "max_scale": 0.5}, "min_scale"),
        ({"sampler_options": []}, "sampler_options"),
        ({"trials": 0}, "trials"),
    ]:
        with pytest.raises(sluice.SpecError, match=rf"ops\[1\]\.{field}"):
            sluice.Loader(base.random_iou_crop(**args).center_crop(8).batch(1))


def test_the_mask_is_cut_with_the_image(tmp_path: Path) -> None:
    """A mask equal to the red channel stays equal to it, the center crop's padding (0 in
    both) included, whatever window is drawn."""
    root = write(tmp_path / "d", BOXES, LABELS)
    PIL_Image.fromarray(coded_image()[..., 0]).save(root / "a.mask.png")
    (root / "a.json").write_text(json.dumps({"boxes": BOXES, "labels": LABELS, "mask": "a.mask.png"}))
    crops = 0
    for seed in range(12):
        pipe = sluice.Pipeline.sidecar(root, masks=True).decode().random_iou_crop().center_crop((H, W))
        (b,) = list(sluice.Loader(pipe.batch(1).threads(1).seed(seed)))
        img = np.asarray(b.image)[0]
        crops += window(img)[2:] != (H, W)
        assert np.array_equal(np.asarray(b.masks)[0], img[..., 0]), f"seed {seed}"
    assert crops >= 3
