"""Samples with boxes: sources (COCO, sidecars, bad input), every geometric op's boxes
against ``torchvision.transforms.v2.functional`` on ``tv_tensors.BoundingBoxes`` with the
same parameters (within 1 px), the pixels under the boxes of the random crops and warps,
batches, ``sluice.torch`` and resume.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

import sluice
from sluice import _sluice

torch = pytest.importorskip("torch")
tvf = pytest.importorskip("torchvision.transforms.v2.functional")
tv_tensors = pytest.importorskip("torchvision.tv_tensors")
PIL_Image = pytest.importorskip("PIL.Image")

H, W = 48, 64
#: Inside, crossing the left edge, small, and one that only a crop or warp may drop.
BOXES = [[10.0, 8.0, 30.0, 25.0], [-4.0, 20.0, 12.0, 40.0], [40.0, 30.0, 46.5, 35.0], [50.0, 2.0, 63.0, 47.0]]
LABELS = [1, 2, 3, 4]


def write_sample(folder: Path, name: str, img: np.ndarray, sidecar: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    PIL_Image.fromarray(img).save(folder / f"{name}.png")
    if sidecar is not None:
        text = sidecar if isinstance(sidecar, str) else json.dumps(sidecar)
        (folder / f"{name}.json").write_text(text)


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 64x48 PNG with four boxes in its sidecar."""
    y, x = np.mgrid[0:H, 0:W]
    img = np.stack([x * 4, y * 5, (x + y) % 256], axis=-1).astype(np.uint8)
    root = tmp_path_factory.mktemp("records")
    write_sample(root, "a", img, {"boxes": BOXES, "labels": LABELS, "label": 9})
    return root


def sanitize(boxes: np.ndarray, labels: np.ndarray, h: int, w: int) -> Tuple[np.ndarray, np.ndarray]:
    """torchvision's ClampBoundingBoxes + SanitizeBoundingBoxes(min_size=1)."""
    b = boxes.copy()
    b[:, 0::2] = b[:, 0::2].clip(0, w)
    b[:, 1::2] = b[:, 1::2].clip(0, h)
    keep = ((b[:, 2] - b[:, 0]) >= 1) & ((b[:, 3] - b[:, 1]) >= 1)
    return b[keep], labels[keep]


def run_sluice(root: Path, build: Callable[[sluice.Pipeline], sluice.Pipeline]) -> Tuple[np.ndarray, np.ndarray]:
    pipe = build(sluice.Pipeline.sidecar(root).decode()).batch(1).threads(1)
    (batch,) = list(sluice.Loader(pipe))
    n = int(batch.box_count[0])
    return np.asarray(batch.boxes)[0, :n], np.asarray(batch.box_labels)[0, :n]


def run_torchvision(fn: Callable[[Any], Any], out: Tuple[int, int]) -> Tuple[np.ndarray, np.ndarray]:
    b = tv_tensors.BoundingBoxes(torch.tensor(BOXES), format="XYXY", canvas_size=(H, W))
    b = tvf.clamp_bounding_boxes(b)
    b, labels = sanitize(b.numpy(), np.array(LABELS), H, W)
    b = tv_tensors.BoundingBoxes(torch.tensor(b), format="XYXY", canvas_size=(H, W))
    moved = tvf.center_crop(fn(b), list(out))
    return sanitize(moved.numpy(), labels, *out)


def rotated_canvas(angle: float, center: List[float]) -> Tuple[int, int]:
    b = tv_tensors.BoundingBoxes(torch.zeros(1, 4), format="XYXY", canvas_size=(H, W))
    h, w = tvf.rotate(b, angle, expand=True, center=center).canvas_size
    return int(h), int(w)


