"""The interface :class:`sluice.Loader` and :class:`sluice.RemoteLoader` share.

Code that trains from either takes a :class:`LoaderLike`::

    def train(loader: sluice.LoaderLike, epochs: int) -> None:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                ...

It is a :func:`typing.runtime_checkable` protocol: ``isinstance(x, sluice.LoaderLike)``
checks that ``x`` has every member (not their signatures; mypy checks those).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterator, Mapping, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .loader import Batch, ImportanceRecorder

__all__ = ["LoaderLike"]


@runtime_checkable
class LoaderLike(Protocol):
    """What every sluice loader does: epochs of batches, positioning, checkpoints, stats
    and importance reports."""

    def __iter__(self) -> Iterator[Batch]:
        """Runs the next epoch (or the rest of the current one)."""
        ...

    def __len__(self) -> int:
        """Batches per epoch."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Makes the next ``iter(loader)`` run ``epoch`` from its first batch."""
        ...

    @property
    def epoch(self) -> int:
        """The epoch the loader is in (or will start next)."""
        ...

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader stands, as a plain dict."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues exactly where ``state`` was taken."""
        ...

    def stats(self) -> Dict[str, Any]:
        """What the loader has done: ``batches``, ``samples``, ``elapsed_s``,
        ``samples_per_s``, ``wait_s`` and what else the loader knows."""
        ...

    def report(self, keys: Any, losses: Any) -> Dict[str, int]:
        """Reports per-sample importance (losses) for ``keys``; returns the counts of values
        ``accepted``, ``refused`` and ``clamped`` (and more where the loader knows more)."""
        ...

    def update_gradient_info(self, keys: Any, grads: Any) -> Dict[str, int]:
        """Reports per-sample gradient norms (or gradients) for ``keys``; returns the counts
        as :meth:`report` does."""
        ...

    def record_importance(self, keys: Any) -> ImportanceRecorder:
        """A context that reports one step's per-sample values when it ends."""
        ...

    @property
    def rank(self) -> int:
        """This process's rank."""
        ...

    @property
    def world_size(self) -> int:
        """Ranks in the job."""
        ...

    @property
    def output(self) -> str:
        """``"numpy"`` or ``"torch"``."""
        ...

    @property
    def samples_per_epoch(self) -> int:
        """Samples per epoch."""
        ...

    @property
    def fingerprint(self) -> str:
        """Fingerprint of the data (and, remotely, of the pipeline)."""
        ...
