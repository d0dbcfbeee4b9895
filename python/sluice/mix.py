"""MixUp and CutMix on whole batches, where the batch already is (GPU or CPU), with
``torchvision.transforms.v2`` semantics: each image is mixed with the one before it in the
batch (``roll(1, 0)``), and labels become soft targets mixed with the same weight.

Unlike torchvision's, the random draws come from a generator seeded by ``(seed, epoch,
batch index)``, so a run is reproducible and a resumed run mixes each batch as the original
did. Use them after :func:`sluice.torch.to_device` (NCHW images)::

    mix = MixUpOrCutMix(num_classes=1000, seed=0)     # torchvision's RandomChoice of both
    for epoch in range(epochs):
        mix.set_epoch(epoch)
        for i, batch in enumerate(data):
            b = to_device(batch, "cuda")
            images, targets = mix(b.image, b.label, batch_index=i)
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple, Union

import numpy as np
import torch

__all__ = ["MixUp", "CutMix", "MixUpOrCutMix"]

Params = Dict[str, Union[float, Tuple[int, int, int, int]]]


class _BatchMix:
    """What MixUp and CutMix share: the Beta(alpha, alpha) draw, the per-batch generator
    and the label mixing."""

    def __init__(self, alpha: float, num_classes: Optional[int], seed: int) -> None:
        if not (alpha > 0.0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a positive number; got {alpha}")
        if num_classes is not None and num_classes < 1:
            raise ValueError(f"num_classes must be at least 1; got {num_classes}")
        self.alpha = float(alpha)
        self.num_classes = num_classes
        self.seed = int(seed)
        self.epoch = 0
        self._next_index = 0

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch the next batches belong to; batch indices count from 0 again."""
        self.epoch = int(epoch)
        self._next_index = 0

    def generator(self, batch_index: int, epoch: Optional[int] = None) -> np.random.Generator:
        """The generator of one batch: seeded by ``(seed, epoch, batch_index)`` only."""
        ep = self.epoch if epoch is None else int(epoch)
        return np.random.default_rng([self.seed & (2**64 - 1), ep, int(batch_index)])

    def params(self, size: Tuple[int, int], batch_index: int, epoch: Optional[int] = None) -> Params:
        """The parameters drawn for one batch of ``size = (height, width)`` images."""
        return self._draw(self.generator(batch_index, epoch), size)

    def _draw(self, rng: np.random.Generator, size: Tuple[int, int]) -> Params:
        raise NotImplementedError

    def mix_labels(self, labels: torch.Tensor, lam: float) -> torch.Tensor:
        """Soft targets: one-hot (for class indices) mixed as torchvision's ``_mixup_label``."""
        if labels.ndim == 1:
            if self.num_classes is None:
                raise ValueError("num_classes must be given when labels are class indices")
            labels = torch.nn.functional.one_hot(labels.long(), num_classes=self.num_classes)
        elif labels.ndim != 2:
            raise ValueError(f"labels must be class indices (B,) or probabilities (B, C); got {tuple(labels.shape)}")
        if not labels.dtype.is_floating_point:
            labels = labels.float()
        return labels.roll(1, 0).mul_(1.0 - lam).add_(labels.mul(lam))

    def apply(self, images: torch.Tensor, labels: torch.Tensor, params: Params) -> Tuple[torch.Tensor, torch.Tensor]:
        """Mixes ``images`` (B, C, H, W) and ``labels`` with given parameters."""
        raise NotImplementedError

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, batch_index: Optional[int] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Mixes one batch. ``batch_index`` defaults to a count of calls since
        :meth:`set_epoch`; pass it to stay exact across a resume."""
        if images.ndim != 4 or images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"expected images (B, C, H, W) and labels with the same B; got {tuple(images.shape)}, "
                f"{tuple(labels.shape)}"
            )
        index = self._next_index if batch_index is None else int(batch_index)
        self._next_index = index + 1
        size = (int(images.shape[-2]), int(images.shape[-1]))
        return self.apply(images, labels, self.params(size, index))


class MixUp(_BatchMix):
    """torchvision's ``MixUp(alpha, num_classes)``: ``lam ~ Beta(alpha, alpha)``, images
    ``lam * x + (1 - lam) * x.roll(1, 0)``, labels likewise."""

    def __init__(self, alpha: float = 1.0, num_classes: Optional[int] = None, seed: int = 0) -> None:
        super().__init__(alpha, num_classes, seed)

    def _draw(self, rng: np.random.Generator, size: Tuple[int, int]) -> Params:
        return {"lam": float(rng.beta(self.alpha, self.alpha))}

    def apply(self, images: torch.Tensor, labels: torch.Tensor, params: Params) -> Tuple[torch.Tensor, torch.Tensor]:
        """Mixes with ``params["lam"]`` exactly as torchvision's ``MixUp.transform``."""
        lam = float(params["lam"])  # type: ignore[arg-type]
        out = images.roll(1, 0).mul_(1.0 - lam).add_(images.mul(lam))
        return out, self.mix_labels(labels, lam)


