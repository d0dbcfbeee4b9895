"""Segmentation masks: each geometric op's mask against ``torchvision.transforms.v2.functional``
on ``tv_tensors.Mask`` with the same parameters, pixel for pixel; the sources (sidecar PNGs,
COCO RLE and polygons, ``gen-images --masks``) and bad masks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, List, Tuple

import numpy as np
import pytest

import sluice
from sluice import _sluice

torch = pytest.importorskip("torch")
tvf = pytest.importorskip("torchvision.transforms.v2.functional")
tv_tensors = pytest.importorskip("torchvision.tv_tensors")
PIL_Image = pytest.importorskip("PIL.Image")

H, W = 48, 64


def class_mask(h: int = H, w: int = W) -> np.ndarray:
    """A mask whose every pixel differs from its neighbours: any index slip shows."""
    y, x = np.mgrid[0:h, 0:w]
    return ((x * 7 + y * 13) % 251 + 1).astype(np.uint8)


def coords_image(h: int = H, w: int = W) -> np.ndarray:
    """R = x, G = y: a crop's window can be read off its pixels."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x, y, (x + y) % 256], axis=-1).astype(np.uint8)


def write_sample(folder: Path, name: str, img: np.ndarray, mask: np.ndarray, fmt: str = "png") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    PIL_Image.fromarray(img).save(folder / f"{name}.{fmt}", **({"quality": 95} if fmt == "jpg" else {}))
    PIL_Image.fromarray(mask, mode="L").save(folder / f"{name}.mask.png")
    sidecar = {"boxes": [[1, 1, 10, 10]], "labels": [1], "mask": f"{name}.mask.png"}
    (folder / f"{name}.json").write_text(json.dumps(sidecar))


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("masks")
    write_sample(root, "a", coords_image(), class_mask())
    return root


@pytest.fixture(scope="module")
def jpeg_picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("masks_jpg")
    write_sample(root, "a", coords_image(), class_mask(), fmt="jpg")
    return root


def run_sluice(root: Path, build: Callable[[sluice.Pipeline], sluice.Pipeline], seed: int = 0) -> sluice.Batch:
    pipe = build(sluice.Pipeline.sidecar(root, masks=True).decode()).batch(1).threads(1).seed(seed)
    (batch,) = list(sluice.Loader(pipe))
    return batch


def theirs(fn: Callable[[Any], Any], out: Tuple[int, int]) -> np.ndarray:
    m = tv_tensors.Mask(torch.from_numpy(class_mask()))
    moved = tvf.center_crop(fn(m), list(out))
    assert isinstance(moved, tv_tensors.Mask)
    return np.asarray(moved.numpy())


def rotated_canvas(angle: float, center: List[float]) -> Tuple[int, int]:
    m = tv_tensors.Mask(torch.zeros(H, W, dtype=torch.uint8))
    h, w = tvf.rotate(m, angle, expand=True, center=center).shape[-2:]
    return int(h), int(w)


