"""PyTorch integration: an ``IterableDataset`` over a sluice loader, and :func:`to_device`,
which moves a uint8 batch to the accelerator and converts and normalises it there.

sluice hands out uint8 NHWC batches by default because the CPU is the scarce resource:
converting to float, permuting to NCHW and normalising cost far less on the GPU::

    from sluice.torch import SluiceDataset, to_device

    data = SluiceDataset(pipe)                # or sluice.Loader(pipe, output="torch")
    for epoch in range(epochs):
        data.set_epoch(epoch)
        for batch in data:
            b = to_device(batch, "cuda")      # float32 NCHW, normalised, on the GPU
            loss = criterion(model(b.image), b.label)
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .loader import BOX_FIELDS, Batch, Loader
from .mix import CutMix, MixUp, MixUpOrCutMix
from .pipeline import IMAGENET_MEAN, IMAGENET_STD, PathLike, Pipeline

__all__ = ["SluiceDataset", "to_device", "MixUp", "CutMix", "MixUpOrCutMix", "IMAGENET_MEAN", "IMAGENET_STD"]


class SluiceDataset(IterableDataset):  # type: ignore[type-arg]
    """A torch ``IterableDataset`` whose items are whole batches (torch tensors).

    Iterate it directly, or wrap it in ``torch.utils.data.DataLoader(dataset,
    batch_size=None, num_workers=0)`` where a DataLoader is expected: sluice already runs
    its own native worker threads, so DataLoader workers would only add copies.

    Args:
        pipeline: a :class:`sluice.Pipeline`, a spec dict or a spec file path.
        rank, world_size: DDP share (default: from torch.distributed or RANK/WORLD_SIZE).
        fields: yield each batch as a tuple of these fields instead, e.g.
            ``("image", "label")`` for a loop written for a torchvision DataLoader
            (``for images, labels in loader``).
    """

    def __init__(
        self,
        pipeline: Union[Pipeline, Mapping[str, Any], PathLike],
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        fields: Optional[Sequence[str]] = None,
    ) -> None:
        super().__init__()
        self.loader = Loader(pipeline, rank=rank, world_size=world_size, output="torch")
        self.fields = tuple(fields) if fields is not None else None

    def __iter__(self) -> Iterator[Any]:
        """The next epoch's batches (see :class:`sluice.Loader`), or their ``fields``."""
        info = get_worker_info()
        if info is not None and info.num_workers > 0:
            raise RuntimeError(
                "SluiceDataset runs its own native threads: use DataLoader(..., batch_size=None, num_workers=0)"
            )
        if self.fields is not None:
            names = self.fields
            return (tuple(batch[name] for name in names) for batch in self.loader)
        return iter(self.loader)

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Runs ``epoch`` at the next iteration (like ``DistributedSampler.set_epoch``)."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> Dict[str, Any]:
        """The loader's position, for exact resumption (see :meth:`sluice.Loader.state_dict`)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes where ``state`` was taken (see :meth:`sluice.Loader.load_state_dict`)."""
        self.loader.load_state_dict(state)

    def stats(self) -> Dict[str, Any]:
        """The loader's stats (see :meth:`sluice.Loader.stats`)."""
        return self.loader.stats()


def _as_tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.from_numpy(x)


