"""The pipeline builder: a Python mirror of sluice's pipeline spec.

A :class:`Pipeline` is immutable; every method returns a new one::

    pipe = (
        sluice.Pipeline.image_folder("data/train")
        .decode()
        .random_resized_crop(224)
        .random_horizontal_flip()
        .batch(256)
    )

It holds the spec as plain data. Parsing and validation happen in Rust (the same code the
CLI and the service use), so an invalid spec raises :class:`sluice.SpecError` whose
``field`` names what to fix (``"ops[1].size"``, ``"batch.size"``).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import _sluice
from .errors import SpecError

__all__ = ["Pipeline", "IMAGENET_MEAN", "IMAGENET_STD", "PathLike", "Size", "Span", "MapFn", "MapBatchFn"]

#: ImageNet channel means in [0, 1] units (RGB), torchvision's defaults.
IMAGENET_MEAN: Tuple[float, float, float] = (0.485, 0.456, 0.406)
#: ImageNet channel standard deviations in [0, 1] units (RGB).
IMAGENET_STD: Tuple[float, float, float] = (0.229, 0.224, 0.225)

PathLike = Union[str, "os.PathLike[str]"]
#: An output size: one side (square) or ``(height, width)``.
Size = Union[int, Sequence[int]]
#: A number or a ``(min, max)`` pair, as torchvision's ColorJitter and GaussianBlur take them.
Span = Union[float, Sequence[float]]


#: A fill colour: one value for every channel or ``(r, g, b)``, each in 0..=255.
Fill = Union[int, Sequence[int]]
#: Padding as torchvision takes it: one value for every side, ``(left/right, top/bottom)``
#: or ``(left, top, right, bottom)``.
Padding = Union[int, Sequence[int]]


def _fill(fill: Fill) -> List[int]:
    if isinstance(fill, (list, tuple)):
        return [int(v) for v in fill] * (3 if len(fill) == 1 else 1)
    return [int(fill)] * 3  # type: ignore[arg-type]


def _policy_args(interpolation: str, fill: Optional[Fill], **args: Any) -> Dict[str, Any]:
    """A policy's arguments; ``fill`` only when given (``None`` is torchvision's default)."""
    args["interpolation"] = interpolation
    if fill is not None:
        args["fill"] = _fill(fill)
    return args


def _range(value: Union[float, Sequence[float]]) -> List[float]:
    """torchvision's ``degrees``: ``d`` means ``(-d, d)``."""
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    return [-float(value), float(value)]  # type: ignore[arg-type]


def _padding(padding: Padding) -> List[int]:
    """``[left, top, right, bottom]`` from torchvision's 1-, 2- or 4-value padding."""
    if isinstance(padding, (list, tuple)):
        p = [int(v) for v in padding]
        if len(p) == 1:
            return p * 4
        if len(p) == 2:
            return p * 2
        return p
    return [int(padding)] * 4  # type: ignore[arg-type]


#: A ``map`` function: ``fn(image, sample) -> image`` (see :meth:`Pipeline.map`).
MapFn = Callable[[Any, Any], Any]
#: A ``map_batch`` function: ``fn(batch, info) -> batch`` (see :meth:`Pipeline.map_batch`).
MapBatchFn = Callable[[Dict[str, Any], Any], Dict[str, Any]]