#: (name, sluice builder step, torchvision functional on the mask, output size).
CASES: List[Tuple[str, Callable[[sluice.Pipeline], sluice.Pipeline], Callable[[Any], Any], Tuple[int, int]]] = [
    ("horizontal_flip", lambda p: p.random_horizontal_flip(1.0).center_crop((H, W)), tvf.horizontal_flip, (H, W)),
    ("vertical_flip", lambda p: p.random_vertical_flip(1.0).center_crop((H, W)), tvf.vertical_flip, (H, W)),
    ("center_crop", lambda p: p.center_crop((30, 41)), lambda m: m, (30, 41)),
    ("center_crop_padding", lambda p: p.center_crop((60, 70)), lambda m: m, (60, 70)),
    ("resize", lambda p: p.resize(30).center_crop((30, 40)), lambda m: tvf.resize(m, [30]), (30, 40)),
    ("resize_up", lambda p: p.resize(61).center_crop((61, 81)), lambda m: tvf.resize(m, [61]), (61, 81)),
    ("resize_double", lambda p: p.resize(96).center_crop((96, 128)), lambda m: tvf.resize(m, [96]), (96, 128)),
    (
        "pad",
        lambda p: p.pad((1, 2, 3, 4)).center_crop((H + 6, W + 4)),
        lambda m: tvf.pad(m, [1, 2, 3, 4]),
        (H + 6, W + 4),
    ),
    (
        "pad_reflect",
        lambda p: p.pad((5, 2, 3, 4), padding_mode="reflect").center_crop((H + 6, W + 8)),
        lambda m: tvf.pad(m, [5, 2, 3, 4], padding_mode="reflect"),
        (H + 6, W + 8),
    ),
    (
        "random_crop_padding",
        lambda p: p.random_crop((H + 8, W + 8), padding=4),
        lambda m: tvf.pad(m, [4]),
        (H + 8, W + 8),
    ),
    (
        "random_crop_symmetric",
        lambda p: p.random_crop((H + 8, W + 8), padding=4, padding_mode="symmetric"),
        lambda m: tvf.pad(m, [4], padding_mode="symmetric"),
        (H + 8, W + 8),
    ),
    (
        "random_resized_crop_whole",
        lambda p: p.random_resized_crop((20, 30), scale=(1.0, 1.0), ratio=(W / H, W / H)),
        lambda m: tvf.resized_crop(m, 0, 0, H, W, [20, 30]),
        (20, 30),
    ),
    (
        "random_rotation",
        lambda p: p.random_rotation(degrees=(30, 30)).center_crop((H, W)),
        lambda m: tvf.rotate(m, 30.0),
        (H, W),
    ),
    (
        "random_rotation_expand_center",
        lambda p: p.random_rotation(degrees=(40, 40), expand=True, center=(10, 5)).center_crop(
            rotated_canvas(40.0, [10, 5])
        ),
        lambda m: tvf.rotate(m, 40.0, expand=True, center=[10, 5]),
        rotated_canvas(40.0, [10, 5]),
    ),
    (
        "random_rotation_quarter_turn",
        lambda p: p.random_rotation(degrees=(90, 90), expand=True).center_crop((W, H)),
        lambda m: tvf.rotate(m, 90.0, expand=True),
        (W, H),
    ),
    (
        "random_affine",
        lambda p: p.random_affine(degrees=(12, 12), scale=(0.9, 0.9), shear=(8, 8, -4, -4)).center_crop((H, W)),
        lambda m: tvf.affine(m, 12.0, [0, 0], 0.9, [8.0, -4.0]),
        (H, W),
    ),
    (
        "random_affine_bilinear_image",
        lambda p: p.random_affine(
            degrees=(-35, -35), scale=(1.3, 1.3), shear=(-12, -12), interpolation="bilinear"
        ).center_crop((H, W)),
        lambda m: tvf.affine(m, -35.0, [0, 0], 1.3, [-12.0, 0.0]),
        (H, W),
    ),
    (
        "resize_then_flip_then_crop",
        lambda p: p.resize(40).random_horizontal_flip(1.0).random_vertical_flip(1.0).center_crop((30, 30)),
        lambda m: tvf.vertical_flip(tvf.horizontal_flip(tvf.resize(m, [40]))),
        (30, 30),
    ),
]


@pytest.mark.parametrize("name,build,fn,out", CASES, ids=[c[0] for c in CASES])
def test_masks_equal_torchvision(
    picture: Path,
    name: str,
    build: Callable[[sluice.Pipeline], sluice.Pipeline],
    fn: Callable[[Any], Any],
    out: Tuple[int, int],
) -> None:
    b = run_sluice(picture, build)
    ours = np.asarray(b.masks)
    assert ours.dtype == np.uint8 and ours.shape == (1, *out), ours.shape
    want = theirs(fn, out)
    diff = int((ours[0] != want).sum())
    assert diff == 0, f"{name}: {diff} of {want.size} pixels differ"


@pytest.mark.parametrize("size", [(20, 30), (50, 35), (39, 39)])
def test_random_resized_crop_masks_equal_torchvision_on_the_drawn_window(picture: Path, size: Tuple[int, int]) -> None:
    """The window is drawn at random: read it off a run whose output is the window's own
    size (R = x, G = y), then check a run of the same seed resized to ``size``."""
    side = 39  # scale 0.5, ratio 1 of 64x48: round(sqrt(1536)) on both sides
    for seed in range(4):
        same = run_sluice(picture, lambda p: p.random_resized_crop(side, scale=(0.5, 0.5), ratio=(1.0, 1.0)), seed)
        img = np.asarray(same.image)[0]
        left, top = int(img[0, 0, 0]), int(img[0, 0, 1])
        assert (img[:, :, 0] == left + np.arange(side)[None, :]).all(), "the window is not read as it is"
        b = run_sluice(picture, lambda p: p.random_resized_crop(size, scale=(0.5, 0.5), ratio=(1.0, 1.0)), seed)
        m = tv_tensors.Mask(torch.from_numpy(class_mask()))
        want = tvf.resized_crop(m, top, left, side, side, list(size)).numpy()
        assert np.array_equal(np.asarray(b.masks)[0], want), f"seed {seed}: window ({left}, {top})"