#: (name, sluice builder step, torchvision functional on the boxes, output size).
CASES: List[Tuple[str, Callable[[sluice.Pipeline], sluice.Pipeline], Callable[[Any], Any], Tuple[int, int]]] = [
    ("horizontal_flip", lambda p: p.random_horizontal_flip(1.0).center_crop((H, W)), tvf.horizontal_flip, (H, W)),
    ("vertical_flip", lambda p: p.random_vertical_flip(1.0).center_crop((H, W)), tvf.vertical_flip, (H, W)),
    ("center_crop", lambda p: p.center_crop((30, 41)), lambda b: b, (30, 41)),
    ("center_crop_padding", lambda p: p.center_crop((60, 70)), lambda b: b, (60, 70)),
    ("resize", lambda p: p.resize(30).center_crop((30, 40)), lambda b: tvf.resize(b, [30]), (30, 40)),
    (
        "resize_then_crop",
        lambda p: p.resize(24).center_crop((20, 20)),
        lambda b: tvf.resize(b, [24]),
        (20, 20),
    ),
    (
        "pad",
        lambda p: p.pad((1, 2, 3, 4)).center_crop((H + 6, W + 4)),
        lambda b: tvf.pad(b, [1, 2, 3, 4]),
        (H + 6, W + 4),
    ),
    (
        "random_crop_padding",
        lambda p: p.random_crop((H + 8, W + 8), padding=4),
        lambda b: tvf.pad(b, [4]),
        (H + 8, W + 8),
    ),
    (
        # The fused crop-window decode: the whole image, resized to 20x30.
        "random_resized_crop",
        lambda p: p.random_resized_crop((20, 30), scale=(1.0, 1.0), ratio=(W / H, W / H)),
        lambda b: tvf.resized_crop(b, 0, 0, H, W, [20, 30]),
        (20, 30),
    ),
    (
        "random_rotation",
        lambda p: p.random_rotation(degrees=(30, 30)).center_crop((H, W)),
        lambda b: tvf.rotate(b, 30.0),
        (H, W),
    ),
    (
        "random_rotation_expand_center",
        lambda p: p.random_rotation(degrees=(40, 40), expand=True, center=(10, 5)).center_crop(
            rotated_canvas(40.0, [10, 5])
        ),
        lambda b: tvf.rotate(b, 40.0, expand=True, center=[10, 5]),
        rotated_canvas(40.0, [10, 5]),
    ),
    (
        "random_rotation_quarter_turn",
        lambda p: p.random_rotation(degrees=(90, 90), expand=True).center_crop((W, H)),
        lambda b: tvf.rotate(b, 90.0, expand=True),
        (W, H),
    ),
    (
        "random_affine",
        lambda p: p.random_affine(degrees=(12, 12), scale=(0.9, 0.9), shear=(8, 8, -4, -4)).center_crop((H, W)),
        lambda b: tvf.affine(b, 12.0, [0, 0], 0.9, [8.0, -4.0]),
        (H, W),
    ),
    (
        "random_affine_scale_up",
        lambda p: p.random_affine(degrees=(-35, -35), scale=(1.3, 1.3), shear=(-12, -12)).center_crop((H, W)),
        lambda b: tvf.affine(b, -35.0, [0, 0], 1.3, [-12.0, 0.0]),
        (H, W),
    ),
]


@pytest.mark.parametrize("name,build,fn,out", CASES, ids=[c[0] for c in CASES])
def test_boxes_match_torchvision(
    picture: Path,
    name: str,
    build: Callable[[sluice.Pipeline], sluice.Pipeline],
    fn: Callable[[Any], Any],
    out: Tuple[int, int],
) -> None:
    ours, our_labels = run_sluice(picture, build)
    theirs, their_labels = run_torchvision(fn, out)
    assert our_labels.tolist() == their_labels.tolist(), f"{name}: {ours} vs {theirs}"
    assert np.abs(ours - theirs).max(initial=0.0) <= 1.0, f"{name}: {ours} vs {theirs}"


def white_rect_dataset(root: Path, fmt: str) -> List[float]:
    """A black 160x120 image with a white rectangle, its box in the sidecar."""
    img = np.zeros((120, 160, 3), np.uint8)
    box = [50, 30, 110, 90]
    img[box[1] : box[3], box[0] : box[2]] = 255
    root.mkdir(parents=True, exist_ok=True)
    PIL_Image.fromarray(img).save(root / f"a.{fmt}", **({"quality": 95} if fmt == "jpg" else {}))
    (root / "a.json").write_text(json.dumps({"boxes": [box], "labels": [1]}))
    return [float(v) for v in box]


