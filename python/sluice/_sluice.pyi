"""Type stubs of ``sluice._sluice``, the native (Rust, PyO3) half of the package.

A thin layer: specs go in as JSON strings, batches come out as numpy arrays that own the
Rust buffers. The friendly API is the pure-Python package (:class:`sluice.Pipeline`,
:class:`sluice.Loader`); errors are raised as the classes of :mod:`sluice.errors`.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "__version__",
    "EpochIterator",
    "Loader",
    "RawBatch",
    "RemoteLoader",
    "enable_logging",
    "generate_dataset",
    "pack",
    "policy_op",
    "policy_space",
    "spec_canonical_json",
    "spec_json_to_toml",
    "spec_process_share",
    "spec_load_file",
    "spec_toml_to_json",
    "StreamLoader",
    "stream_push",
]
__version__: str

def policy_space(policy: str, num_bins: int, height: int, width: int) -> List[Tuple[str, Optional[List[float]], bool]]:
    """The op space of ``policy`` (``"trivial_augment_wide"``, ``"rand_augment"`` or
    ``"auto_augment"``) for ``num_bins`` magnitude bins on a ``width x height`` image, in
    torchvision's order: each op's name, its magnitude per bin (``None`` for an op without
    one) and whether it takes a random sign."""

def policy_op(
    op: str,
    magnitude: float,
    image: bytes,
    width: int,
    height: int,
    interpolation: str = "nearest",
    fill: Optional[Sequence[int]] = None,
) -> bytes:
    """Runs the policy sub-op ``op`` (torchvision's name, e.g. ``"ShearX"``) at
    ``magnitude`` on a ``width x height`` RGB8 HWC image as a policy that drew it does, and
    returns the pixels (for checking each branch against torchvision)."""

def register_map(name: str) -> None:
    """Imports the function ``name`` (``module:qualname``) and registers it for the
    spec's ``map`` ops (a native ``Loader`` does this for every ``map`` op of its spec)."""

@final
class MapSample:
    """What a ``map`` function is told about its sample besides the pixels."""

    @property
    def key(self) -> int:
        """The sample's key (its position in the manifest)."""
    @property
    def label(self) -> int:
        """Its class index; -1 where the source has none."""
    @property
    def epoch(self) -> int: ...
    @property
    def seed(self) -> int:
        """The seed drawn for this op from the sample's RNG (seed, epoch, key)."""
    @property
    def mask(self) -> Optional[npt.NDArray[np.uint8]]:
        """The sample's segmentation mask (uint8 ``[h, w]``, a writable view for the call:
        edit it in place, or return ``(image, mask)``); None where the source has no
        masks."""
    @property
    def rng(self) -> Any:
        """A ``numpy.random.Generator`` seeded with ``seed``, made on first use."""

def spec_canonical_json(json: str) -> str:
    """Parses and validates a JSON spec; returns it canonical (defaults filled in)."""

def spec_json_to_toml(json: str) -> str:
    """Converts a JSON spec to TOML (validating it)."""

def spec_process_share(json: str, index: int, count: int) -> str:
    """The spec of process ``index`` of ``count`` running one loader: its cache's memory
    and disk budgets split between them, its disk tier in a subfolder of its own."""

def spec_toml_to_json(toml: str) -> str:
    """Converts a TOML spec to canonical JSON (validating it)."""

def spec_load_file(path: str) -> str:
    """Reads a ``.toml``/``.json`` spec file (relative source paths resolved against its
    folder) and returns canonical JSON."""

def generate_dataset(
    root: str,
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
    """Writes a deterministic ImageNet-like ImageFolder dataset (options left out take
    sluice-synth's defaults; ``boxes`` also writes each image's boxes as a JSON sidecar and
    ``root/instances.json``; ``masks`` each image's mask too, ``img_XXXXXXX.mask.png``,
    with box labels from 1; ``fields`` metadata fields in each sidecar: ``id``,
    ``caption``, ``score``, ``tags``); returns ``{"root", "images", "bad_files", "bytes"}``."""

def pack(src: str, out: str, interval: Optional[int] = None, threads: Optional[int] = None) -> Dict[str, Any]:
    """Copies ``src`` to ``out`` with every JPEG rewritten losslessly with restart markers;
    returns ``{"packed", "copied", "not_packed", "bytes_in", "bytes_out"}``."""

def profile_threads(
    spec_json: str,
    threads: List[int],
    epochs: int = 1,
    runs: int = 1,
    report: Optional[str] = None,
    title: str = "pipeline",
) -> Tuple[str, Optional[int]]:
    """Runs the spec at each thread count; returns the table as JSON and the knee, and
    writes the HTML report to ``report`` when given."""

def enable_logging(filter: str = "warn") -> bool:
    """Sends Rust logs to stderr; False if logging was already set up."""

@final
class Loader:
    """A loader over one pipeline spec, for one rank of ``world_size``."""

    def __new__(cls, spec_json: str, rank: int = 0, world_size: int = 1) -> "Loader": ...
    def iter(self) -> "EpochIterator":
        """An iterator over the rest of the current epoch; retires any older one."""
    def epoch_draw(self, epoch: int) -> Tuple[bytes, Optional[bytes]]:
        """``epoch``'s order (manifest positions, little-endian u32) and weights (f32, or
        None), drawn once from this loader's importance state."""
    def iter_draw(self, epoch: int, start: int, end: int, order: bytes, weights: Optional[bytes]) -> "EpochIterator":
        """Only batches ``start..end`` of ``epoch``, over an order another loader of the
        same spec drew (``epoch_draw``), apart from this loader's own position: one share
        of an epoch, as a ``map`` worker process runs it."""
    def tell_future_of_share(self, epoch: int, order: bytes, first: int, index: int, count: int) -> None:
        """Tells the disk tier the samples this process's batches (``i % count == index``)
        of ``epoch`` over ``order`` look up from batch ``first`` on (and of the next epoch
        where the seed alone decides it)."""
    def batch_bytes(self) -> int:
        """Bytes of one full batch's images."""
    def batches_per_epoch(self) -> int: ...
    def samples_per_epoch(self) -> int: ...
    def num_samples(self) -> int: ...
    def classes(self) -> List[str]: ...
    def path_of(self, key: int) -> str: ...
    def fingerprint(self) -> str: ...
    def spec_json(self) -> str: ...
    def position(self) -> Tuple[int, int]:
        """``(epoch, batches of it already handed out)``."""
    def set_epoch(self, epoch: int) -> None: ...
    def state_json(self) -> str: ...
    def load_state_json(self, state: str) -> None: ...
    def report(self, keys: Sequence[int], values: Sequence[float]) -> Tuple[int, int, int]:
        """Per-sample importance from the trainer (losses or gradient norms) for ``keys``.
        Returns the (accepted, refused, clamped) counts."""
    def start_trace(self) -> None: ...
    def stop_trace(self, path: str) -> Optional[int]:
        """Writes the trace to ``path``; the number of events, or None if not tracing."""
    def stats_json(self) -> str: ...
    def set_threads(self, threads: int) -> None:
        """Resizes the worker pool; 0 means one thread per core."""
    def threads(self) -> int: ...
    def buffers_reused(self) -> int:
        """Batches built in a buffer freed by an earlier batch rather than in fresh memory."""
    def report_accelerator_busy(self, fraction: float) -> None:
        """The trainer's own reading of its accelerator's busy fraction (0..=1); NaN is
        ignored, other values clamped."""

@final
class EpochIterator:
    """The batches of one epoch, in order. ``__next__`` waits with the GIL released and
    raises ``KeyboardInterrupt`` on Ctrl-C (a later call picks up the same batch)."""

    def __iter__(self) -> "EpochIterator": ...
    def __next__(self) -> "RawBatch": ...
    @property
    def epoch(self) -> int: ...
    def remaining(self) -> int: ...
    def drain(self) -> Tuple[int, int]:
        """Runs the rest of the epoch in Rust, handing no batch to Python (for benchmarks);
        returns ``(batches, samples)``."""

@final
class RawBatch:
    """One batch as numpy arrays that own sluice's buffers."""

    @property
    def image(self) -> npt.NDArray[Any]:
        """uint8 or float32, ``[n, h, w, 3]`` (hwc) or ``[n, 3, h, w]`` (chw)."""
    @property
    def label(self) -> npt.NDArray[np.int64]: ...
    @property
    def key(self) -> npt.NDArray[np.int64]: ...
    @property
    def weight(self) -> Optional[npt.NDArray[np.float32]]: ...
    @property
    def boxes(self) -> Optional[npt.NDArray[np.float32]]:
        """``[n, max_boxes, 4]`` XYXY boxes padded with zeros; None when the source has no boxes."""
    @property
    def box_labels(self) -> Optional[npt.NDArray[np.int64]]:
        """``[n, max_boxes]`` box labels, -1 in the padding; None without boxes."""
    @property
    def box_count(self) -> Optional[npt.NDArray[np.int32]]:
        """``[n]``: the real box rows of each sample; None without boxes."""
    @property
    def masks(self) -> Optional[npt.NDArray[np.uint8]]:
        """``[n, h, w]`` segmentation masks (class ids); None unless the source reads masks."""
    @property
    def fields(self) -> Optional[Dict[str, Union[npt.NDArray[Any], List[str]]]]:
        """The spec's metadata fields by name: float32 ``[n]`` (float), int64 ``[n]`` (int),
        float32 multi-hot ``[n, classes]`` (multi_label) or ``list[str]`` (text, json); None
        when the spec names no fields."""
    @property
    def epoch(self) -> int: ...
    @property
    def index(self) -> int: ...
    @property
    def layout(self) -> str: ...
    @property
    def buffer_address(self) -> int:
        """Address of the image buffer Rust filled (equals the image's data pointer)."""

@final
class RemoteLoader:
    """A loader whose batches come from a sluice dispatcher and its workers."""

    def __new__(
        cls,
        spec_json: str,
        dispatcher: str,
        job_name: str,
        token: Optional[str] = None,
        tasks_in_flight: int = 4,
        parallel_epochs: int = 0,
        compression: str = "none",
        data_plane: str = "auto",
        tls_ca: Optional[str] = None,
        connect_timeout: float = 60.0,
        autoscale: bool = False,
    ) -> "RemoteLoader": ...
    def start_trace(self) -> None: ...
    def stop_trace(self, path: str) -> Optional[int]:
        """Writes the trace to ``path``; the events and builds written, or None if not tracing."""
    def start_epoch(self) -> None: ...
    def next_batch(self) -> Optional["RawBatch"]:
        """Waits with the GIL released; Ctrl-C raises ``KeyboardInterrupt``, nothing lost."""
    def epoch(self) -> int: ...
    def batches_per_epoch(self) -> int: ...
    def samples_per_epoch(self) -> int: ...
    def job_id(self) -> int: ...
    def job_name(self) -> str: ...
    def fingerprint(self) -> str: ...
    def duplicates_dropped(self) -> int: ...
    def shared_memory_batches(self) -> int: ...
    def stats(self) -> Dict[str, Any]:
        """``batches``, ``samples``, ``bytes``, ``wait_s``, ``elapsed_s``,
        ``shared_memory_batches``, ``duplicates_dropped``, ``accelerator``."""
    def report_accelerator_busy(self, fraction: float) -> None:
        """The trainer's own reading of its accelerator's busy fraction (0..=1), sent to the
        dispatcher with the next heartbeat; never waits."""
    def state_json(self) -> str: ...
    def load_state_json(self, state: str) -> None: ...
    def report(self, keys: Sequence[int], values: Sequence[float], kind: str) -> Tuple[int, int, int, int]:
        """Importance into the job's store at the dispatcher; ``kind`` is ``"loss"`` or
        ``"grad_norm"``. Returns the (accepted, invalid, unknown, clamped) counts."""
    def set_epoch(self, epoch: int) -> None:
        """Restarts the job at the first batch of ``epoch``."""

@final
class StreamLoader:
    """Batches from a Redis stream (see :class:`sluice.stream.StreamLoader`)."""

    def __new__(cls, spec_json: str) -> "StreamLoader": ...
    def next(self) -> Optional[Tuple[RawBatch, npt.NDArray[np.bool_]]]:
        """The next batch and its rehearsal flags, or None at the end of the stream."""
    def state_json(self) -> str: ...
    def load_state_json(self, state: str) -> None: ...
    def stats_json(self) -> str: ...
    def rehearsal_ids(self) -> List[int]: ...

def stream_push(dataset: str, options_json: str) -> str:
    """Pushes a dataset into a stream; returns the report as JSON."""
