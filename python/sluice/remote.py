"""The remote loader: batches preprocessed by a sluice service (``sluice service
dispatcher`` and ``sluice service worker`` processes, or ``sluice service up``) instead of
this process's CPUs.

The same interface as :class:`sluice.Loader` (both are :class:`sluice.LoaderLike`):
``iter(loader)`` runs an epoch, ``set_epoch``, ``state_dict()`` / ``load_state_dict()``
resume exactly, ``stats()``. Every sample arrives exactly once per epoch even when a worker
dies or the dispatcher restarts; clients naming the same job share its stream, each getting
disjoint batches.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from . import _sluice
from .loader import (
    Batch,
    ImportanceRecorder,
    _as_list,
    _default_shard,
    _gradient_norms,
    _import_torch,
    _spec_json,
    _Traced,
)
from .map_workers import apply_map_batch, import_map_batch, raw_fields
from .pipeline import PathLike, Pipeline

__all__ = ["RemoteLoader", "RemoteBatchIterator"]


class RemoteBatchIterator(Iterator[Batch]):
    """The batches of one epoch from the service, in arrival order."""

    __slots__ = ("_native", "_torch", "_epoch", "_done", "_map_batch")

    def __init__(self, native: Any, torch: Any, map_batch: Optional[Tuple[Any, str, int, int]] = None) -> None:
        """Starts streaming the native loader's current epoch; ``map_batch`` is the spec's
        (function, name, seed, rank), run on each batch here as it arrives."""
        native.start_epoch()
        self._native = native
        self._torch = torch
        self._map_batch = map_batch
        self._epoch = int(native.epoch())
        self._done = False

    def __iter__(self) -> "RemoteBatchIterator":
        return self

    def __next__(self) -> Batch:
        if self._done:
            raise StopIteration
        raw = self._native.next_batch()
        if raw is None:
            self._done = True
            raise StopIteration
        fields = raw_fields(raw)
        if self._map_batch is not None:
            fn, name, seed, rank = self._map_batch
            fields = apply_map_batch(fn, name, fields, raw.epoch, raw.index, seed, rank)
        if self._torch is not None:
            fields = {name: self._torch.from_numpy(arr) for name, arr in fields.items()}
        return Batch(fields, raw.epoch, raw.index, raw.layout, raw.buffer_address)

    @property
    def epoch(self) -> int:
        """The epoch this iterator runs."""
        return self._epoch


class RemoteLoader(_Traced):
    """Iterates a pipeline's batches as produced by a sluice service.

    Args:
        pipeline: a :class:`sluice.Pipeline`, a spec dict, or the path of a spec file. Its
            paths must lie under the service's ``--allow-root`` folders.
        dispatcher: the dispatcher's address, ``host:port``.
        job: the job's name; loaders naming the same job share its epochs.
        token: the service's shared token (default: ``$SLUICE_TOKEN``).
        output: ``"numpy"`` or ``"torch"``.
        tasks_in_flight: tasks fetched at once (keeps every worker busy).
        parallel_epochs: when this loader creates the job, ``N >= 2`` makes each epoch N
            full passes over the data, each in its own order (e.g. N = workers); the default
            is a distributed epoch (every sample once). TLS: set ``$SLUICE_TLS_CA``.
        compression: ``None`` (default) or ``"zstd"``: workers compress pixels for this
            loader (a delta filter, then zstd). Worth it only when the network is slower
            than the compressor (see BENCHMARKS.md); on loopback or fast links it costs
            throughput.
        data_plane: ``"auto"`` (default): batches from workers on this machine come
            through shared memory, the rest over TCP; ``"tcp"`` or ``"grpc"`` force one.
        tls_ca: the CA certificate (PEM) of the service: talk TLS to the dispatcher and
            workers (default: ``$SLUICE_TLS_CA``; unset: plain TCP).
        connect_timeout: seconds to keep retrying a dispatcher that cannot be reached
            before giving up.
        trace: a path to record a profiling trace of the loader's whole life to (Perfetto
            protobuf, or Chrome JSON for ``.json``), in one timeline: for each batch, the
            worker's build (on a track per worker process, moved into this machine's
            clock with the connection's measured offset), its arrival here, the trainer's
            wait for it, its hand-over (with a flow arrow from the build) and the
            trainer's time with it. Tasks already running when a :meth:`trace` block
            starts bring no build times. The workers' per-op events are in their own
            files (``sluice service worker --trace-dir``; ``sluice trace-merge`` adds them);
            written when the loader is closed (:meth:`close_trace`, garbage collection or
            interpreter exit). For one block only, use :meth:`trace`.

        autoscale: ``True`` when the trainer relies on the service scaling its workers to
            what it consumes (``sluice service up --autoscale fastmatch --min-workers A
            --max-workers B``): a dispatcher started without ``--autoscale`` is refused
            with an error naming this option. Either way, the loader's heartbeats carry
            what the autoscaler reads: batches taken and time spent waiting for them
            (consumption = batches over the time between ``next()`` calls minus waits).
            See docs/autoscaling.md.

    Every failure is a :class:`sluice.ServiceError` (a :class:`sluice.SluiceError`) and
    also the builtin a caller would catch.

    Threads: while one thread waits for a batch, another may call any method. What reads
    (``len()``, ``epoch``, ``stats()``, ``job``, the counters) answers at once, as of the
    last batch handed out. ``state_dict``, ``load_state_dict``, ``set_epoch``, ``report``,
    ``update_gradient_info``, ``trace`` and ``iter()`` need the loader between two
    batches: they wait for the one in progress with the GIL released, and Ctrl-C
    interrupts them (from a signal handler run during ``next()`` they raise
    :class:`sluice.SluiceError` instead of waiting for themselves).

    Raises:
        SpecError: the spec is invalid. ServicePermissionError (a ``PermissionError``): a
        path outside the allowed roots; ServiceAuthError (also one) a wrong token.
        ServiceUnavailableError (a ``ConnectionError``): the dispatcher cannot be reached.
        JobConflictError (a ``ValueError``): the job exists with another pipeline.
    """

    def __init__(
        self,
        pipeline: Union[Pipeline, Mapping[str, Any], PathLike],
        dispatcher: str = "127.0.0.1:7070",
        job: str = "default",
        token: Optional[str] = None,
        output: str = "numpy",
        tasks_in_flight: int = 4,
        parallel_epochs: int = 0,
        compression: Optional[str] = None,
        data_plane: str = "auto",
        tls_ca: Optional[PathLike] = None,
        connect_timeout: float = 60.0,
        trace: Optional[PathLike] = None,
        autoscale: bool = False,
    ) -> None:
        if output not in ("numpy", "torch"):
            raise ValueError(f"output must be 'numpy' or 'torch', not {output!r}")
        self._torch = _import_torch() if output == "torch" else None
        self._output = output
        self._rank, self._world_size = _default_shard(None, None)
        spec_json = _spec_json(pipeline)
        name = json.loads(spec_json).get("map_batch")
        seed = int(json.loads(spec_json).get("seed", 0))
        self._map_batch = None if name is None else (import_map_batch(name), name, seed, self._rank)
        self._native = _sluice.RemoteLoader(
            spec_json,
            dispatcher,
            job,
            token,
            tasks_in_flight,
            parallel_epochs,
            compression or "none",
            data_plane,
            None if tls_ca is None else os.fspath(tls_ca),
            connect_timeout,
            autoscale,
        )
        self._record_trace(trace)

    def __iter__(self) -> RemoteBatchIterator:
        """Runs the rest of the current epoch; an epoch left unfinished is resumed exactly
        (without the batches already handed out)."""
        return RemoteBatchIterator(self._native, self._torch, self._map_batch)

    def __len__(self) -> int:
        """Batches per epoch."""
        return int(self._native.batches_per_epoch())

    def set_epoch(self, epoch: int) -> None:
        """Makes the next ``iter(loader)`` run ``epoch`` from its first batch. This restarts
        the job at that epoch on the service: meant for a job with one client (a shared job
        moves for all of them)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        self._native.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the loader is in."""
        return int(self._native.epoch())

    @property
    def rank(self) -> int:
        """This process's rank (from torch.distributed or ``RANK``, else 0). It does not
        choose the batches: the service hands each client of a job disjoint batches as it
        asks for them."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Ranks of this training run (from torch.distributed or ``WORLD_SIZE``, else 1)."""
        return self._world_size

    def stats(self) -> Dict[str, Any]:
        """What this client has received since it connected.

        Keys: ``samples``, ``batches``, ``elapsed_s``, ``samples_per_s``, ``wait_s`` (time
        spent waiting for batches: input stall), as in :meth:`sluice.Loader.stats`;
        ``skipped`` (samples the workers left out under ``on_error("skip")``: a list of
        ``{"key", "path", "error"}``, as the local loader's); ``bytes`` (image bytes
        received), ``shared_memory_batches`` and ``duplicates_dropped``; ``cache``: the job's
        caches on all workers (``hits``, ``misses``, ``hit_rate`` as in the local loader's
        ``stats()["cache"]``, and ``entries``, ``hot``, ``hot_held``, ``workers_off``: workers
        whose ``level("auto")`` cache decided that caching cannot pay and stores nothing), or
        ``None``; ``accelerator``: ``{"busy", "source"}`` as
        in :meth:`sluice.Loader.stats`, or ``None`` before the first step. Op times are in
        the workers' metrics.
        """
        stats: Dict[str, Any] = dict(self._native.stats())
        elapsed = stats["elapsed_s"]
        stats["samples_per_s"] = stats["samples"] / elapsed if elapsed > 0 else 0.0
        return stats

    def report_accelerator_busy(self, fraction: float) -> None:
        """Reports the accelerator's busy fraction (0..1) as the trainer reads it, as
        :meth:`sluice.Loader.report_accelerator_busy` does. Each heartbeat sends it to the
        dispatcher in place of this client's step timing (for 10 s; report again to keep
        it): the dispatcher shows it as ``sluice_client_accelerator_busy`` and its
        autoscaler's policy reads it. Never waits for a batch."""
        self._native.report_accelerator_busy(float(fraction))

    def report(self, keys: Any, losses: Any) -> Dict[str, int]:
        """Reports per-sample losses for the samples ``keys`` (a batch's ``key``), as
        :meth:`sluice.Loader.report` does, into the job's importance store at the dispatcher.
        Every client (DDP rank) of the job reports only its own samples: the dispatcher
        holds one store for the job and draws each epoch for all its clients. Values that
        are NaN, infinite or negative are refused, finite values above 1e30 clamped to it,
        and keys not in the dataset ignored. Returns the dispatcher's counts,
        ``{"accepted", "refused", "clamped", "unknown"}`` (``accepted`` includes the
        clamped); its metrics count the refused and clamped per job.

        Raises:
            sluice.ServiceRequestError: ``keys`` and ``losses`` differ in length.
            sluice.JobFailedError: the job samples uniformly, or the epoch is long over.
        """
        return self._report(_as_list(keys, int), _as_list(losses, float), "loss")

    def update_gradient_info(self, keys: Any, grads: Any) -> Dict[str, int]:
        """FastMatch's API: per-sample gradient norms ``[n]`` or per-sample gradients
        ``[n, ...]`` (reduced to their L2 norms) for ``keys``; see :meth:`report`. A job's
        reports are all losses or all gradient norms."""
        return self._report(_as_list(keys, int), _as_list(_gradient_norms(grads), float), "grad_norm")

    def _report(self, keys: List[int], values: List[float], kind: str) -> Dict[str, int]:
        accepted, refused, unknown, clamped = self._native.report(keys, values, kind)
        return {"accepted": accepted, "refused": refused, "clamped": clamped, "unknown": unknown}

    def record_importance(self, keys: Any) -> ImportanceRecorder:
        """A context for one training step (see :meth:`sluice.Loader.record_importance`)."""
        return ImportanceRecorder(self, keys)

    @property
    def samples_per_epoch(self) -> int:
        """Samples per epoch, over all clients of the job."""
        return int(self._native.samples_per_epoch())

    @property
    def job(self) -> str:
        """The job's name."""
        return str(self._native.job_name())

    @property
    def fingerprint(self) -> str:
        """The job's fingerprint: dataset and pipeline together (16 hex digits)."""
        return str(self._native.fingerprint())

    @property
    def duplicates_dropped(self) -> int:
        """Batches that arrived twice (after worker failures) and were dropped."""
        return int(self._native.duplicates_dropped())

    @property
    def shared_memory_batches(self) -> int:
        """Batches that came through shared memory from workers on this machine."""
        return int(self._native.shared_memory_batches())

    @property
    def output(self) -> str:
        """``"numpy"`` or ``"torch"``."""
        return self._output

    def state_dict(self) -> Dict[str, Any]:
        """Where the job stands: its name, fingerprint, epoch and the batches of that epoch
        already handed out. A plain dict (JSON- and torch.save-able)."""
        state: Dict[str, Any] = json.loads(self._native.state_json())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restarts the job at ``state``: the rest of that epoch, then the next ones. Meant
        for a job with one client (a shared job restarts for all of them)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping (from RemoteLoader.state_dict()), not {type(state).__name__}")
        self._native.load_state_json(json.dumps(dict(state)))

    def __repr__(self) -> str:
        return f"RemoteLoader(job={self.job!r}, {len(self)} batches/epoch, epoch {self.epoch}, output={self._output!r})"