@pytest.mark.parametrize("fmt", ["png", "jpg"])
@pytest.mark.parametrize(
    "name,build",
    [
        ("random_resized_crop", lambda p: p.random_resized_crop(64, scale=(0.4, 1.0))),
        ("flip_then_random_resized_crop", lambda p: p.random_horizontal_flip(0.5).random_resized_crop(64)),
        ("random_crop", lambda p: p.random_crop(100, padding=10).random_vertical_flip(0.5)),
        ("random_rotation", lambda p: p.random_rotation(25).center_crop(100)),
        ("random_affine", lambda p: p.random_affine(15, translate=(0.1, 0.1), scale=(0.8, 1.1)).center_crop(100)),
        ("random_perspective", lambda p: p.random_perspective(0.5, p=1.0).center_crop(100)),
    ],
)
def test_random_ops_keep_the_box_on_the_pixels(
    tmp_path: Path, fmt: str, name: str, build: Callable[[sluice.Pipeline], sluice.Pipeline]
) -> None:
    """Whatever each random op draws, the box encloses the white pixels it moved (the
    JPEG path decodes only the crop window, scaled by the DCT)."""
    white_rect_dataset(tmp_path / "d", fmt)
    checked = 0
    for seed in range(12):
        pipe = build(sluice.Pipeline.sidecar(tmp_path / "d").decode()).batch(1).threads(1).seed(seed)
        (batch,) = list(sluice.Loader(pipe))
        img = np.asarray(batch.image)[0].max(axis=-1)
        ys, xs = np.nonzero(img > 128)
        if int(batch.box_count[0]) == 0:
            assert xs.size < 8, f"{name} seed {seed}: the box was dropped but {xs.size} white pixels remain"
            continue
        box = np.asarray(batch.boxes)[0, 0]
        white = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)
        # Warps blur an edge over a pixel (bilinear) and the enclosing box of a rotated
        # rectangle touches it only at its corners: 2 px.
        tol = 2.0 if name in ("random_rotation", "random_affine", "random_perspective") or fmt == "jpg" else 1.0
        assert np.abs(box - white).max() <= tol, f"{name} seed {seed}: box {box} vs white pixels {white}"
        checked += 1
    assert checked >= 6


def test_coco_and_sidecar_sources_read_the_generated_boxes(tmp_path: Path) -> None:
    root = tmp_path / "gen"
    _sluice.generate_dataset(str(root), images=6, classes=1, boxes=True, texture=0)
    coco = json.loads((root / "instances.json").read_text())
    assert len(coco["images"]) == 6 and coco["annotations"]
    side = json.loads((root / "class_000" / "img_0000003.json").read_text())

    # A 600x600 centre crop pads every image (440-560 a side): boxes shift by the padding.
    def batches(pipe: sluice.Pipeline) -> List[sluice.Batch]:
        return list(sluice.Loader(pipe.decode().center_crop(600).batch(6).shuffle(False).threads(1)))

    for pipe in (sluice.Pipeline.coco(root / "instances.json", root), sluice.Pipeline.sidecar(root)):
        (b,) = batches(pipe)
        assert b.boxes.dtype == np.float32 and b.box_labels.dtype == np.int64 and b.box_count.dtype == np.int32
        assert b.boxes.shape == (6, int(b.box_count.max()), 4)
        info = coco["images"][3]
        dx, dy = (600 - info["width"]) // 2, (600 - info["height"]) // 2
        n = int(b.box_count[3])
        want = np.array(side["boxes"], np.float32) + [dx, dy, dx, dy]
        np.testing.assert_allclose(b.boxes[3, :n], want)
        assert b.box_labels[3, :n].tolist() == side["labels"]
        assert (b.box_labels[3, n:] == -1).all() and (b.boxes[3, n:] == 0).all()


