"""JAX integration: :class:`JaxLoader` yields a sluice loader's batches as dicts of
``jax.Array`` s.

Without a sharding, each field goes through DLPack: on the CPU backend the ``jax.Array``
reads sluice's own buffer (no copy; the buffer stays alive while the array does) when that
buffer is 64-byte aligned, which XLA requires; sluice's batch buffers are 16-byte aligned,
so some batches are copied once by XLA. Integer
fields (``label``, ``key``) are int64 in sluice; with JAX's default 32-bit mode they become
int32 arrays (a copy of a few bytes per sample). With a ``sharding`` (e.g.
``NamedSharding(mesh, PartitionSpec("data"))`` over the local devices), each field is
``jax.device_put`` across the devices, split along the batch dimension: that is a copy to
each device, as it must be::

    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from sluice.jax import JaxLoader

    mesh = Mesh(np.array(jax.local_devices()), ("data",))
    loader = JaxLoader(sluice.Loader(pipe), sharding=NamedSharding(mesh, P("data")))
    for batch in loader:
        params, loss = step(params, batch["image"], batch["label"])

``state_dict`` / ``load_state_dict`` / ``set_epoch`` / ``stats`` / ``len`` are the wrapped
loader's: JaxLoader pulls a batch only when the loop asks for it, so the state always
counts the batches the loop received.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Optional

import numpy as np

try:
    import jax
    import jax.dlpack
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("sluice.jax needs JAX: pip install jax (or 'jax[cpu]')") from e

__all__ = ["JaxLoader"]


def _to_jax(arr: Any, sharding: Optional[Any]) -> Any:
    arr = np.asarray(arr)
    if sharding is not None:
        return jax.device_put(arr, sharding)
    wanted = jax.dtypes.canonicalize_dtype(arr.dtype)  # int64 -> int32 unless jax_enable_x64
    if wanted != arr.dtype:
        arr = arr.astype(wanted)
    if arr.dtype.itemsize > 0 and arr.flags.c_contiguous and arr.flags.writeable:
        return jax.dlpack.from_dlpack(arr)
    return jax.numpy.asarray(arr)


class JaxLoader:
    """Iterates a :class:`sluice.LoaderLike`'s batches as ``{field: jax.Array}`` dicts.

    Args:
        loader: a :class:`sluice.Loader` or :class:`sluice.RemoteLoader` (numpy output).
        sharding: a ``jax.sharding.Sharding`` to ``device_put`` every field with (data
            parallelism over the local devices: split along the batch dimension); None
            keeps the arrays on the default device, zero-copy through DLPack on the CPU.
    """

    def __init__(self, loader: Any, sharding: Optional[Any] = None) -> None:
        self.loader = loader
        self.sharding = sharding

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        """The next epoch's batches (see :class:`sluice.Loader`)."""
        for batch in self.loader:
            yield {name: _to_jax(value, self.sharding) for name, value in batch.items() if value is not None}

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Runs ``epoch`` at the next iteration."""
        self.loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the wrapped loader is in."""
        return int(self.loader.epoch)

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped loader's position (batches the loop received)."""
        state: Dict[str, Any] = self.loader.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes where ``state`` was taken."""
        self.loader.load_state_dict(state)

    def stats(self) -> Dict[str, Any]:
        """The wrapped loader's stats."""
        stats: Dict[str, Any] = self.loader.stats()
        return stats

    def __repr__(self) -> str:
        return f"JaxLoader({self.loader!r}, sharding={self.sharding!r})"