@pytest.mark.parametrize(
    "name,build,fn,out",
    [
        ("fused_center_crop", lambda p: p.center_crop((30, 41)), lambda m: m, (30, 41)),
        (
            "fused_random_resized_crop",
            lambda p: p.random_resized_crop((20, 30), scale=(1.0, 1.0), ratio=(W / H, W / H)),
            lambda m: tvf.resized_crop(m, 0, 0, H, W, [20, 30]),
            (20, 30),
        ),
        ("fused_resize", lambda p: p.resize(30).center_crop((30, 40)), lambda m: tvf.resize(m, [30]), (30, 40)),
    ],
)
def test_the_fused_jpeg_decode_moves_masks_the_same(
    jpeg_picture: Path,
    name: str,
    build: Callable[[sluice.Pipeline], sluice.Pipeline],
    fn: Callable[[Any], Any],
    out: Tuple[int, int],
) -> None:
    """The JPEG path decodes only the window, scaled by the DCT; the mask is cut from the
    full-size mask on the same window."""
    b = run_sluice(jpeg_picture, build)
    assert np.array_equal(np.asarray(b.masks)[0], theirs(fn, out)), name


@pytest.mark.parametrize(
    "name,build",
    [
        ("random_perspective", lambda p: p.random_perspective(0.5, p=1.0, interpolation="nearest")),
        ("random_rotation", lambda p: p.random_rotation(25, interpolation="nearest")),
        (
            "random_affine",
            lambda p: p.random_affine(15, translate=(0.1, 0.1), scale=(0.8, 1.1), interpolation="nearest"),
        ),
    ],
)
def test_random_warps_move_the_mask_as_the_nearest_warped_image(
    tmp_path: Path, name: str, build: Callable[[sluice.Pipeline], sluice.Pipeline]
) -> None:
    """Whatever a warp draws, the mask follows the image: with the mask as the image's
    pixels and nearest sampling, they come out equal."""
    m = class_mask()
    write_sample(tmp_path, "a", np.repeat(m[:, :, None], 3, axis=2), m)
    for seed in range(6):
        b = run_sluice(tmp_path, lambda p: build(p).center_crop((H, W)), seed)
        assert np.array_equal(np.asarray(b.masks)[0], np.asarray(b.image)[0, :, :, 0]), f"{name} seed {seed}"


def test_generated_masks_agree_across_sources_and_with_the_boxes(tmp_path: Path) -> None:
    root = tmp_path / "gen"
    _sluice.generate_dataset(str(root), images=6, classes=3, masks=True, texture=0)
    side = json.loads((root / "class_001" / "img_0000004.json").read_text())
    assert side["mask"] == "img_0000004.mask.png" and side["labels"][0] == 2, side

    def first(pipe: sluice.Pipeline) -> sluice.Batch:
        loader = sluice.Loader(pipe.decode().center_crop(600).batch(6).shuffle(False).threads(1))
        (b,) = list(loader)
        return b

    coco = first(sluice.Pipeline.coco(root / "instances.json", root, masks=True))
    sidecar = first(sluice.Pipeline.sidecar(root, masks=True))
    assert coco.masks.shape == (6, 600, 600) and sidecar.masks.shape == (6, 600, 600)
    # COCO lists images by id (image i), the sidecar walk by class folder.
    by_folder = [0, 3, 1, 4, 2, 5]
    assert np.array_equal(coco.masks[by_folder], sidecar.masks), "COCO RLE and the mask PNGs paint the same mask"
    for i in range(6):
        n = int(coco.box_count[i])
        labels = set(coco.box_labels[i, :n].tolist())
        assert set(np.unique(coco.masks[i]).tolist()) == {0} | labels
        x1, y1, x2, y2 = coco.boxes[i, 0].astype(int)
        assert coco.masks[i, y1:y2, x1:x2].any(), "the first shape's mask is under its box"
    # Without masks, nothing changes: no mask field, and the mask PNGs are not samples.
    plain = first(sluice.Pipeline.sidecar(root))
    assert "masks" not in plain and plain.size == 6


