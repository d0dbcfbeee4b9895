"""Streaming for continual learning: samples arrive as entries of a Redis stream.

A producer pushes a dataset (``push``, or ``sluice stream-push`` from the shell); a
``StreamLoader`` reads the stream through the job's consumer group, decodes and augments
each sample with the same ops as a file pipeline, and yields batches of ``new_per_batch``
new samples plus ``rehearsal_per_batch`` samples drawn from a rehearsal buffer of past
ones (field ``rehearsal``: a bool per sample)::

    import sluice, sluice.stream

    sluice.stream.push("data/mnist", url="redis://127.0.0.1:6379/", stream="mnist",
                       order="class-incremental", classes_per_task=2)
    pipe = sluice.Pipeline.image_folder("unused").decode().center_crop(28)
    loader = sluice.stream.StreamLoader(
        "redis://127.0.0.1:6379/", "mnist", group="job-1", ops=pipe.ops,
        new_per_batch=10, rehearsal_per_batch=10,
        rehearsal={"capacity": 500, "policy": "class_balanced", "dir": "ckpt/rehearsal"},
    )
    for batch in loader:
        train(batch.image, batch.label)
        torch.save({"model": model.state_dict(), "loader": loader.state_dict()}, "ckpt.pt")

Each entry is trained on exactly once per job, across restarts, when the trainer saves
``state_dict()`` after each step (or every few) and resumes with ``load_state_dict``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from . import _sluice
from .loader import Batch, _import_torch

__all__ = ["StreamLoader", "push"]

PathLike = Union[str, "os.PathLike[str]"]


def push(
    dataset: PathLike,
    url: str = "redis://127.0.0.1:6379/",
    stream: str = "sluice",
    rate: float = 0.0,
    order: str = "as-listed",
    classes_per_task: int = 2,
    seed: int = 0,
    limit: Optional[int] = None,
    end: bool = True,
    reconnect_ms: int = 10_000,
) -> Dict[str, Any]:
    """Pushes ``dataset`` (an ImageFolder root, a file list or a ``.tar`` shard) into
    ``stream``: one entry per sample (``id``, ``label``, ``image`` bytes) at ``rate``
    samples/s (0: as fast as possible), in ``order`` (``"as-listed"``, ``"shuffled"`` or
    ``"class-incremental"``: tasks of ``classes_per_task`` classes, each shuffled), then an
    end marker unless ``end=False``. Returns ``{"pushed", "bytes", "seconds"}``."""
    if order not in ("as-listed", "shuffled", "class-incremental"):
        raise ValueError(f"order must be 'as-listed', 'shuffled' or 'class-incremental', not {order!r}")
    options = {
        "url": url,
        "stream": stream,
        "rate": float(rate),
        "order": order,
        "classes_per_task": classes_per_task,
        "seed": seed,
        "limit": limit,
        "end": end,
        "reconnect_ms": reconnect_ms,
    }
    report: Dict[str, Any] = json.loads(_sluice.stream_push(os.fspath(dataset), json.dumps(options)))
    return report


class StreamLoader:
    """Batches from a Redis stream: ``new_per_batch`` new samples plus
    ``rehearsal_per_batch`` rehearsal samples each.

    Args:
        url: the broker, ``redis://host:port/``.
        stream: the stream's key.
        group: the job's consumer group (each job reads the whole stream once).
        ops: the op list, as dicts (e.g. ``Pipeline(...).ops``); must start with decode.
        rehearsal: ``{"capacity": N, "policy": "reservoir" | "class_balanced", "dir": path}``;
            for a buffer distributed over the learners add ``"peers": ["host:port", ...]``
            (every learner's, by rank) and ``"rank": i``: this learner serves its shard on
            ``peers[rank]`` and draws uniformly from all shards, the peers' samples fetched
            in the background. The shard servers answer only learners with the job's token:
            ``"token": "..."`` here or the environment variable ``SLUICE_PEER_TOKEN`` (the
            same on every learner; without either the loader refuses to start).
            ``"persist": True`` keeps the exemplars in ``dir/<stream>-<group>-<consumer>.exemplars``
            as they are kept, so a loader started again without a checkpoint has its buffer back.
        rate: ``{"buffer": N, "read_ahead": batches, "overflow": "backpressure" | "drop_oldest" |
            "drop_random" | "spill", "underflow": "wait" | "rehearsal", "fill_after_ms": ms}``;
            under backpressure a learner takes at most ``read_ahead`` (default 2) batches of new
            samples from the group ahead of its trainer, so learners of one group share a backlog.
        consumer: this learner's name in the group.
        threads: decoding threads: a count (0: one per core) or ``"auto"`` (the pool sized
            to what the trainer consumes, as for a file loader).
        claim_idle_ms: the liveness period: a learner whose liveness key (refreshed in the
            background) is this old is dead, and its entries go to the live learners.
        max_unacked: entries held unacknowledged without a ``state_dict()``, at most; take
            a state at least every that many new samples.
        output: ``"numpy"`` or ``"torch"``.

    Threads: while one thread waits in ``next()`` (for as long as the stream is empty),
    another may call ``stats()`` and ``rehearsal_ids()``, which answer at once;
    ``state_dict()`` and ``load_state_dict()`` wait for that ``next()`` with the GIL
    released, and Ctrl-C interrupts them (from a signal handler run during ``next()``
    they raise :class:`sluice.SluiceError` instead of waiting for themselves).
    """

    def __init__(
        self,
        url: str,
        stream: str,
        group: str,
        ops: Sequence[Mapping[str, Any]],
        new_per_batch: int,
        rehearsal_per_batch: int = 0,
        rehearsal: Optional[Mapping[str, Any]] = None,
        rate: Optional[Mapping[str, Any]] = None,
        consumer: str = "learner-0",
        seed: int = 0,
        threads: Union[int, str] = 0,
        on_error: str = "fail",
        claim_idle_ms: int = 30_000,
        max_unacked: int = 65_536,
        reconnect_ms: int = 30_000,
        output: str = "numpy",
    ) -> None:
        spec: Dict[str, Any] = {
            "url": url,
            "stream": stream,
            "group": group,
            "consumer": consumer,
            "ops": [dict(op) for op in ops],
            "new_per_batch": new_per_batch,
            "rehearsal_per_batch": rehearsal_per_batch,
            "seed": seed,
            "threads": threads,
            "on_error": on_error,
            "claim_idle_ms": claim_idle_ms,
            "max_unacked": max_unacked,
            "reconnect_ms": reconnect_ms,
        }
        if rehearsal is not None:
            r = dict(rehearsal)
            if "dir" in r:
                r["dir"] = os.fspath(r["dir"])
            spec["rehearsal"] = r
        if rate is not None:
            spec["rate"] = dict(rate)
        if output not in ("numpy", "torch"):
            raise ValueError(f"output must be 'numpy' or 'torch', not {output!r}")
        self._torch = _import_torch() if output == "torch" else None
        self._native = _sluice.StreamLoader(json.dumps(spec))

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        got = self._native.next()
        if got is None:
            raise StopIteration
        raw, rehearsal = got
        fields: Dict[str, Any] = {"image": raw.image, "label": raw.label, "key": raw.key, "rehearsal": rehearsal}
        if self._torch is not None:
            fields = {name: self._torch.from_numpy(arr) for name, arr in fields.items()}
        return Batch(fields, epoch=raw.epoch, index=raw.index, layout=raw.layout, buffer_address=raw.buffer_address)

    def state_dict(self) -> Dict[str, Any]:
        """Where the job stands: the ledger of sample ids handled, counters, and the
        rehearsal buffer (its contents written to a file the state names). Save it with
        the model after a step; entries are acknowledged to the broker once a state
        covering them was taken and the next batch is asked for."""
        state: Dict[str, Any] = json.loads(self._native.state_json())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from ``state`` (before the first batch): entries this learner left
        unacknowledged are read again, those already in the ledger skipped."""
        self._native.load_state_json(json.dumps(dict(state)))

    def stats(self) -> Dict[str, Any]:
        """``arrival_rate`` and ``consumption_rate`` (samples/s, last few seconds),
        ``backlog``, ``read_ahead``, and the counts: ``trained``, ``rehearsed``, ``filled``,
        ``dropped``, ``spilled``, ``duplicates``, ``malformed``, ``claimed``, ``batches``;
        with a distributed buffer ``rehearsed_remote`` (drawn from peers), ``remote_missed``
        (meant for a peer, drawn locally: nothing had arrived), ``peer_ready``, ``peer_errors``.
        About decoding, as in ``Loader.stats()``: ``threads``, ``wait_s``, ``op_seconds``
        (``[op, seconds]`` pairs) and ``op_percentiles`` (``{"op", "samples", "p50_s",
        "p99_s"}`` per op), and ``autoscale`` under ``threads="auto"``."""
        stats: Dict[str, Any] = json.loads(self._native.stats_json())
        return stats

    def rehearsal_ids(self) -> List[int]:
        """Ids of the samples now in the rehearsal buffer."""
        ids: List[int] = self._native.rehearsal_ids()
        return ids