def _map_name(fn: Callable[..., Any], field: str = "ops.fn", what: str = "map") -> str:
    """``module:qualname`` of ``fn``, checked to import back to ``fn`` itself."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    shown = f"{module}:{qualname}" if module and qualname else repr(fn)
    if not module or not qualname or "<" in qualname:
        raise SpecError(
            f"{what}: {shown} is a lambda, a closure or a function defined inside another one; {what} needs a function "
            "importable by name (defined at the top level of a module), because sluice runs it in worker processes",
            field=field,
        )
    target: Any = sys.modules.get(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if target is not fn:
        raise SpecError(
            f"{what}: {shown} is not importable: `{module}` has no `{qualname}` that is this function", field=field
        )
    return f"{module}:{qualname}"


def _path(p: PathLike) -> str:
    """An absolute path string, so a spec means the same whatever the working directory.
    A URL (``s3://bucket/prefix``) is kept as it is."""
    s = os.fspath(p)
    if isinstance(s, str) and "://" in s:
        return s
    return os.path.abspath(s)


def _size(size: Size) -> Union[int, List[int]]:
    if isinstance(size, (list, tuple)):
        return list(size)
    return size  # type: ignore[return-value]


def _resample(interpolation: str, antialias: bool) -> Dict[str, Any]:
    """A resize's ``interpolation`` and ``antialias``, left out of the spec at torchvision's
    defaults (bilinear, antialiased) so a spec that does not name them stays as it was."""
    args: Dict[str, Any] = {}
    if interpolation != "bilinear":
        args["interpolation"] = interpolation
    if not antialias:
        args["antialias"] = False
    return args


class Pipeline:
    """An immutable description of a sluice input pipeline (source, storage, ops, shuffle,
    batch, prefetch, threads, seed, error policy).

    Build one with :meth:`image_folder`, :meth:`file_list` or :meth:`tar`, chain op and
    option methods, and hand it to :class:`sluice.Loader`. Serialise it with
    :meth:`to_json`, :meth:`to_toml` or :meth:`save`; read it back with :meth:`from_json`,
    :meth:`from_toml`, :meth:`load` or :meth:`from_dict`.
    """

    __slots__ = ("_spec",)

    def __init__(self, spec: Optional[Mapping[str, Any]] = None) -> None:
        """Wraps a spec mapping as given (not validated yet; see :meth:`validate`).
        Prefer the source constructors :meth:`image_folder`, :meth:`file_list`, :meth:`tar`."""
        self._spec: Dict[str, Any] = copy.deepcopy(dict(spec)) if spec is not None else {"ops": []}
        self._spec.setdefault("ops", [])

    # ---- sources -------------------------------------------------------------------------

    @classmethod
    def image_folder(cls, root: PathLike) -> "Pipeline":
        """A ``root/<class>/<image>`` tree: classes sorted by name get labels 0..n.
        ``root`` may be an object-storage prefix, ``s3://bucket/prefix`` (or ``az://``, ``gs://``,
        ``http(s)://`` from a WebDAV server; docs/storage.md)."""
        return cls({"source": {"kind": "image_folder", "root": _path(root)}, "ops": []})

    @classmethod
    def file_list(cls, path: PathLike, root: Optional[PathLike] = None) -> "Pipeline":
        """A text file with one sample per line, ``path`` or ``path <label>``. Relative
        paths are taken from ``root`` (default: the list's own folder)."""
        source: Dict[str, Any] = {"kind": "file_list", "path": _path(path)}
        if root is not None:
            source["root"] = _path(root)
        return cls({"source": source, "ops": []})

    @classmethod
    def tar(
        cls,
        shards: Union[PathLike, Iterable[PathLike]],
        sidecars: bool = False,
        masks: bool = False,
    ) -> "Pipeline":
        """WebDataset-style tar shards: members ``<name>.jpg|jpeg|png`` with an optional
        ``<name>.cls`` holding the integer label. One path or a list of paths. With
        ``sidecars``, each image's ``<name>.json`` member holds its boxes, as for
        :meth:`sidecar`, and batches gain ``boxes``, ``box_labels`` and ``box_count``; with
        ``masks`` (needs ``sidecars``), also ``masks``, read from the PNG member each
        sidecar names (docs/records.md)."""
        if isinstance(shards, (str, os.PathLike)):
            shards = [shards]
        source: Dict[str, Any] = {"kind": "tar", "shards": [_path(s) for s in shards]}
        if sidecars:
            source["sidecars"] = True
        if masks:
            source["masks"] = True
        return cls({"source": source, "ops": []})

    @classmethod
    def mix(cls, sources: Sequence["Pipeline"], weights: Sequence[float]) -> "Pipeline":
        """Several sources drawn by weight: every batch holds them in proportion to
        ``weights`` (relative; ±1 sample), in an order fixed by the seed; an epoch ends when
        the first source runs out. ``sources`` are pipelines made by the source
        constructors alone (chain the ops after ``mix``)::

            Pipeline.mix([Pipeline.image_folder("a"), Pipeline.tar("b.tar")], weights=[0.7, 0.3])

        A checkpoint taken under other weights finishes its epoch with them; the next epoch
        uses these (docs/sharding.md)."""
        if len(sources) != len(weights):
            raise ValueError(f"mix: {len(sources)} sources but {len(weights)} weights; give one weight per source")
        mixed: List[Dict[str, Any]] = []
        for i, (p, w) in enumerate(zip(sources, weights)):
            if not isinstance(p, Pipeline) or set(p._spec) - {"source", "ops"} or p._spec["ops"]:
                raise ValueError(f"mix: source {i} must be a bare source pipeline (Pipeline.image_folder/...), no ops")
            mixed.append({**copy.deepcopy(p._spec["source"]), "weight": float(w)})
        return cls({"source": {"kind": "mix", "sources": mixed}, "ops": []})

    @classmethod
    def parquet(
        cls,
        path: PathLike,
        image_column: str = "image",
        label_column: Optional[str] = None,
    ) -> "Pipeline":
        """Parquet files, one sample per row (the Hugging Face image-dataset layout).
        ``path`` is a ``.parquet`` file, a folder of them, or ``s3://bucket/prefix``.
        ``image_column`` is binary or a struct ``{bytes, path}``; ``label_column`` an
        integer column (default: ``label`` when the files have one). docs/storage.md."""
        source: Dict[str, Any] = {"kind": "parquet", "path": _path(path), "image_column": image_column}
        if label_column is not None:
            source["label_column"] = label_column
        return cls({"source": source, "ops": []})

    @classmethod
    def coco(cls, annotations: PathLike, images: PathLike, masks: bool = False) -> "Pipeline":
        """COCO-style detection: an ``instances_*.json`` and the folder of its images.
        Batches gain ``boxes``, ``box_labels`` (the ``category_id``) and ``box_count``;
        with ``masks``, also ``masks``: each image's ``segmentation``s painted as a
        class-id mask (docs/records.md)."""
        source: Dict[str, Any] = {"kind": "coco", "annotations": _path(annotations), "images": _path(images)}
        if masks:
            source["masks"] = True
        return cls({"source": source, "ops": []})

    @classmethod
    def sidecar(cls, root: PathLike, masks: bool = False) -> "Pipeline":
        """A folder of images, each with a JSON sidecar of the same stem (``0001.jpg`` +
        ``0001.json`` holding ``{"boxes": [[x1, y1, x2, y2], ...], "labels": [...]}``).
        Batches gain ``boxes``, ``box_labels`` and ``box_count``; with ``masks``, also
        ``masks``, read from the PNG each sidecar names (``"mask": "0001.mask.png"``)
        (docs/records.md)."""
        source: Dict[str, Any] = {"kind": "sidecar", "root": _path(root)}
        if masks:
            source["masks"] = True
        return cls({"source": source, "ops": []})

    # ---- (de)serialisation ---------------------------------------------------------------

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> "Pipeline":
        """A pipeline from a spec mapping (as :meth:`to_dict` returns). Validated when used."""
        if not isinstance(spec, Mapping):
            raise TypeError(f"a pipeline spec is a mapping, not {type(spec).__name__}")
        return cls(spec)

    @classmethod
    def from_json(cls, text: str) -> "Pipeline":
        """Parses and validates a JSON spec."""
        return cls(json.loads(_sluice.spec_canonical_json(text)))

    @classmethod
    def from_toml(cls, text: str) -> "Pipeline":
        """Parses and validates a TOML spec."""
        return cls(json.loads(_sluice.spec_toml_to_json(text)))

    @classmethod
    def load(cls, path: PathLike) -> "Pipeline":
        """Reads a ``.toml`` or ``.json`` spec file. Relative source paths in it are taken
        from the file's folder."""
        return cls(json.loads(_sluice.spec_load_file(os.fspath(path))))

    def to_json(self) -> str:
        """The spec as canonical JSON (validated, defaults filled in)."""
        return _sluice.spec_canonical_json(self._raw_json())

    def to_toml(self) -> str:
        """The spec as TOML (validated, defaults filled in)."""
        return _sluice.spec_json_to_toml(self._raw_json())

    def to_dict(self) -> Dict[str, Any]:
        """The spec as a plain dict (validated, defaults filled in). ``Pipeline.from_dict``
        of it gives an equal pipeline."""
        spec: Dict[str, Any] = json.loads(self.to_json())
        return spec

    def save(self, path: PathLike) -> None:
        """Writes the spec to ``path``, TOML or JSON by its extension."""
        p = os.fspath(path)
        ext = os.path.splitext(p)[1].lower()
        if ext == ".toml":
            text = self.to_toml()
        elif ext == ".json":
            text = self.to_json() + "\n"
        else:
            raise SpecError(f"{p}: a spec file must end in .toml or .json", field="<file>")
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)

    def validate(self) -> "Pipeline":
        """Checks the spec in Rust; raises :class:`sluice.SpecError` naming the field.
        Returns ``self`` so it can end a chain."""
        self.to_json()
        return self

    def _raw_json(self) -> str:
        for field, hint in (
            ("source", "start from Pipeline.image_folder/file_list/tar"),
            ("batch", "call .batch(size)"),
        ):
            if field not in self._spec:
                raise SpecError(
                    f"invalid pipeline spec at `{field}`: missing ({hint})", field=field, reason=f"missing ({hint})"
                )
        try:
            return json.dumps(self._spec)
        except (TypeError, ValueError) as e:
            raise SpecError(f"the pipeline spec holds a value JSON cannot express: {e}", field="<spec>") from e

    # ---- building ------------------------------------------------------------------------

    def _with(self, **changes: Any) -> "Pipeline":
        spec = copy.deepcopy(self._spec)
        spec.update(changes)
        return Pipeline(spec)

    def _op(self, op: str, **args: Any) -> "Pipeline":
        spec = copy.deepcopy(self._spec)
        spec["ops"].append({"op": op, **args})
        return Pipeline(spec)

    def decode(self) -> "Pipeline":
        """Decodes JPEG (libjpeg-turbo) or PNG to RGB u8. Must be the first op; fused with a
        following ``random_resized_crop`` so only the crop window is decoded (and, with
        the entropy index, only the crop's part of the file: see :meth:`entropy_index`)."""
        return self._op("decode")

    def entropy_index(
        self,
        enabled: bool = True,
        budget_mb: Optional[int] = None,
        spacing: Optional[int] = None,
        dir: Optional[PathLike] = None,
    ) -> "Pipeline":
        """Turns the entropy index on or off (off by default: see docs/entropy-index.md for
        what it costs and gains today). With it, the first crop of each
        baseline JPEG records where its bitstream stands every ``spacing`` MCUs (default
        2), and later crops of that file decode only the crop's MCUs, with the same pixels.
        The indexes take at most ``budget_mb`` MiB of memory (default 256); files met once
        it is full decode the ordinary way. ``stats()["entropy_index"]`` counts them.
        With ``dir``, the indexes are also kept in that folder, shared by every process
        that names it (``sluice index DATA DIR`` makes them ahead; docs/entropy-index.md)."""
        decode: Dict[str, Any] = dict(self._spec.get("decode", {}))
        decode["entropy_index"] = enabled
        if budget_mb is not None:
            decode["index_budget_mb"] = budget_mb
        if spacing is not None:
            decode["index_spacing"] = spacing
        if dir is not None:
            decode["index_dir"] = _path(dir)
        return self._with(decode=decode)

    def resize(self, size: int, interpolation: str = "bilinear", antialias: bool = True) -> "Pipeline":
        """Resizes so the shorter side is ``size`` (aspect ratio kept), torchvision's
        ``Resize(size, interpolation, antialias=antialias)``: ``interpolation`` is
        ``"bilinear"``, ``"bicubic"``, ``"nearest"`` or ``"nearest_exact"``; ``antialias``
        widens the filter when shrinking (nearest ignores it). Defaults are torchvision v2's."""
        return self._op("resize", size=size, **_resample(interpolation, antialias))

    def center_crop(self, size: Size) -> "Pipeline":
        """Crops the center ``size`` (one side, or ``(height, width)``)."""
        return self._op("center_crop", size=_size(size))

    def random_resized_crop(
        self,
        size: Size,
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: str = "bilinear",
        antialias: bool = True,
    ) -> "Pipeline":
        """torchvision's RandomResizedCrop: a random area fraction in ``scale`` and aspect
        ratio (log-uniform) in ``ratio``, resized to ``size`` with ``interpolation`` and
        ``antialias`` as :meth:`resize`'s. Seeded per sample."""
        return self._op(
            "random_resized_crop",
            size=_size(size),
            scale=list(scale),
            ratio=list(ratio),
            **_resample(interpolation, antialias),
        )

    def random_horizontal_flip(self, p: float = 0.5) -> "Pipeline":
        """Flips left-right with probability ``p``. Seeded per sample."""
        return self._op("random_horizontal_flip", p=p)

    # ---- colour ops (torchvision.transforms.v2 semantics; docs/ops.md) ----------------

    def invert(self) -> "Pipeline":
        """``255 - x`` on every channel (torchvision's ``RandomInvert(p=1)``)."""
        return self._op("invert")

    # Ops torchvision has as ``Random*(p)`` take ``p`` here (default 1: always applied).

    def color_jitter(
        self,
        brightness: Optional[Span] = None,
        contrast: Optional[Span] = None,
        saturation: Optional[Span] = None,
        hue: Optional[Span] = None,
    ) -> "Pipeline":
        """torchvision's ``ColorJitter``: each factor a number ``v`` (``[1 - v, 1 + v]``; hue
        ``[-v, v]``) or a ``(min, max)`` pair, drawn per sample and applied in an order
        drawn per sample."""
        args = {"brightness": brightness, "contrast": contrast, "saturation": saturation, "hue": hue}
        return self._op("color_jitter", **{k: _span(v) for k, v in args.items() if v is not None})

    def random_grayscale(self, p: float = 0.1) -> "Pipeline":
        """Grayscale (three equal channels) with probability ``p`` (``RandomGrayscale``)."""
        return self._op("random_grayscale", p=p)

    def grayscale(self) -> "Pipeline":
        """``Grayscale(num_output_channels=3)``: ``0.2989 R + 0.587 G + 0.114 B``."""
        return self._op("grayscale")

    def solarize(self, threshold: float, p: float = 1.0) -> "Pipeline":
        """Inverts values ``>= threshold`` (u8 units) with probability ``p`` (``RandomSolarize``)."""
        return self._op("solarize", threshold=threshold, p=p)

    def posterize(self, bits: int, p: float = 1.0) -> "Pipeline":
        """Keeps the top ``bits`` (0 to 8) bits with probability ``p`` (``RandomPosterize``)."""
        return self._op("posterize", bits=bits, p=p)

    def equalize(self, p: float = 1.0) -> "Pipeline":
        """Histogram equalization per channel with probability ``p`` (``RandomEqualize``)."""
        return self._op("equalize", p=p)

    def autocontrast(self, p: float = 1.0) -> "Pipeline":
        """Stretches each channel to [0, 255] with probability ``p`` (``RandomAutocontrast``)."""
        return self._op("autocontrast", p=p)

    def adjust_sharpness(self, sharpness_factor: float, p: float = 1.0) -> "Pipeline":
        """Sharpens (factor > 1) or smooths (< 1) with probability ``p``
        (``RandomAdjustSharpness``)."""
        return self._op("adjust_sharpness", sharpness_factor=sharpness_factor, p=p)

    def gaussian_blur(self, kernel_size: Size, sigma: Span = (0.1, 2.0)) -> "Pipeline":
        """torchvision's ``GaussianBlur``: odd ``kernel_size`` (one side or ``(x, y)``), sigma
        drawn per sample from ``sigma`` (a number fixes it); reflect padding."""
        ks = kernel_size if isinstance(kernel_size, int) else [int(k) for k in kernel_size]
        return self._op("gaussian_blur", kernel_size=ks, sigma=_span(sigma))

    def random_erasing(
        self,
        p: float = 0.5,
        scale: Sequence[float] = (0.02, 0.33),
        ratio: Sequence[float] = (0.3, 3.3),
        value: Union[float, Sequence[float], str] = 0.0,
    ) -> "Pipeline":
        """torchvision's ``RandomErasing``, on the output as written: it goes after
        ``normalize``/``dtype``/``layout``, and ``value`` is in the output's units (0 after
        ``normalize`` is the mean). ``value``: a number, one per channel, or ``"random"``
        (standard normal noise)."""
        v: Any = value if isinstance(value, (str, int, float)) else [float(x) for x in value]
        return self._op("random_erasing", p=p, scale=list(scale), ratio=list(ratio), value=v)

    # ---- geometric ops (torchvision.transforms.v2 semantics; docs/ops.md) -------------

    def random_vertical_flip(self, p: float = 0.5) -> "Pipeline":
        """Flips top-bottom with probability ``p``. Seeded per sample."""
        return self._op("random_vertical_flip", p=p)

    def random_rotation(
        self,
        degrees: Union[float, Sequence[float]],
        interpolation: str = "nearest",
        expand: bool = False,
        center: Optional[Sequence[float]] = None,
        fill: Fill = 0,
    ) -> "Pipeline":
        """torchvision's RandomRotation: turns counter-clockwise by an angle uniform in
        ``degrees`` (``d`` means ``(-d, d)``) about ``center`` (pixel coordinates; the image
        centre by default). ``interpolation`` is ``"nearest"`` or ``"bilinear"``; ``expand``
        grows the canvas to hold the whole image (its size then varies: follow with a crop);
        ``fill`` colours what comes in from outside. Seeded per sample."""
        args: Dict[str, Any] = {"degrees": _range(degrees), "interpolation": interpolation, "expand": expand}
        if center is not None:
            args["center"] = [float(c) for c in center]
        return self._op("random_rotation", **args, fill=_fill(fill))

    def random_affine(
        self,
        degrees: Union[float, Sequence[float]],
        translate: Optional[Sequence[float]] = None,
        scale: Optional[Sequence[float]] = None,
        shear: Optional[Union[float, Sequence[float]]] = None,
        interpolation: str = "nearest",
        fill: Fill = 0,
    ) -> "Pipeline":
        """torchvision's RandomAffine: angle uniform in ``degrees``, a shift of up to
        ``translate`` (fractions of width and height, rounded to whole pixels), a scale
        uniform in ``scale``, and a shear in degrees (``s``: x in ``(-s, s)``; 2 values: x
        in that range; 4 values: x then y ranges). Seeded per sample."""
        args: Dict[str, Any] = {"degrees": _range(degrees), "interpolation": interpolation, "fill": _fill(fill)}
        if translate is not None:
            args["translate"] = [float(t) for t in translate]
        if scale is not None:
            args["scale"] = [float(s) for s in scale]
        if shear is not None:
            sh = _range(shear)
            args["shear"] = sh + [0.0, 0.0] if len(sh) == 2 else sh
        return self._op("random_affine", **args)

    def random_perspective(
        self,
        distortion_scale: float = 0.5,
        p: float = 0.5,
        interpolation: str = "bilinear",
        fill: Fill = 0,
    ) -> "Pipeline":
        """torchvision's RandomPerspective: with probability ``p``, each corner moves inwards
        by up to ``distortion_scale`` of half the side and the image follows. Seeded per
        sample."""
        return self._op(
            "random_perspective", distortion_scale=distortion_scale, p=p, interpolation=interpolation, fill=_fill(fill)
        )

    def random_crop(
        self,
        size: Size,
        padding: Optional[Padding] = None,
        pad_if_needed: bool = False,
        fill: Fill = 0,
        padding_mode: str = "constant",
    ) -> "Pipeline":
        """torchvision's RandomCrop: pads by ``padding`` (and up to ``size`` when
        ``pad_if_needed``), then crops ``size`` at a uniform position. ``padding_mode`` is
        ``"constant"`` (with ``fill``), ``"edge"``, ``"reflect"`` or ``"symmetric"``. The CIFAR
        recipe is ``random_crop(32, padding=4)``. Seeded per sample."""
        args: Dict[str, Any] = {"size": _size(size), "pad_if_needed": pad_if_needed}
        if padding is not None:
            args["padding"] = _padding(padding)
        return self._op("random_crop", **args, fill=_fill(fill), padding_mode=padding_mode)

    def random_iou_crop(
        self,
        min_scale: float = 0.3,
        max_scale: float = 1.0,
        min_aspect_ratio: float = 0.5,
        max_aspect_ratio: float = 2.0,
        sampler_options: Optional[Sequence[float]] = None,
        trials: int = 40,
    ) -> "Pipeline":
        """torchvision v2's RandomIoUCrop (SSD), for sources with boxes: draws a minimum IoU
        from ``sampler_options`` (default ``[0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]``; 1 leaves
        the image as it is), then up to ``trials`` crops of ``[min_scale, max_scale]`` of each
        side with an aspect ratio in ``[min_aspect_ratio, max_aspect_ratio]`` until one holds
        a box centre and overlaps such a box by that IoU. Boxes whose centre is outside the
        crop are dropped, the rest clipped (torchvision's crop + SanitizeBoundingBoxes); a
        mask is cut with the image. A sample without boxes is left as it is. The crop's
        size depends on the draw, so a fixed-size op must follow. Seeded per sample."""
        options = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0] if sampler_options is None else list(sampler_options)
        return self._op(
            "random_iou_crop",
            min_scale=min_scale,
            max_scale=max_scale,
            min_aspect_ratio=min_aspect_ratio,
            max_aspect_ratio=max_aspect_ratio,
            sampler_options=options,
            trials=trials,
        )

    def pad(self, padding: Padding, fill: Fill = 0, padding_mode: str = "constant") -> "Pipeline":
        """torchvision's Pad: ``padding`` is one value, ``(left/right, top/bottom)`` or
        ``(left, top, right, bottom)``; ``padding_mode`` as for :meth:`random_crop`."""
        return self._op("pad", padding=_padding(padding), fill=_fill(fill), padding_mode=padding_mode)

    # ---- emulated cost ------------------------------------------------------------------

    def trivial_augment_wide(
        self, num_magnitude_bins: int = 31, interpolation: str = "nearest", fill: Optional[Fill] = None
    ) -> "Pipeline":
        """torchvision's TrivialAugmentWide: per sample, one op of its 14 at a magnitude bin
        uniform in ``num_magnitude_bins`` (a random sign for signed ops). ``fill=None`` is
        torchvision's default (zeros outside a warp, no mask blend). Seeded per sample."""
        return self._op(
            "trivial_augment_wide", **_policy_args(interpolation, fill, num_magnitude_bins=num_magnitude_bins)
        )

    def rand_augment(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        interpolation: str = "nearest",
        fill: Optional[Fill] = None,
    ) -> "Pipeline":
        """torchvision's RandAugment: per sample, ``num_ops`` ops drawn from its 14, each at
        bin ``magnitude`` of ``num_magnitude_bins`` (a random sign for signed ops). Seeded
        per sample."""
        args = _policy_args(
            interpolation, fill, num_ops=num_ops, magnitude=magnitude, num_magnitude_bins=num_magnitude_bins
        )
        return self._op("rand_augment", **args)

    def auto_augment(
        self, policy: str = "imagenet", interpolation: str = "nearest", fill: Optional[Fill] = None
    ) -> "Pipeline":
        """torchvision's AutoAugment: per sample, one of the ``policy``'s 25 sub-policies
        (``"imagenet"``, ``"cifar10"`` or ``"svhn"``), each of its two ops applied with its
        probability. Seeded per sample."""
        return self._op("auto_augment", **_policy_args(interpolation, fill, policy=policy))

    def augmix(
        self,
        severity: int = 3,
        mixture_width: int = 3,
        chain_depth: int = -1,
        alpha: float = 1.0,
        all_ops: bool = True,
        interpolation: str = "bilinear",
        fill: Optional[Fill] = None,
    ) -> "Pipeline":
        """torchvision's AugMix: per sample, ``mixture_width`` chains of ``chain_depth`` ops
        (1 to 3, drawn per chain, when ``chain_depth <= 0``) at a magnitude bin below
        ``severity`` (of 10), mixed with the image by Dirichlet(``alpha``) weights and a
        Beta(``alpha``, ``alpha``) blend; ``all_ops`` adds brightness, colour, contrast and
        sharpness to its 9 geometric and tone ops. Seeded per sample."""
        return self._op(
            "augmix",
            **_policy_args(
                interpolation,
                fill,
                severity=severity,
                mixture_width=mixture_width,
                chain_depth=chain_depth,
                alpha=alpha,
                all_ops=all_ops,
            ),
        )

    def sleep(self, us: int) -> "Pipeline":
        """Emulated per-sample cost: sleeps ``us`` microseconds per sample (at most one
        second). For benchmarks that need more preprocessing units than the machine has
        cores; it changes no pixel."""
        return self._op("sleep", us=us)

    def map(self, fn: Union[MapFn, str], timeout_ms: Optional[int] = None) -> "Pipeline":
        """Runs ``fn`` on each sample's image, between the native ops (docs/map.md).

        ``fn(image, sample) -> image``: ``image`` is the sample's pixels as a uint8 numpy
        array ``[h, w, 3]``, a writable view of sluice's buffer for the call (edit it in
        place and return it: nothing is copied); ``sample`` has ``key``, ``label``, ``epoch``, ``seed``
        and ``rng``, a ``numpy.random.Generator`` seeded from (seed, epoch, key), so a
        random ``fn`` is deterministic and resumes exactly. It returns a uint8
        ``[h', w', 3]`` array (any size; end with a crop if it changes the size). Like
        the other image ops it comes before ``normalize``/``dtype``/``layout``. Where the
        source has masks, ``sample.mask`` is the sample's uint8 ``[h, w]`` mask, writable
        like the image: edit it in place, or return ``(image, mask)`` (docs/map.md,
        "Masks").

        ``fn`` must be importable by name (``module:qualname``: a function defined at the
        top level of a module, or a static method of a top-level class): ``sluice.Loader`` runs
        pipelines with ``map`` in worker processes, which import it. A string
        ``"module:qualname"`` names it directly. What ``fn`` raises fails the sample,
        named by key and path, under the pipeline's ``on_error``.

        ``timeout_ms`` (1 to 3,600,000; default one minute) bounds one call through the
        service: a worker kills the Python process of a call that runs longer and fails the
        sample (docs/map.md, "Through the service"); a local loader does not apply it.

        Raises:
            SpecError: ``fn`` is a lambda, a closure or a function defined inside another,
                or its name does not import back to it.
        """
        name = fn if isinstance(fn, str) else _map_name(fn)
        if timeout_ms is None:
            return self._op("map", fn=name)
        return self._op("map", fn=name, timeout_ms=timeout_ms)

    def map_batch(self, fn: Union[MapBatchFn, str]) -> "Pipeline":
        """Runs ``fn`` on each whole batch, after every op (docs/map.md); spec key
        ``map_batch``. One per pipeline: a second call replaces the first.

        ``fn(batch, info) -> batch``: ``batch`` is the dict of numpy arrays the loader
        would yield (``image``, ``label``, ``key``, and ``weight``/boxes where the pipeline
        has them); ``info`` has ``epoch``, ``index`` (the batch's index in the epoch),
        ``seed``, ``rank``, ``keys`` and ``rng``, a ``numpy.random.Generator`` derived from
        (seed, epoch, index, rank). It returns a dict of numpy arrays (any names, dtypes
        and shapes; a text or JSON field may stay a list of str), which the loader yields instead. ``sluice.Loader`` runs it in its
        worker processes (``processes=0``: in this process), so the batches are the same
        for any process count and a ``state_dict`` resumes exactly.

        ``fn`` must be importable by name, as for :meth:`map`. What it raises fails the
        epoch with a :class:`sluice.MapBatchError` naming the batch and its sample keys.

        Raises:
            SpecError: ``fn`` is a lambda, a closure or a function defined inside another,
                or its name does not import back to it.
        """
        name = fn if isinstance(fn, str) else _map_name(fn, field="map_batch", what="map_batch")
        return self._with(map_batch=name)

    def normalize(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> "Pipeline":
        """``(x / 255 - mean) / std`` per channel, as float32 (mean/std in [0, 1] units).
        Usually cheaper on the GPU: see :func:`sluice.torch.to_device`."""
        return self._op("normalize", mean=list(mean), std=list(std))

    def dtype(self, dtype: str) -> "Pipeline":
        """Output element type: ``"u8"`` (pixels as they are, the default) or ``"f32"``
        (``x / 255``)."""
        return self._op("dtype", dtype=dtype)

    def layout(self, order: str) -> "Pipeline":
        """Output layout: ``"hwc"`` (NHWC batches, the default) or ``"chw"`` (NCHW)."""
        return self._op("layout", order=order)

    def shuffle(self, mode: Union[str, bool] = "global", size: Optional[int] = None) -> "Pipeline":
        """Epoch order: ``"global"`` (a fresh permutation every epoch, the default),
        ``"none"`` (dataset order), or ``"buffer"`` with ``size`` (a tf.data-style shuffle
        buffer, for sequential sources such as tar shards). ``True``/``False`` mean
        global/none."""
        if mode is True:
            mode = "global"
        elif mode is False:
            mode = "none"
        shuffle: Dict[str, Any] = {"kind": mode}
        if size is not None or mode == "buffer":
            shuffle["size"] = size
        return self._with(shuffle=shuffle)

    def batch(self, size: int, drop_last: bool = False) -> "Pipeline":
        """Samples per batch; ``drop_last`` drops each epoch's short last batch."""
        return self._with(batch={"size": size, "drop_last": drop_last})

    def prefetch(self, batches: Union[int, str], max_bytes: Optional[int] = None) -> "Pipeline":
        """Batches prepared ahead of the consumer (default 4). Peak memory is about
        ``(prefetch + threads) x batch bytes``. ``"auto"`` sizes it while the loader runs
        (tf.data's buffer autotuning, docs/autoscaling.md): it starts at the batches the
        threads can build at once plus one, and doubles the ready part each time the
        training loop drains a full buffer, within ``max_bytes`` of batches in flight
        (default 1 GiB; at most 64 batches). ``Loader.stats()["prefetch"]["depth"]`` shows it."""
        if max_bytes is not None and batches != "auto":
            raise ValueError('max_bytes bounds prefetch("auto") only')
        if max_bytes is None:
            return self._with(prefetch=batches)
        return self._with(prefetch=batches, prefetch_max_bytes=max_bytes)

    def threads(self, threads: Union[int, str]) -> "Pipeline":
        """Worker threads; 0 (the default) means one per core, ``"auto"`` as many as the
        training loop needs (the autoscaler resizes the pool while it runs)."""
        return self._with(threads=threads)

    def seed(self, seed: int) -> "Pipeline":
        """Seed of every random choice (epoch order and augmentations)."""
        return self._with(seed=seed)

    def fields(self, **fields: Union[str, Tuple[str, int]]) -> "Pipeline":
        """Metadata fields to read from each sample's sidecar (``sidecar`` sources and
        ``tar`` with ``sidecars=True``: top-level keys of the JSON beside the image) or from
        a ``parquet`` source's columns of the same names (multi_label from a list column of
        class indices, as ``datasets`` writes a ``Sequence(ClassLabel)``), or from each
        source of a ``mix`` of those, named with their kind (spec key ``fields``;
        docs/records.md)::

            Pipeline.sidecar("data").fields(caption="text", score="float", id="int",
                                            tags=("multi_label", 80), meta="json")

        Kinds: ``"float"`` (float32 ``[n]``), ``"int"`` (int64 ``[n]``),
        ``("multi_label", classes)`` (a list of class indices in the sidecar, multi-hot
        float32 ``[n, classes]`` in the batch: the target ``BCEWithLogitsLoss`` takes),
        ``"text"`` (a string; ``list[str]`` in the batch) and ``"json"`` (any value; its
        compact JSON text, ``list[str]``). Batches carry each field under its name. A
        sample whose field is missing or of another kind is a bad sample (``on_error``),
        its error naming the field and what was found. Calling again replaces the fields.
        """
        specs: List[Dict[str, Any]] = []
        for name, kind in fields.items():
            if isinstance(kind, tuple):
                specs.append({"name": name, "kind": kind[0], "classes": kind[1]})
            else:
                specs.append({"name": name, "kind": kind})
        return self._with(fields=specs)

    def on_error(self, policy: str) -> "Pipeline":
        """What a bad sample does: ``"fail"`` (raise :class:`sluice.SampleError` naming its
        key and path, the default) or ``"skip"`` (leave it out and report it in
        ``Loader.stats()["skipped"]``)."""
        return self._with(on_error=policy)

    def local(self) -> "Pipeline":
        """Reads local files (the default storage)."""
        return self._with(storage={"kind": "local"})

    def throttled(self, latency_ms: float, bandwidth_mb_s: float) -> "Pipeline":
        """Reads local files behind an emulated network link: every read waits
        ``latency_ms`` and all reads share ``bandwidth_mb_s`` (MB = 10^6 bytes)."""
        return self._with(storage={"kind": "throttled", "latency_ms": latency_ms, "bandwidth_mb_s": bandwidth_mb_s})

    def limits(
        self,
        max_pixels: Optional[int] = None,
        max_file_bytes: Optional[int] = None,
        max_boxes: Optional[int] = None,
        max_field_bytes: Optional[int] = None,
    ) -> "Pipeline":
        """Rejects (as bad samples) images whose header declares more than ``max_pixels``
        pixels, files larger than ``max_file_bytes``, samples with more than
        ``max_boxes`` boxes (default 10 000) and samples whose text or JSON field is longer
        than ``max_field_bytes`` bytes (default 65 536)."""
        limits = dict(self._spec.get("limits", {}))
        if max_field_bytes is not None:
            limits["max_field_bytes"] = max_field_bytes
        if max_pixels is not None:
            limits["max_pixels"] = max_pixels
        if max_file_bytes is not None:
            limits["max_file_bytes"] = max_file_bytes
        if max_boxes is not None:
            limits["max_boxes"] = max_boxes
        return self._with(limits=limits)

    def cache(
        self,
        budget: Union[int, float, str, None],
        level: str = "auto",
        resize: Optional[int] = None,
        policy: str = "importance",
        disk: Optional[Dict[str, Any]] = None,
        share: bool = False,
    ) -> "Pipeline":
        """Caches samples between the deterministic and the random ops.

        Args:
            budget: memory for entries: bytes, a fraction of RAM in (0, 1], or a string
                such as ``"8GiB"``, ``"512MB"``, ``"25%"``. ``None`` removes the cache.
            level: ``"raw"`` (file bytes), ``"decoded"`` (pixels after the deterministic
                ops), ``"resized"`` (decoded and shrunk to ``resize``), or ``"auto"``
                (chosen from measured costs; nothing, when the best level would save
                under 5% of the pipeline's time per epoch: see ``stats()["cache"]["off"]``).
            resize: shorter side of a deterministic resize before the random ops (needed
                by ``"resized"``; it changes the pipeline's pixels whatever the level).
            policy: which entries a full cache gives up: ``"lru"``, ``"shade"``,
                ``"fastmatch"`` or ``"importance"``.
            disk: a local-disk tier under the memory one, e.g.
                ``{"dir": "/scratch/sluice", "budget": "200GiB"}`` (``budget`` in bytes or a
                size string, not a fraction; optional ``"policy"``: ``"belady"``, the
                default, or ``"lru"``). Entries survive a restart of the job.
            share: loaders of this process whose pipelines would cache the same bytes per
                sample (same data, record options, limits, ops before the first random one,
                level and resize; seeds, batch sizes, random ops and budgets may differ)
                fill and read one memory cache, with the first loader's budget, policy and
                disk tier: an ensemble or a hyper-parameter search decodes each sample once.
                Needs uniform sampling and no locality section.
        """
        if budget is None:
            spec = copy.deepcopy(self._spec)
            spec.pop("cache", None)
            return Pipeline(spec)
        cache: Dict[str, Any] = {"budget": budget, "level": level, "policy": policy}
        if resize is not None:
            cache["resize"] = resize
        if disk is not None:
            cache["disk"] = {k: str(v) if k == "dir" else v for k, v in disk.items()}
        if share:
            cache["share"] = True
        return self._with(cache=cache)

    def sampling(
        self,
        kind: str = "uniform",
        floor: Optional[float] = None,
        coverage_epochs: Optional[int] = None,
        miss_discount: Optional[float] = None,
    ) -> "Pipeline":
        """How each epoch's order is drawn: ``"uniform"`` (every sample once, the
        default), ``"importance"`` (sluice's sampler: proportional to the importance the
        trainer reports with ``Loader.report``, with a ``floor``, a sweep that visits every
        sample once in every ``coverage_epochs`` epochs (default 2; it also bounds every
        weight by it) and ``miss_discount`` for cache misses; batches then carry unbiasing
        ``weight``), or the published baselines ``"fastmatch"`` and ``"shade"``."""
        sampling: Dict[str, Any] = {"kind": kind}
        for name, value in (("floor", floor), ("coverage_epochs", coverage_epochs), ("miss_discount", miss_discount)):
            if value is not None:
                sampling[name] = value
        return self._with(sampling=sampling)

    def importance(self, ema: float) -> "Pipeline":
        """Weight of the newest epoch's reported importance in its exponential moving
        average (in (0, 1])."""
        return self._with(importance={"ema": ema})

    # ---- inspection ----------------------------------------------------------------------

    @property
    def ops(self) -> Tuple[Dict[str, Any], ...]:
        """The ops, in order, as dicts (copies)."""
        return tuple(copy.deepcopy(op) for op in self._spec["ops"])

    def _meaning(self) -> str:
        """What the spec means: canonical JSON (parsed and validated in Rust, defaults
        filled in), so a pipeline equals itself saved and loaded back. A spec that does not
        validate means only what it says."""
        try:
            spec = json.loads(_sluice.spec_canonical_json(self._raw_json()))
        except SpecError:
            spec = self._spec
        return json.dumps(spec, sort_keys=True, default=str)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Pipeline):
            return NotImplemented
        return self._spec == other._spec or self._meaning() == other._meaning()

    def __hash__(self) -> int:
        return hash(self._meaning())

    def __repr__(self) -> str:
        return f"Pipeline({json.dumps(self._spec)})"


def _span(v: Span) -> Any:
    """A number stays a number; a pair becomes a list (the spec's JSON form)."""
    return v if isinstance(v, (int, float)) else [float(x) for x in v]
