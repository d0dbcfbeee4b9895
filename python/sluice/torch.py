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

from .loader import Batch, Loader
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
    """

    def __init__(
        self,
        pipeline: Union[Pipeline, Mapping[str, Any], PathLike],
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.loader = Loader(pipeline, rank=rank, world_size=world_size, output="torch")

    def __iter__(self) -> Iterator[Batch]:
        """The next epoch's batches (see :class:`sluice.Loader`)."""
        info = get_worker_info()
        if info is not None and info.num_workers > 0:
            raise RuntimeError(
                "SluiceDataset runs its own native threads: use DataLoader(..., batch_size=None, num_workers=0)"
            )
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
        A :class:`sluice.Batch` with ``image`` (NCHW, ``dtype``), ``label`` and ``weight``
        on ``device``; ``key`` stays on the CPU.
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
    return Batch(
        fields,
        epoch=getattr(batch, "epoch", -1),
        index=getattr(batch, "index", -1),
        layout="chw",
        buffer_address=0,
    )