def pack_shard(root: Path, shard: Path) -> None:
    """The generated folder's samples (image, sidecar, mask) as members of one WebDataset
    shard, in the folder source's order."""
    with tarfile.open(shard, "w") as tar:
        for image in sorted((root / "class_000").glob("*.jpg")):
            for suffix in (".jpg", ".json", ".mask.png"):
                member = image.with_name(image.stem + suffix)
                if member.exists():
                    tar.add(member, arcname=f"class_000/{member.name}")


def test_a_tar_with_sidecars_yields_the_folder_sources_boxes_and_masks(tmp_path: Path) -> None:
    root = tmp_path / "gen"
    _sluice.generate_dataset(str(root), images=6, classes=1, masks=True, texture=0)
    shard = tmp_path / "shard-000.tar"
    pack_shard(root, shard)

    def batches(pipe: sluice.Pipeline) -> List[sluice.Batch]:
        return list(sluice.Loader(pipe.decode().center_crop(600).batch(3).shuffle(False).threads(1)))

    folder = batches(sluice.Pipeline.sidecar(root, masks=True))
    tar = batches(sluice.Pipeline.tar(shard, sidecars=True, masks=True))
    assert len(folder) == len(tar) == 2
    for f, t in zip(folder, tar):
        for field in ("image", "label", "boxes", "box_labels", "box_count", "masks"):
            np.testing.assert_array_equal(np.asarray(t[field]), np.asarray(f[field]), err_msg=field)
    assert sum(int(b.box_count.sum()) for b in tar) > 0
    # The shard without `sidecars` is images only.
    assert all("boxes" not in b for b in batches(sluice.Pipeline.tar(shard)))


def test_a_bad_tar_sidecar_fails_its_sample_naming_shard_and_member(tmp_path: Path) -> None:
    png = io.BytesIO()
    PIL_Image.fromarray(np.full((20, 30, 3), 100, np.uint8)).save(png, format="PNG")
    shard = tmp_path / "bad.tar"
    with tarfile.open(shard, "w") as tar:
        for name, data in (("a.png", png.getvalue()), ("a.json", b'{"boxes": [[1, 2, 3, 4]')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    pipe = sluice.Pipeline.tar(shard, sidecars=True).decode().center_crop((20, 30)).batch(1)
    with pytest.raises(sluice.SampleError) as e:
        list(sluice.Loader(pipe))
    msg = str(e.value)
    assert f"{shard}:a.json" in msg and "not a boxes sidecar" in msg, msg
    with pytest.raises(ValueError, match="sidecars = true"):
        sluice.Loader(sluice.Pipeline.tar(shard, masks=True).decode().center_crop(8).batch(1))


def bad_folder(root: Path) -> None:
    img = np.full((20, 30, 3), 100, np.uint8)
    write_sample(root, "a_good", img, {"boxes": [[-5, 2, 40, 10], [3, 3, 3.5, 9]], "labels": [1, 2]})
    write_sample(root, "b_malformed", img, '{"boxes": [[1, 2, 3, 4]')
    write_sample(root, "c_infinite", img, '{"boxes": [[1, 2, 1e39, 4]], "labels": [0]}')
    write_sample(root, "d_missing", img, None)
    write_sample(root, "e_many", img, {"boxes": [[0, 0, 5, 5]] * 50, "labels": [0] * 50})
    write_sample(root, "f_inverted", img, {"boxes": [[9, 0, 5, 5]], "labels": [0]})


@pytest.mark.parametrize(
    "name,says",
    [
        ("b_malformed", "not a boxes sidecar"),
        ("c_infinite", "finite"),
        ("d_missing", "d_missing.json"),
        ("e_many", "limits.max_boxes"),
        ("f_inverted", "x2 < x1"),
    ],
)
def test_a_bad_sidecar_fails_its_sample_by_name(tmp_path: Path, name: str, says: str) -> None:
    bad_folder(tmp_path)
    for other in tmp_path.glob("*.png"):
        if other.stem not in ("a_good", name):
            other.unlink()
    pipe = sluice.Pipeline.sidecar(tmp_path).decode().center_crop((20, 30)).batch(4).limits(max_boxes=10)
    with pytest.raises(sluice.SampleError) as e:
        list(sluice.Loader(pipe))
    msg = str(e.value)
    assert name in msg and says in msg and "bad boxes" in msg, msg


def test_bad_samples_are_skipped_and_outside_boxes_clamped(tmp_path: Path) -> None:
    bad_folder(tmp_path)
    pipe = sluice.Pipeline.sidecar(tmp_path).decode().center_crop((20, 30)).batch(8).on_error("skip")
    loader = sluice.Loader(pipe.limits(max_boxes=10).shuffle(False))
    (b,) = list(loader)
    assert b.size == 1
    # Clamped to the 30x20 image; the half-pixel-wide box dropped with its label.
    assert b.boxes.tolist() == [[[0.0, 2.0, 30.0, 10.0]]]
    assert b.box_labels.tolist() == [[1]] and b.box_count.tolist() == [1]


def test_a_coco_file_that_is_not_coco_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "instances.json").write_text('{"images": [{"id": 1}]}')
    with pytest.raises(sluice.SluiceError, match="instances.json"):
        sluice.Loader(sluice.Pipeline.coco(tmp_path / "instances.json", tmp_path).decode().center_crop(8).batch(1))