def test_coco_polygons_are_painted_by_pixel_centres(tmp_path: Path) -> None:
    PIL_Image.fromarray(np.zeros((6, 8, 3), np.uint8)).save(tmp_path / "a.png")
    coco = {
        "images": [{"id": 1, "file_name": "a.png", "width": 8, "height": 6}],
        "annotations": [
            {
                "id": 1,
                "image_id": 1,
                "bbox": [1, 1, 4, 3],
                "category_id": 3,
                "segmentation": [[1, 1, 5, 1, 5, 4, 1, 4]],
            },
            {
                "id": 2,
                "image_id": 1,
                "bbox": [4, 0, 3, 2],
                "category_id": 9,
                "segmentation": [[4, 0, 7, 0, 7, 2, 4, 2]],
            },
        ],
    }
    (tmp_path / "instances.json").write_text(json.dumps(coco))
    pipe = sluice.Pipeline.coco(tmp_path / "instances.json", tmp_path, masks=True).decode().center_crop((6, 8))
    (b,) = list(sluice.Loader(pipe.batch(1)))
    want = np.zeros((6, 8), np.uint8)
    want[1:4, 1:5] = 3
    want[0:2, 4:7] = 9
    assert np.array_equal(b.masks[0], want), b.masks[0]


def test_a_mask_of_the_wrong_size_fails_its_sample_by_name(tmp_path: Path) -> None:
    write_sample(tmp_path, "a_good", coords_image(), class_mask())
    write_sample(tmp_path, "b_small", coords_image(), class_mask(20, 30))
    pipe = sluice.Pipeline.sidecar(tmp_path, masks=True).decode().center_crop((H, W)).batch(2).shuffle(False)
    with pytest.raises(sluice.SampleError) as e:
        list(sluice.Loader(pipe))
    msg = str(e.value)
    assert "b_small" in msg and "mask" in msg and "30x20" in msg and "64x48" in msg, msg
    (b,) = list(sluice.Loader(pipe.on_error("skip")))
    assert b.size == 1 and b.masks.shape == (1, H, W)


@pytest.mark.parametrize("problem,says", [("missing_field", "names no `mask`"), ("missing_file", "c.mask.png")])
def test_a_missing_mask_fails_its_sample_by_name(tmp_path: Path, problem: str, says: str) -> None:
    write_sample(tmp_path, "c", coords_image(), class_mask())
    if problem == "missing_field":
        (tmp_path / "c.json").write_text(json.dumps({"boxes": [], "labels": []}))
    else:
        (tmp_path / "c.mask.png").unlink()
    pipe = sluice.Pipeline.sidecar(tmp_path, masks=True).decode().center_crop(8).batch(1)
    with pytest.raises(sluice.SampleError) as e:
        list(sluice.Loader(pipe))
    msg = str(e.value)
    assert says in msg and "bad mask" in msg, msg


@pytest.mark.parametrize("level", ["raw", "decoded", "resized"])
def test_a_cached_epoch_gives_the_uncached_masks(tmp_path: Path, level: str) -> None:
    for i in range(3):
        write_sample(tmp_path, f"s{i}", np.roll(coords_image(), 5 * i, axis=1), np.roll(class_mask(), 7 * i, axis=0))
    pipe = sluice.Pipeline.sidecar(tmp_path, masks=True).decode().resize(40)
    pipe = pipe.random_resized_crop(24).random_horizontal_flip().batch(3).shuffle(False)
    plain = sluice.Loader(pipe.seed(2))
    # A cache resize to the same 40 the prefix already has: the same pixels and masks.
    cached = sluice.Loader(pipe.cache("1MB", level=level, resize=40 if level == "resized" else None).seed(2))
    for epoch in range(2):
        (want,), (got,) = list(plain), list(cached)
        assert want.masks.shape == (3, 24, 24) and len(np.unique(want.masks)) > 2
        np.testing.assert_array_equal(got.masks, want.masks, err_msg=f"{level} epoch {epoch}")
        np.testing.assert_array_equal(got.image, want.image, err_msg=f"{level} epoch {epoch}")
    stats = cached.stats()["cache"]
    assert (stats["hits"], stats["misses"]) == (3, 3), stats


def test_torch_batches_carry_the_masks(picture: Path) -> None:
    st = pytest.importorskip("sluice.torch")
    pipe = sluice.Pipeline.sidecar(picture, masks=True).decode().random_resized_crop(32).batch(1)
    (b,) = list(sluice.Loader(pipe, output="torch"))
    assert isinstance(b.masks, torch.Tensor) and b.masks.dtype == torch.uint8 and b.masks.shape == (1, 32, 32)
    assert torch.equal(st.to_device(b, "cpu")["masks"], b.masks)
