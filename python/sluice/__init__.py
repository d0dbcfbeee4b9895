"""sluice: a Rust data loader that feeds training images to accelerators.

Decoding and augmentation run on sluice's own native threads (no Python, the GIL
released); batches reach Python as numpy arrays or torch tensors without a copy::

    import sluice

    pipe = (
        sluice.Pipeline.image_folder("data/train")
        .decode()
        .random_resized_crop(224)
        .random_horizontal_flip()
        .batch(256)
    )
    loader = sluice.Loader(pipe, output="torch")
    for epoch in range(2):
        for batch in loader:
            images, labels = batch.image, batch.label  # uint8 [n, 224, 224, 3], int64 [n]

``import sluice`` does not import torch; :mod:`sluice.torch` (the ``IterableDataset``
adapter and ``to_device``) does.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from . import _sluice, errors
from ._sluice import MapSample
from .errors import *  # noqa: F403 (the exception family; its names are errors.__all__)
from .loader import Batch, BatchIterator, Loader
from .map_workers import MapBatchInfo
from .pipeline import IMAGENET_MEAN, IMAGENET_STD, PathLike, Pipeline
from .profile import ProfileRow, profile
from .protocol import LoaderLike
from .remote import RemoteBatchIterator, RemoteLoader

__version__: str = _sluice.__version__

__all__ = [
    "Pipeline",
    "Loader",
    "Batch",
    "BatchIterator",
    "RemoteLoader",
    "RemoteBatchIterator",
    "LoaderLike",
    "MapSample",
    "MapBatchInfo",
    "generate_dataset",
    "pack",
    "profile",
    "ProfileRow",
    "enable_logging",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "__version__",
]
__all__ += errors.__all__


def generate_dataset(
    root: PathLike,
    images: Optional[int] = None,
    classes: Optional[int] = None,
    seed: Optional[int] = None,
    quality: Optional[int] = None,
    texture: Optional[int] = None,
    corrupt: Optional[int] = None,
    boxes: bool = False,
    masks: bool = False,
    fields: bool = False,
) -> Dict[str, Any]:
    """Writes a deterministic, ImageNet-like ImageFolder dataset under ``root``.

    ``images`` JPEGs (default 1000) of about 500x375 pixels and ~100 KB (``texture``, the
    noise amplitude, sets the weight; JPEG ``quality`` default 90), image ``i`` in
    ``root/class_{i % classes:03}/img_{i:07}.jpg`` (``classes`` default 10), with
    class-dependent content a model can learn. The same arguments write the same bytes
    (``seed`` default 0). ``corrupt`` (default 0) adds that many bad files (truncated,
    empty, not an image, garbage, a huge header) for testing error policies. ``boxes``
    also writes each image's boxes (the shapes drawn on it) as a JSON sidecar beside it and
    ``root/instances.json`` (COCO), for :meth:`Pipeline.sidecar` and
    :meth:`Pipeline.coco`; ``masks`` also each image's segmentation mask
    (``img_XXXXXXX.mask.png``, box labels then counting from 1); ``fields`` also writes
    metadata fields into each sidecar, for :meth:`Pipeline.fields`: image ``i`` of class
    ``c`` gets ``id`` (int, ``i``), ``caption`` (text, ``"image {i} of class {c}"``),
    ``score`` (float, ``i / 8``) and ``tags`` (multi_label over ``classes``,
    ``[c, (c + 1) % classes]``). Options left out take the
    Rust generator's defaults (the same as ``sluice gen-images``). Runs on all cores with
    the GIL released.

    Returns:
        ``{"root", "images", "bad_files" (list of paths), "bytes"}``.
    """
    return _sluice.generate_dataset(
        os.fspath(root), images, classes, seed, quality, texture, corrupt, boxes, masks, fields
    )


def pack(src: PathLike, out: PathLike, interval: Optional[int] = None, threads: Optional[int] = None) -> Dict[str, Any]:
    """Copies the dataset ``src`` to ``out`` with every JPEG rewritten losslessly with
    restart markers (every ``interval`` MCUs, default 2), so random crops decode only the
    part of the file they cover: the pixels are exactly the same, the training pipeline
    faster (see BENCHMARKS.md). Other files are copied as they are, and so is a JPEG that
    cannot be rewritten (listed in ``not_packed`` with the reason). The same as
    ``sluice pack SRC OUT``. Runs on ``threads`` threads (default: all cores) with the GIL
    released.

    Returns:
        ``{"packed", "copied", "not_packed" (list of (path, reason)), "bytes_in", "bytes_out"}``.

    Raises:
        SourceNotFoundError: ``src`` does not exist.
        SourceError: ``out`` lies inside ``src``, or a file cannot be read or written.
    """
    return _sluice.pack(os.fspath(src), os.fspath(out), interval, threads)


def enable_logging(filter: str = "warn") -> bool:
    """Sends sluice's Rust logs (skipped samples, dataset enumeration...) to stderr,
    filtered like ``RUST_LOG`` (``"warn"``, ``"info"``, ``"sluice_pipeline=debug"``).
    Returns False if logging was already set up (only the first call counts)."""
    return bool(_sluice.enable_logging(filter))


def __getattr__(name: str) -> Any:
    # `sluice.torch` without an explicit import, still without importing torch up front.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'sluice' has no attribute {name!r}")