def _move(t: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        # Pinned memory makes the copy asynchronous and faster, like DataLoader(pin_memory=True).
        t = t.pin_memory()
    return t.to(device, non_blocking=non_blocking)


_BATCH_ENTRIES = frozenset(("image", "label", "key", "weight", *BOX_FIELDS))


def _move_metadata(batch: Mapping[str, Any], fields: Dict[str, Any], device: torch.device, non_blocking: bool) -> None:
    """The pipeline's metadata fields into ``fields``: numeric ones (float, int,
    multi_label) as tensors on ``device``, text and JSON (lists of str) as they are."""
    for name, value in batch.items():
        if name in _BATCH_ENTRIES:
            continue
        fields[name] = value if isinstance(value, list) else _move(_as_tensor(value), device, non_blocking)


def to_device(
    batch: Mapping[str, Any],
    device: Union[str, torch.device] = "cuda",
    mean: Optional[Sequence[float]] = IMAGENET_MEAN,
    std: Optional[Sequence[float]] = IMAGENET_STD,
    channels_last: bool = False,
    dtype: torch.dtype = torch.float32,
    non_blocking: bool = True,
) -> Batch:
    """Moves a batch to ``device`` and prepares its images there.

    uint8 images are copied as uint8 (a quarter of the float bytes; pinned first and sent
    with ``non_blocking`` when the device is CUDA), then on the device permuted from NHWC
    to NCHW, converted to ``dtype`` and normalised with ``(x / 255 - mean) / std`` (pass
    ``mean=None, std=None`` for plain ``x / 255``). Float images (from a pipeline with
    ``normalize`` or ``dtype("f32")``) are already scaled and are only moved and permuted.

    Args:
        batch: a :class:`sluice.Batch` (numpy or torch) or any mapping with ``image`` and
            ``label`` (and optionally ``weight``, ``key``).
        device: target device.
        mean, std: per-channel statistics in [0, 1] units (RGB).
        channels_last: return images in ``torch.channels_last`` memory format (which an
            NHWC batch already is, so this saves a copy and suits convolutions on tensor
            cores); otherwise contiguous NCHW.
        dtype: floating dtype of the images (e.g. ``torch.float16``).
        non_blocking: asynchronous host-to-device copies.

    Returns:
        A :class:`sluice.Batch` with ``image`` (NCHW, ``dtype``), ``label``, ``weight``,
        the box fields (``boxes``, ``box_labels``, ``box_count``, ``masks``) and the numeric
        metadata fields on ``device``; ``key`` stays on the CPU, and text and JSON fields
        stay lists of str.
    """
    device = torch.device(device)
    image = _as_tensor(batch["image"])
    layout = getattr(batch, "layout", None) or ("hwc" if image.dim() == 4 and image.shape[-1] == 3 else "chw")
    image = _move(image, device, non_blocking)
    if layout == "hwc":
        image = image.permute(0, 3, 1, 2)  # a view: NCHW shape, channels_last strides
    if image.dtype == torch.uint8:
        image = image.to(dtype)
        if mean is not None or std is not None:
            m = torch.as_tensor(mean if mean is not None else (0.0, 0.0, 0.0), dtype=dtype, device=device)
            s = torch.as_tensor(std if std is not None else (1.0, 1.0, 1.0), dtype=dtype, device=device)
            image = image.sub_(m.view(1, -1, 1, 1) * 255.0).div_(s.view(1, -1, 1, 1) * 255.0)
        else:
            image = image.div_(255.0)
    else:
        image = image.to(dtype)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    image = image.contiguous(memory_format=memory_format)

    fields: Dict[str, Any] = {"image": image, "label": _move(_as_tensor(batch["label"]), device, non_blocking)}
    if "key" in batch:
        fields["key"] = _as_tensor(batch["key"])
    if "weight" in batch and batch["weight"] is not None:
        fields["weight"] = _move(_as_tensor(batch["weight"]), device, non_blocking)
    for name in BOX_FIELDS:
        if name in batch:
            fields[name] = _move(_as_tensor(batch[name]), device, non_blocking)
    _move_metadata(batch, fields, device, non_blocking)
    return Batch(
        fields,
        epoch=getattr(batch, "epoch", -1),
        index=getattr(batch, "index", -1),
        layout="chw",
        buffer_address=0,
    )


# ---------------------------------------------------------------------------------------
# DeviceLoader: batches prefetched onto the accelerator (issue 30). Kept in its own section.
# ---------------------------------------------------------------------------------------

import collections  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
from typing import Deque, List, Protocol, Tuple  # noqa: E402

import numpy as np  # noqa: E402

__all__ += ["DeviceLoader", "PinnedRing"]

_log = logging.getLogger("sluice.torch")
_cpu_fallback_said = False


class EventLike(Protocol):
    """What :class:`PinnedRing` needs of an event (``torch.cuda.Event`` has it)."""

    def query(self) -> bool:
        """True once the work recorded before the event has completed."""
        ...

    def synchronize(self) -> None:
        """Blocks the calling thread until the event has completed."""
        ...


class PinnedRing:
    """A small ring of reusable host staging buffers (page-locked when ``pin_memory``).

    Each slot's buffer is allocated once, on first use, at the size asked for (it is only
    reallocated if a later batch needs more bytes). A slot is handed out again only after
    the event recorded after the upload that read it has completed: :meth:`acquire` waits
    for that event (``synchronize``), :meth:`try_acquire` returns None instead, so a buffer
    the device may still be reading is never written.

    Args:
        slots: buffers in the ring (>= 1).
        pin_memory: allocate page-locked memory (needs CUDA).
    """

    def __init__(self, slots: int, pin_memory: bool) -> None:
        if slots < 1:
            raise ValueError(f"a PinnedRing needs at least one slot, not {slots}")
        self._pin = pin_memory
        self._buffers: List[Optional[torch.Tensor]] = [None] * slots
        self._events: List[Optional[EventLike]] = [None] * slots
        self._held = [False] * slots
        self._next = 0
        #: Buffers allocated (the ring's whole life), and acquisitions that had to wait.
        self.allocations = 0
        self.waits = 0

    def __len__(self) -> int:
        return len(self._buffers)

    def _take(self, slot: int, nbytes: int) -> Tuple[int, torch.Tensor]:
        buf = self._buffers[slot]
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._pin)
            self._buffers[slot] = buf
            self.allocations += 1
        self._events[slot] = None
        self._held[slot] = True
        self._next = (slot + 1) % len(self._buffers)
        return slot, buf

    def _check_free(self, slot: int) -> None:
        if self._held[slot]:
            raise RuntimeError(f"PinnedRing slot {slot} was acquired and never released: release() it after its upload")

    def try_acquire(self, nbytes: int) -> Optional[Tuple[int, torch.Tensor]]:
        """The next slot and its buffer (at least ``nbytes``), or None while the upload
        that last read it may still be running."""
        slot = self._next
        self._check_free(slot)
        event = self._events[slot]
        if event is not None and not event.query():
            return None
        return self._take(slot, nbytes)

    def acquire(self, nbytes: int) -> Tuple[int, torch.Tensor]:
        """The next slot and its buffer (at least ``nbytes``), after waiting for the
        upload that last read it."""
        slot = self._next
        self._check_free(slot)
        event = self._events[slot]
        if event is not None and not event.query():
            self.waits += 1
            event.synchronize()
        return self._take(slot, nbytes)

    def release(self, slot: int, event: EventLike) -> None:
        """Gives ``slot`` back; ``event`` is recorded after the upload that reads it."""
        if not self._held[slot]:
            raise RuntimeError(f"PinnedRing slot {slot} is not held")
        self._held[slot] = False
        self._events[slot] = event