class CutMix(_BatchMix):
    """torchvision's ``CutMix(alpha, num_classes)``: a box of area ``(1 - lam)`` centred at
    a uniform point (clipped to the image) takes the previous image's pixels; labels are
    mixed with the box's actual area."""

    def __init__(self, alpha: float = 1.0, num_classes: Optional[int] = None, seed: int = 0) -> None:
        super().__init__(alpha, num_classes, seed)

    def _draw(self, rng: np.random.Generator, size: Tuple[int, int]) -> Params:
        lam = float(rng.beta(self.alpha, self.alpha))
        h, w = size
        r_x = int(rng.integers(w))
        r_y = int(rng.integers(h))
        r = 0.5 * math.sqrt(1.0 - lam)
        r_w_half, r_h_half = int(r * w), int(r * h)
        x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
        x2, y2 = min(r_x + r_w_half, w), min(r_y + r_h_half, h)
        lam_adjusted = float(1.0 - (x2 - x1) * (y2 - y1) / (w * h))
        return {"box": (x1, y1, x2, y2), "lam_adjusted": lam_adjusted}

    def apply(self, images: torch.Tensor, labels: torch.Tensor, params: Params) -> Tuple[torch.Tensor, torch.Tensor]:
        """Pastes ``params["box"]`` as torchvision's ``CutMix.transform``."""
        x1, y1, x2, y2 = params["box"]  # type: ignore[misc]
        out = images.clone()
        out[..., y1:y2, x1:x2] = images.roll(1, 0)[..., y1:y2, x1:x2]
        return out, self.mix_labels(labels, float(params["lam_adjusted"]))  # type: ignore[arg-type]


class MixUpOrCutMix(_BatchMix):
    """torchvision's recipe ``RandomChoice([CutMix(alpha=cutmix_alpha), MixUp(alpha=mixup_alpha)])``:
    each batch is one or the other with equal probability, drawn from the same per-batch
    generator as the parameters."""

    def __init__(
        self, mixup_alpha: float = 0.2, cutmix_alpha: float = 1.0, num_classes: Optional[int] = None, seed: int = 0
    ) -> None:
        super().__init__(1.0, num_classes, seed)
        self.mixup = MixUp(mixup_alpha, num_classes, seed)
        self.cutmix = CutMix(cutmix_alpha, num_classes, seed)

    def _draw(self, rng: np.random.Generator, size: Tuple[int, int]) -> Params:
        if rng.random() < 0.5:
            return {"which": 0.0, **self.cutmix._draw(rng, size)}
        return {"which": 1.0, **self.mixup._draw(rng, size)}

    def apply(self, images: torch.Tensor, labels: torch.Tensor, params: Params) -> Tuple[torch.Tensor, torch.Tensor]:
        """CutMix when ``params["which"] == 0``, else MixUp."""
        chosen: _BatchMix = self.cutmix if params["which"] == 0.0 else self.mixup
        return chosen.apply(images, labels, params)