def test_policies_are_refused_with_boxes(picture: Path) -> None:
    base = sluice.Pipeline.sidecar(picture).decode()
    with pytest.raises(sluice.SpecError, match=r"ops\[1\].*trivial_augment_wide"):
        sluice.Loader(base.trivial_augment_wide().center_crop(8).batch(1))


def test_a_cached_epoch_keeps_the_boxes(picture: Path) -> None:
    pipe = sluice.Pipeline.sidecar(picture).decode().resize(40).random_resized_crop(24).random_horizontal_flip()
    plain = sluice.Loader(pipe.batch(1).seed(2))
    cached = sluice.Loader(pipe.cache("1MB", level="decoded").batch(1).seed(2))
    for _ in range(2):
        want, got = boxes_of(list(plain)), boxes_of(list(cached))
        assert got == want and want[0][next(iter(want[0]))], (got, want)
    assert cached.stats()["cache"]["hits"] == 1


def test_image_sources_have_no_box_fields(picture: Path, tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    PIL_Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "c" / "x.png")
    (b,) = list(sluice.Loader(sluice.Pipeline.image_folder(tmp_path).decode().center_crop(8).batch(1)))
    assert "boxes" not in b and b.weight is None


def boxes_of(batches: List[sluice.Batch]) -> List[Dict[int, List[List[float]]]]:
    out = []
    for b in batches:
        n = b.box_count.tolist()
        out.append({int(k): b.boxes[i, : n[i]].tolist() for i, k in enumerate(b.key.tolist())})
    return out


def test_state_dict_resumes_boxes_exactly(tmp_path: Path) -> None:
    root = tmp_path / "gen"
    _sluice.generate_dataset(str(root), images=12, classes=2, boxes=True, texture=0)
    pipe = sluice.Pipeline.sidecar(root).decode().random_resized_crop(48).random_horizontal_flip().batch(4).seed(3)
    whole = boxes_of(list(sluice.Loader(pipe)))
    a = sluice.Loader(pipe)
    it = iter(a)
    first = boxes_of([next(it)])
    state = a.state_dict()
    b = sluice.Loader(pipe)
    b.load_state_dict(state)
    assert first + boxes_of(list(b)) == whole


def test_torch_batches_carry_the_boxes(tmp_path: Path) -> None:
    st = pytest.importorskip("sluice.torch")
    root = tmp_path / "gen"
    _sluice.generate_dataset(str(root), images=4, classes=1, boxes=True, texture=0)
    pipe = sluice.Pipeline.coco(root / "instances.json", root).decode().random_resized_crop(32).batch(4)
    (b,) = list(sluice.Loader(pipe, output="torch"))
    assert isinstance(b.boxes, torch.Tensor) and b.boxes.dtype == torch.float32
    moved = st.to_device(b, "cpu")
    assert torch.equal(moved["boxes"], b.boxes) and torch.equal(moved["box_count"], b.box_count)
    assert moved["box_labels"].dtype == torch.int64