def _align(n: int, to: int = 8) -> int:
    return (n + to - 1) // to * to


class _InFlight:
    """One batch pulled from the source and on its way to the device."""

    __slots__ = ("batch", "ready", "index")

    def __init__(self, batch: Batch, ready: Optional[Any], index: int) -> None:
        self.batch = batch
        self.ready = ready
        self.index = index


class DeviceLoader:
    """Batches already on the accelerator: wraps a :class:`sluice.Loader` or
    :class:`sluice.RemoteLoader` (any :class:`sluice.LoaderLike`) and keeps the next
    ``prefetch_device`` batches uploading while the model trains on the current one::

        loader = DeviceLoader(sluice.Loader(pipe), "cuda", dtype=torch.bfloat16, channels_last=True)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:              # image: NCHW bf16, normalised, on the GPU
                loss = criterion(model(batch.image), batch.label)

    On CUDA, each batch is copied once (one ``memcpy`` on the calling thread, not on
    torch's intra-op pool) into a ring of page-locked buffers allocated once and reused
    (:class:`PinnedRing`), uploaded on a side stream with its labels and weights in one
    transfer, converted there (see :func:`to_device`: uint8 to ``dtype``, normalised,
    ``channels_last``), and handed out after the loop's current stream has been made to
    wait for it; the tensors handed out are ``record_stream``-ed on that stream. Without
    CUDA (``device="cpu"``, or CUDA absent) the same API converts on the CPU, with no
    pinned memory and no stream (logged once).

    ``state_dict()`` counts the batches the loop has *received*: batches prefetched onto
    the device but not yet handed out are not in it, so a checkpoint taken mid-epoch
    resumes with the next batch the loop would have seen. A :class:`sluice.Loader` left on
    its default thread count (one per core) is set to one thread fewer than the cores this
    process may use, so the training loop keeps a core (``threads_adjusted`` says whether
    it was); an explicit count or ``"auto"`` is kept. ``set_epoch``,
    ``load_state_dict``, ``len`` and ``stats`` pass through (``stats()`` adds
    ``device_loader``: ``device``, ``prefetch_device``, ``pinned_buffers``,
    ``pinned_waits``).

    Args:
        loader: the loader to wrap (numpy or torch output).
        device: the target device.
        prefetch_device: batches kept uploading ahead of the one handed out (>= 1).
        mean, std, dtype, channels_last: the conversion, as in :func:`to_device`.
    """

    def __init__(
        self,
        loader: Any,
        device: Union[str, torch.device] = "cuda",
        prefetch_device: int = 2,
        mean: Optional[Sequence[float]] = IMAGENET_MEAN,
        std: Optional[Sequence[float]] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
    ) -> None:
        global _cpu_fallback_said
        if prefetch_device < 1:
            raise ValueError(f"prefetch_device must be >= 1, not {prefetch_device}")
        if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise ValueError(f"dtype must be a floating dtype (torch.bfloat16, float16, float32), not {dtype}")
        self.loader = loader
        requested = torch.device(device)
        self._cuda = requested.type == "cuda" and torch.cuda.is_available()
        self.device = requested if self._cuda or requested.type != "cuda" else torch.device("cpu")
        if not self._cuda and not _cpu_fallback_said:
            _cpu_fallback_said = True
            why = "CUDA is not available" if requested.type == "cuda" else f"device is {requested}"
            _log.warning(
                "sluice.DeviceLoader: %s: converting batches on the CPU (no pinned buffers, no side stream)", why
            )
        self.prefetch_device = prefetch_device
        self.threads_adjusted = _leave_a_core(loader)
        self._convert: Dict[str, Any] = {"mean": mean, "std": std, "dtype": dtype, "channels_last": channels_last}
        self._ring = PinnedRing(prefetch_device + 1, pin_memory=self._cuda)
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None  # type: ignore[no-untyped-call]
        self._stats_on_device: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        if self._cuda and (mean is not None or std is not None):
            m = torch.as_tensor(mean if mean is not None else (0.0, 0.0, 0.0), dtype=dtype, device=self.device)
            s = torch.as_tensor(std if std is not None else (1.0, 1.0, 1.0), dtype=dtype, device=self.device)
            self._stats_on_device = (m.view(1, -1, 1, 1) * 255.0, s.view(1, -1, 1, 1) * 255.0)
        # The current epoch's batches pulled from the source but not handed out yet.
        self._in_flight: Deque[_InFlight] = collections.deque()
        self._generation = 0

    def __iter__(self) -> Iterator[Batch]:
        """Runs the next epoch of the wrapped loader (see :class:`sluice.Loader`)."""
        self._generation += 1
        self._in_flight.clear()
        return self._run(iter(self.loader), self._generation)

    def _run(self, source: Iterator[Batch], generation: int) -> Iterator[Batch]:
        exhausted = False

        def fill() -> None:
            nonlocal exhausted
            while not exhausted and len(self._in_flight) < self.prefetch_device:
                try:
                    raw = next(source)
                except StopIteration:
                    exhausted = True
                    return
                self._in_flight.append(self._start(raw))

        fill()
        while self._in_flight and generation == self._generation:
            item = self._in_flight.popleft()
            # Keep prefetch_device batches on their way while the loop works on this one.
            fill()
            yield self._hand_out(item)

    def _start(self, raw: Batch) -> _InFlight:
        """Starts moving ``raw`` to the device (on the side stream) and converting it."""
        index = int(getattr(raw, "index", -1))
        if not self._cuda:
            return _InFlight(to_device(raw, self.device, **self._convert), None, index)
        image = np.ascontiguousarray(_as_numpy(raw["image"]))
        label = np.ascontiguousarray(_as_numpy(raw["label"]), dtype=np.int64)
        weight = raw["weight"] if "weight" in raw and raw["weight"] is not None else None
        weight_np = None if weight is None else np.ascontiguousarray(_as_numpy(weight), dtype=np.float32)
        label_at = _align(image.nbytes)
        weight_at = _align(label_at + label.nbytes)
        total = weight_at + (0 if weight_np is None else weight_np.nbytes)
        slot, host = self._ring.acquire(total)
        staging = host[:total].numpy()
        # One memcpy per field on this thread (numpy releases the GIL), none on torch's pool.
        np.copyto(staging[: image.nbytes], image.reshape(-1).view(np.uint8))
        np.copyto(staging[label_at : label_at + label.nbytes], label.view(np.uint8))
        if weight_np is not None:
            np.copyto(staging[weight_at:total], weight_np.view(np.uint8))
        stream = self._stream
        assert stream is not None
        with torch.cuda.stream(stream):
            dev = host[:total].to(self.device, non_blocking=True)
            uploaded = torch.cuda.Event()  # type: ignore[no-untyped-call]
            uploaded.record(stream)
            self._ring.release(slot, uploaded)
            fields: Dict[str, Any] = {
                "image": self._image_on_device(dev[: image.nbytes], image, getattr(raw, "layout", None)),
                "label": dev[label_at : label_at + label.nbytes].view(torch.int64),
            }
            if weight_np is not None:
                fields["weight"] = dev[weight_at:total].view(torch.float32)
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record(stream)
        if "key" in raw:
            fields["key"] = _as_tensor(raw["key"])
        for name in BOX_FIELDS:
            if name in raw:
                # Small next to the image: moved on their own, after it.
                fields[name] = _move(_as_tensor(raw[name]), self.device, True)
        _move_metadata(raw, fields, self.device, True)
        out = Batch(fields, getattr(raw, "epoch", -1), index, "chw", 0)
        return _InFlight(out, ready, index)

    def _image_on_device(self, raw: torch.Tensor, image: Any, layout: Optional[str]) -> torch.Tensor:
        """The uploaded image bytes as ``dtype`` NCHW, normalised (the arithmetic of
        :func:`to_device`, with the statistics kept on the device: no per-batch upload)."""
        x = raw.view(_TORCH_DTYPES[image.dtype.str]).view(image.shape)
        if (layout or ("hwc" if x.dim() == 4 and x.shape[-1] == 3 else "chw")) == "hwc":
            x = x.permute(0, 3, 1, 2)
        dtype = self._convert["dtype"]
        if x.dtype == torch.uint8:
            x = x.to(dtype)
            if self._stats_on_device is not None:
                m, s = self._stats_on_device
                x = x.sub_(m).div_(s)
            else:
                x = x.div_(255.0)
        else:
            x = x.to(dtype)
        return x.contiguous(
            memory_format=torch.channels_last if self._convert["channels_last"] else torch.contiguous_format
        )

    def _hand_out(self, item: _InFlight) -> Batch:
        if item.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(item.ready)
            for value in item.batch.values():
                if isinstance(value, torch.Tensor) and value.is_cuda:
                    # Allocated on the side stream, used on this one: keep the allocator from
                    # reusing its memory before this stream is done with it.
                    value.record_stream(current)
        return item.batch

    def __len__(self) -> int:
        """Batches per epoch (the wrapped loader's)."""
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Makes the next ``iter()`` run ``epoch`` (batches in flight are dropped)."""
        self._drop_in_flight()
        self.loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the wrapped loader is in."""
        return int(self.loader.epoch)

    def _drop_in_flight(self) -> None:
        self._generation += 1
        self._in_flight.clear()

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped loader's state as of the last batch handed out by this loader:
        batches prefetched but not yet received by the loop are not counted."""
        state: Dict[str, Any] = dict(self.loader.state_dict())
        pending = list(self._in_flight)
        if not pending:
            return state
        if isinstance(state.get("batch"), int):  # sluice.Loader: batches handed out, in order
            state["batch"] = state["batch"] - len(pending)
        elif isinstance(state.get("delivered"), list):  # sluice.RemoteLoader: batch ids delivered
            not_received = {item.index for item in pending}
            state["delivered"] = [b for b in state["delivered"] if b not in not_received]
        else:
            raise TypeError(
                f"DeviceLoader cannot tell which batches {type(self.loader).__name__}.state_dict() counts "
                "(neither 'batch' nor 'delivered'): take the state between epochs"
            )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes where ``state`` was taken (batches in flight are dropped)."""
        self._drop_in_flight()
        self.loader.load_state_dict(state)

    def stats(self) -> Dict[str, Any]:
        """The wrapped loader's stats, plus ``device_loader``."""
        stats: Dict[str, Any] = dict(self.loader.stats())
        stats["device_loader"] = {
            "device": str(self.device),
            "prefetch_device": self.prefetch_device,
            "pinned_buffers": self._ring.allocations,
            "pinned_waits": self._ring.waits,
        }
        return stats

    def __repr__(self) -> str:
        return f"DeviceLoader({self.loader!r}, device={str(self.device)!r}, prefetch_device={self.prefetch_device})"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _leave_a_core(loader: Any) -> bool:
    """A loader on the default thread count (one per core) gets one thread fewer, so the
    trainer's thread keeps a core (issue 30: the hand-off and the training loop compete
    with the decode threads otherwise). An explicit count or ``"auto"`` is left alone."""
    pipeline = getattr(loader, "pipeline", None)
    if pipeline is None or not hasattr(loader, "set_threads"):
        return False
    if pipeline.to_dict().get("threads") != 0 or _cores() < 2:
        return False
    loader.set_threads(_cores() - 1)
    return True


def _as_numpy(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.numpy()
    return np.asarray(x)


_TORCH_DTYPES: Dict[str, torch.dtype] = {
    "|u1": torch.uint8,
    "<f4": torch.float32,
    "<f2": torch.float16,
}


__all__ += ["report_cuda_utilization"]


def report_cuda_utilization(loader: Any, device: Union[int, str, torch.device, None] = None) -> Optional[float]:
    """Reads the GPU's utilisation (``torch.cuda.utilization``, NVML's busy share over its
    last sample period) and reports it to ``loader`` (a :class:`sluice.Loader`,
    :class:`sluice.RemoteLoader` or :class:`SluiceDataset`) as its accelerator's busy
    fraction, as FastMatch reads the GPU next to the CPU. Call it every few steps: a report
    counts for 10 s. Returns the fraction reported, or None where there is no counter (no
    CUDA, or no NVML): the loader then keeps its own step timing."""
    if not torch.cuda.is_available():
        return None
    try:
        percent = torch.cuda.utilization(device)
    except (RuntimeError, ModuleNotFoundError, ImportError):
        return None
    target = loader.loader if isinstance(loader, SluiceDataset) else loader
    fraction = float(percent) / 100.0
    target.report_accelerator_busy(fraction)
    return fraction
