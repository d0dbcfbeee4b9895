"""The loader: iterate batches of a pipeline as numpy arrays or torch tensors.

Batches come out of Rust without a copy: the arrays own the buffers sluice's worker
threads wrote into. The GIL is released while sluice works or waits, and Ctrl-C still
interrupts a wait (a later ``next()`` picks up the same batch).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import weakref
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from . import _sluice
from .map_workers import MapWorkers, apply_map_batch, as_torch, default_processes, import_map_batch, raw_fields
from .pipeline import PathLike, Pipeline

__all__ = ["Loader", "Batch", "BatchIterator", "ImportanceRecorder"]


#: The fields a batch from a source with boxes adds (docs/records.md).
BOX_FIELDS = ("boxes", "box_labels", "box_count", "masks")


class Batch(Mapping[str, Any]):
    """One batch: a read-only mapping of fields, also readable as attributes.

    Fields: ``image`` (``[n, h, w, 3]`` for layout ``hwc`` or ``[n, 3, h, w]`` for ``chw``,
    uint8 or float32), ``label`` (int64 ``[n]``, -1 where the source has none), ``key``
    (int64 ``[n]``, the samples' keys) and ``weight`` (float32 ``[n]``, only under
    importance sampling). A source with boxes (``coco``, ``sidecar``, ``tar`` with sidecars) adds ``boxes``
    (float32 ``[n, max_boxes, 4]``, XYXY pixels of the output image, zeros in the padding),
    ``box_labels`` (int64 ``[n, max_boxes]``, -1 in the padding) and ``box_count`` (int32
    ``[n]``, the real rows of each sample), and with ``masks=True`` ``masks`` (uint8
    ``[n, h, w]``, each sample's class-id mask moved with its pixels); see docs/records.md.
    A pipeline with metadata fields (:meth:`sluice.Pipeline.fields`) adds one entry per
    field under its name: float32 ``[n]`` (float), int64 ``[n]`` (int), float32 multi-hot
    ``[n, classes]`` (multi_label) or a ``list[str]`` (text, and json as compact JSON
    text). ``batch["image"]`` and ``batch.image`` are the same array;
    ``batch.weight`` is ``None`` when the batch has no weights.

    Attributes:
        epoch: the epoch this batch belongs to.
        index: its position within the epoch.
        layout: ``"hwc"`` or ``"chw"`` (None when unknown, e.g. a batch rebuilt by a
            torch DataLoader's collate or pin_memory step).
        buffer_address: address of the image buffer sluice filled in Rust; the image's data
            pointer equals it (the batch was not copied on its way to Python).
    """

    __slots__ = ("_fields", "epoch", "index", "layout", "buffer_address")

    def __init__(
        self,
        fields: Mapping[str, Any],
        epoch: int = -1,
        index: int = -1,
        layout: Optional[str] = None,
        buffer_address: int = 0,
    ) -> None:
        """Wraps ``fields`` (a mapping of name to array or tensor)."""
        self._fields: Dict[str, Any] = dict(fields)
        self.epoch = epoch
        self.index = index
        self.layout = layout
        self.buffer_address = buffer_address

    def __getitem__(self, name: str) -> Any:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: fields read as attributes.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._fields[name]
        except KeyError:
            if name == "weight":
                return None
            raise AttributeError(f"Batch has no field {name!r} (fields: {', '.join(self._fields)})") from None

    @property
    def size(self) -> int:
        """Samples in this batch (the short last batch, or one with skipped samples, may be
        smaller than the pipeline's batch size)."""
        return len(self._fields["label"])

    def __repr__(self) -> str:
        parts = []
        for name, value in self._fields.items():
            shape = tuple(getattr(value, "shape", ()))
            dtype = getattr(value, "dtype", type(value).__name__)
            parts.append(f"{name}={dtype}{list(shape)}")
        return f"Batch(epoch={self.epoch}, index={self.index}, {', '.join(parts)})"


def _default_shard(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """Rank and world size: as given, else from an initialised torch.distributed, else from
    the RANK / WORLD_SIZE environment variables (torchrun sets them), else 0 of 1."""
    if rank is not None and world_size is not None:
        return rank, world_size
    env_rank, env_world = 0, 1
    dist = sys.modules.get("torch.distributed")  # never import torch just to ask
    if dist is not None and dist.is_available() and dist.is_initialized():
        env_rank, env_world = dist.get_rank(), dist.get_world_size()
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        try:
            env_rank, env_world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        except ValueError:
            raise ValueError(
                f"RANK={os.environ['RANK']!r} / WORLD_SIZE={os.environ['WORLD_SIZE']!r} are not integers"
            ) from None
    return (env_rank if rank is None else rank), (env_world if world_size is None else world_size)


def _spec_json(spec: Union[Pipeline, Mapping[str, Any], PathLike]) -> str:
    if isinstance(spec, Pipeline):
        return spec.to_json()
    if isinstance(spec, Mapping):
        return Pipeline.from_dict(spec).to_json()
    if isinstance(spec, (str, os.PathLike)):
        return _sluice.spec_load_file(os.fspath(spec))
    raise TypeError(
        f"Loader takes a sluice.Pipeline, a spec dict or the path of a .toml/.json spec, not {type(spec).__name__}"
    )


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "output='torch' needs PyTorch: pip install torch (sluice itself works without it, with output='numpy')"
        ) from e
    return torch


class BatchIterator(Iterator[Batch]):
    """The batches of one epoch, in order (what ``iter(loader)`` returns)."""

    __slots__ = ("_native", "_torch", "_map_batch")

    def __init__(self, native: Any, torch: Any, map_batch: Optional[Tuple[Any, str, int, int]] = None) -> None:
        """Wraps a native epoch iterator; ``torch`` is the torch module for torch output;
        ``map_batch`` the spec's (function, name, seed, rank), run on each batch here."""
        self._native = native
        self._torch = torch
        self._map_batch = map_batch

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> Batch:
        raw = next(self._native)
        fields = raw_fields(raw)
        if self._map_batch is not None:
            fn, name, seed, rank = self._map_batch
            fields = apply_map_batch(fn, name, fields, raw.epoch, raw.index, seed, rank)
        torch = self._torch
        if torch is not None:
            # from_numpy shares the numpy array's memory: still no copy.
            fields = as_torch(torch, fields)
        return Batch(fields, raw.epoch, raw.index, raw.layout, raw.buffer_address)

    @property
    def epoch(self) -> int:
        """The epoch this iterator runs."""
        return int(self._native.epoch)

    @property
    def remaining(self) -> int:
        """Batches left in this epoch, as of the last batch handed out (also read from
        another thread while one waits in ``next()``)."""
        return int(self._native.remaining())

    def __length_hint__(self) -> int:
        return self.remaining


class _MapBatchIterator(BatchIterator):
    """An epoch of a pipeline with ``map`` ops, made by the loader's worker processes."""

    __slots__ = ("_loader", "_epoch", "_batches", "_next", "_end")

    def __init__(self, loader: "Loader", workers: MapWorkers, epoch: int, first: int, torch: Any) -> None:
        super().__init__(None, torch)
        self._loader = loader
        self._epoch = epoch
        self._end = len(loader)
        self._next = first
        # The parent draws the epoch: the trainer's importance reports come here.
        self._batches = workers.epoch(epoch, loader._native.epoch_draw(epoch), first, self._end)

    def __next__(self) -> Batch:
        for index, fields in self._batches:
            self._next = index + 1
            done = self._next == self._end
            self._loader._map_pos = (self._epoch + 1, 0) if done else (self._epoch, self._next)
            if fields is None:
                continue  # every sample of this batch was skipped
            layout = fields.pop("__layout__")
            torch = self._torch
            if torch is not None:
                fields = as_torch(torch, fields)
            return Batch(fields, self._epoch, index, layout, 0)
        raise StopIteration

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def remaining(self) -> int:
        return self._end - self._next


def _without_disk_tier(spec: Dict[str, Any]) -> str:
    """``spec`` as JSON without its cache's disk tier."""
    cache = spec.get("cache")
    if not isinstance(cache, dict) or "disk" not in cache:
        return json.dumps(spec)
    return json.dumps({**spec, "cache": {k: v for k, v in cache.items() if k != "disk"}})


#: Counters of a cache tier that add up over the worker processes (``hit_rate`` follows).
_TIER_SUMS = ("budget_bytes", "used_bytes", "entries", "hits", "misses", "insertions", "evictions", "rejected")
_DISK_SUMS = ("corrupt", "write_errors", "bytes_read", "bytes_written", "recovered")


def _sum_tiers(tiers: List[Dict[str, Any]], extra: Tuple[str, ...]) -> Dict[str, Any]:
    """One tier's stats over the worker processes: counters added up, the rest (policy,
    level, costs) from the process that looked up the most samples."""
    busiest = max(tiers, key=lambda t: int(t["hits"]) + int(t["misses"]))
    out = dict(busiest)
    for name in _TIER_SUMS + extra:
        out[name] = sum(t[name] for t in tiers)
    lookups = out["hits"] + out["misses"]
    out["hit_rate"] = out["hits"] / lookups if lookups else 0.0
    return out


def _sum_caches(caches: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``stats()["cache"]`` of a loader whose worker processes each hold a share of it."""
    out = _sum_tiers(caches, ("est_time_saved_s",))
    disks = [c["disk"] for c in caches if c.get("disk") is not None]
    if disks:
        disk = _sum_tiers(disks, _DISK_SUMS)
        # Each process's folder is `<dir>/process-<w>-of-<n>/<pipeline>`: `dir` is the spec's.
        disk["dirs"] = [d["dir"] for d in disks]
        disk["dir"] = os.path.dirname(os.path.dirname(disks[0]["dir"]))
        out["disk"] = disk
    return out


def _merge_worker_stats(stats: Dict[str, Any], workers: MapWorkers) -> None:
    """Adds up what the worker processes did into this loader's ``stats``."""
    per_worker = workers.stats()
    caches = [w["cache"] for w in per_worker if w.get("cache") is not None]
    if caches:
        stats["cache"] = _sum_caches(caches)
    for name in ("samples", "batches", "bytes_read"):
        stats[name] = sum(int(w[name]) for w in per_worker)
    ops: Dict[str, float] = {}
    percentiles: Dict[str, Dict[str, Any]] = {}
    for w in per_worker:
        for name, seconds in w["op_seconds"]:
            ops[name] = ops.get(name, 0.0) + seconds
        for p in w["op_percentiles"]:
            # The busiest worker's percentiles stand for all (each saw a fair share).
            if p["samples"] > percentiles.get(p["op"], {}).get("samples", -1):
                percentiles[p["op"]] = {"samples": p["samples"], "p50_s": p["p50_s"], "p99_s": p["p99_s"]}
    stats["op_seconds"] = ops
    stats["op_percentiles"] = percentiles
    stats["skipped"] = [s for w in per_worker for s in w["skipped"]]
    stats["wait_s"] = workers.wait_s
    if stats.get("elapsed_s"):
        stats["samples_per_s"] = stats["samples"] / stats["elapsed_s"]
    stats["processes"] = workers.processes
    stats["process_restarts"] = workers.restarts


def _to_numpy(x: Any) -> Any:
    import numpy as np

    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _as_list(x: Any, kind: type) -> List[Any]:
    arr = _to_numpy(x).reshape(-1)
    return [kind(v) for v in arr.tolist()]


def _gradient_norms(grads: Any) -> Any:
    """One norm per sample: ``grads`` as given (shape ``[n]``) or the L2 norms of per-sample
    gradients (shape ``[n, ...]``)."""
    arr = _to_numpy(grads)
    if arr.ndim > 1:
        import numpy as np

        arr = np.sqrt((arr.reshape(arr.shape[0], -1).astype(np.float64) ** 2).sum(axis=1))
    return arr


class ImportanceRecorder:
    """What :meth:`Loader.record_importance` returns: collects one step's per-sample
    values and reports them to the loader when the ``with`` block ends cleanly."""

    def __init__(self, loader: Any, keys: Any) -> None:
        self._loader = loader
        self._keys = keys
        self._values: Optional[Any] = None
        self._gradients = False

    def losses(self, losses: Any) -> None:
        """Per-sample losses of this step (``reduction="none"``)."""
        self._values, self._gradients = losses, False

    def gradients(self, grads: Any) -> None:
        """Per-sample gradient norms ``[n]`` or per-sample gradients ``[n, ...]``."""
        self._values, self._gradients = grads, True

    def __enter__(self) -> "ImportanceRecorder":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None or self._values is None:
            return
        if self._gradients:
            self._loader.update_gradient_info(self._keys, self._values)
        else:
            self._loader.report(self._keys, self._values)


class _Traced:
    """``close_trace()`` and ``trace(path)``, the same on :class:`Loader` and
    :class:`sluice.RemoteLoader` (what a trace holds: their ``trace`` argument)."""

    _native: Any
    _workers: Optional[MapWorkers] = None
    _trace_writer: Optional[weakref.finalize[[Any, Optional[MapWorkers], str], "_Traced"]] = None

    def _record_trace(self, trace: Optional[PathLike]) -> None:
        """Starts the whole-life trace of ``trace=``, written at :meth:`close_trace`,
        garbage collection or interpreter exit."""
        if trace is not None:
            _start_trace(self._native, self._workers)
            self._trace_writer = weakref.finalize(self, _stop_trace, self._native, self._workers, os.fspath(trace))

    def close_trace(self) -> Optional[int]:
        """Writes the trace asked for with ``trace=path`` now and stops recording; the
        number of events written (None if there was no such trace)."""
        if self._trace_writer is None:
            return None
        written: Optional[int] = self._trace_writer()
        return written

    @contextlib.contextmanager
    def trace(self, path: PathLike) -> Iterator[None]:
        """Records a profiling trace of the block to ``path`` (Perfetto protobuf, or
        Chrome JSON for ``.json``; open it in https://ui.perfetto.dev). What it holds is
        described under the loader's ``trace`` argument.

        Raises:
            SluiceError: a trace is already being recorded.
            OSError: the file cannot be written.
        """
        _start_trace(self._native, self._workers)
        try:
            yield
        finally:
            _stop_trace(self._native, self._workers, os.fspath(path))


def _start_trace(native: Any, workers: Optional[MapWorkers]) -> None:
    native.start_trace()
    if workers is not None:
        workers.start_trace()


def _stop_trace(native: Any, workers: Optional[MapWorkers], path: str) -> Optional[int]:
    """Writes the trace to ``path``: this process's events and, with ``map`` worker
    processes, theirs; the number of events written (None if none was recorded)."""
    written: Optional[int] = native.stop_trace(path)
    if written is not None and workers is not None:
        written += workers.stop_trace(path)
    return written


class Loader(_Traced):
    """Iterates the batches of a pipeline, one epoch per ``iter(loader)``.

    Args:
        pipeline: a :class:`sluice.Pipeline`, a spec dict, or the path of a ``.toml`` /
            ``.json`` spec file.
        rank, world_size: this process's share of the data (DDP). Each rank gets a
            disjoint, equally long part of every epoch's global order: step g's global
            batch is the next ``batch size × world_size`` samples of it, the same on any
            number of ranks (``docs/sharding.md``). By default taken
            from torch.distributed when it is initialised, else from the ``RANK`` and
            ``WORLD_SIZE`` environment variables, else 0 and 1.
        output: ``"numpy"`` (numpy arrays) or ``"torch"`` (CPU torch tensors). Either way
            the arrays share memory with sluice's buffers: nothing is copied.
        trace: a path to record a profiling trace of the loader's whole life to
            (Perfetto protobuf, or Chrome JSON for ``.json``): every sample's ops (read,
            decode+crop, resize, flip, normalize, write) and cache lookups on its worker
            thread, and each batch's preprocessing, the wait for it, its hand-over and
            the trainer's time with it; written when the loader is closed
            (:meth:`close_trace`, garbage collection or interpreter exit). For one block
            only, use :meth:`trace`. With ``map`` worker processes, their samples' ops
            are in it too, each process on its own.
        locality: the spec's ``locality`` section for a multi-learner job (the pipeline
            needs a cache), e.g. ``{"cache_samples": [n], "assignment": "aware"}``: each
            learner caches the samples the seed places on it and loads mostly those,
            while every step's global batch stays the same (``docs/locality.md``). With
            ``"peers": ["host:port", ...]`` (one per rank) the learners serve each other
            their cached samples, only to learners with the job's token: ``"token": "..."``
            or the environment variable ``SLUICE_PEER_TOKEN``, the same on every learner.
        threads: overrides the pipeline's ``threads``: a count (0: one per core) or
            ``"auto"``, where sluice sizes its thread pool to what the training loop
            consumes (sluice's one-step version of FastMatch's matching; each decision is in
            ``stats()["autoscale"]``).

    Epochs work like a torch DataLoader with a DistributedSampler: each ``iter(loader)``
    runs the next epoch (an epoch left unfinished is abandoned), ``set_epoch(e)`` picks
    one, and ``state_dict()`` / ``load_state_dict()`` resume mid-epoch exactly, even in a
    new process (torchdata's StatefulDataLoader convention).

    Threads: while one thread waits for a batch, another may call any method (``stats()``
    from a logging thread, say); none of them waits for that batch.

    Raises:
        SpecError: the spec is invalid (``.field`` names the culprit).
        SourceError: the dataset cannot be enumerated (``SourceNotFoundError`` if missing).
    """

    def __init__(
        self,
        pipeline: Union[Pipeline, Mapping[str, Any], PathLike],
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        output: str = "numpy",
        trace: Optional[PathLike] = None,
        locality: Optional[Mapping[str, Any]] = None,
        threads: Union[int, str, None] = None,
        processes: Optional[int] = None,
    ) -> None:
        if processes is not None and processes < 0:
            raise ValueError(f"processes must be >= 0, not {processes}")
        if output not in ("numpy", "torch"):
            raise ValueError(f"output must be 'numpy' or 'torch', not {output!r}")
        if threads is not None and threads != "auto" and not (isinstance(threads, int) and threads >= 0):
            raise ValueError(f"threads must be a count >= 0 or 'auto', not {threads!r}")
        self._torch = _import_torch() if output == "torch" else None
        self._output = output
        spec_json = _spec_json(pipeline)
        if locality is not None:
            spec = json.loads(spec_json)
            spec["locality"] = dict(locality)
            spec_json = json.dumps(spec)
        if threads is not None:
            spec_json = json.dumps({**json.loads(spec_json), "threads": threads})
        self._rank, self._world_size = _default_shard(rank, world_size)
        if self._world_size < 1 or not 0 <= self._rank < self._world_size:
            raise ValueError(f"rank {self._rank} is not in 0..world_size ({self._world_size})")
        spec = json.loads(spec_json)
        name = spec.get("map_batch")
        use_workers = processes != 0 and (name is not None or any(op.get("op") == "map" for op in spec.get("ops", [])))
        # With worker processes the cache is theirs (each its share): this process draws the
        # epochs and makes no sample, and must not take the disk tier's folder.
        native_json = _without_disk_tier(spec) if use_workers else spec_json
        self._native = _sluice.Loader(native_json, self._rank, self._world_size)
        self._workers: Optional[MapWorkers] = None
        self._map_batch = None if name is None else (import_map_batch(name), name, int(spec.get("seed", 0)), self._rank)
        if use_workers:
            count = processes if processes is not None else default_processes(spec.get("threads"))
            batch_bytes = int(self._native.batch_bytes())
            self._workers = MapWorkers(spec_json, self._rank, self._world_size, count, batch_bytes)
        # Where the worker processes' epochs stand: (epoch, batches of it handed out).
        self._map_pos: Tuple[int, int] = tuple(self._native.position())
        self._record_trace(trace)
        # True after set_epoch / load_state_dict: the next iter() starts exactly there.
        self._positioned = False

    def __iter__(self) -> BatchIterator:
        """Starts the next epoch (or resumes where :meth:`load_state_dict` /
        :meth:`set_epoch` put the loader). Retires any older iterator of this loader."""
        if self._workers is not None:
            epoch, done = self._map_pos
            if done > 0 and not self._positioned:
                epoch, done = epoch + 1, 0
            self._positioned = False
            self._map_pos = (epoch, done)
            return _MapBatchIterator(self, self._workers, epoch, done, self._torch)
        if not self._positioned:
            epoch, done = self._native.position()
            if done > 0:
                # The last iterator stopped mid-epoch: like a DataLoader, move on.
                self._native.set_epoch(epoch + 1)
        self._positioned = False
        return BatchIterator(self._native.iter(), self._torch, self._map_batch)

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return int(self._native.batches_per_epoch())

    def set_epoch(self, epoch: int) -> None:
        """Makes the next ``iter(loader)`` run ``epoch`` from its first batch, like
        ``DistributedSampler.set_epoch``. The epoch seeds the shuffle and augmentations."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        self._native.set_epoch(epoch)
        self._map_pos = (epoch, 0)
        self._positioned = True

    @property
    def epoch(self) -> int:
        """The epoch the loader is in (or will start next)."""
        if self._workers is not None:
            return self._map_pos[0]
        return int(self._native.position()[0])

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader stands: epoch, batches of it already handed out, seed, dataset
        fingerprint, rank and world size. A plain dict (JSON- and torch.save-able)."""
        state: Dict[str, Any] = json.loads(self._native.state_json())
        if self._workers is not None:
            state["epoch"], state["batch"] = self._map_pos
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next ``iter(loader)`` continue exactly where ``state`` was taken: the
        remaining batches of that epoch, then the following epochs, identical to an
        uninterrupted run. A state of another ``world_size`` (any of its ranks') resumes
        at the same global batch when ``batch size × world_size`` is the same: the rest of
        the epoch, each sample once, in the same global batches (``docs/sharding.md``).
        Raises :class:`sluice.StateError` if the state belongs to another dataset, seed
        or rank layout, or the global batch cannot stay the same."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping (from Loader.state_dict()), not {type(state).__name__}")
        self._native.load_state_json(json.dumps(dict(state)))
        self._map_pos = tuple(self._native.position())
        self._positioned = True

    def stats(self) -> Dict[str, Any]:
        """What the loader has done since it was built and where the time went.

        Keys: ``samples``, ``batches``, ``bytes_read``, ``elapsed_s``, ``samples_per_s``
        (throughput), ``wait_s`` (time the consumer waited for batches: input stall),
        ``op_seconds`` (busy seconds per op summed over threads, ``read`` first),
        ``op_percentiles`` (per op, ``{"samples", "p50_s", "p99_s"}``: one sample's time
        in the op, median and 99th percentile, over the samples that ran it),
        ``skipped`` (a list of ``{"key", "path", "error"}`` for samples left out under
        ``on_error("skip")``), ``threads`` and ``buffers_reused`` (batches built in the
        buffer of an earlier batch that Python had freed, rather than in fresh memory).
        ``importance_reports``: ``{"accepted", "refused", "clamped"}``, what became of the
        values given to :meth:`report` (refused: NaN, infinite or negative; clamped: finite
        above 1e30, taken as 1e30; accepted includes the clamped).
        With a cache, ``cache``: the memory tier's counters (``hits``, ``misses``,
        ``hit_rate``, ``used_bytes``, ``evictions``, ...), ``off`` (``None``, or when
        ``level("auto")`` found that caching would save under 5% of the pipeline's time
        per epoch and stores nothing: ``best``, ``saved_per_epoch_s``,
        ``pipeline_per_epoch_s``, ``saved_fraction``, ``min_fraction``) and, with a disk tier, ``disk``:
        ``hits``, ``misses``, ``hit_rate``, ``corrupt``, ``used_bytes``, ``evictions``,
        ``rejected``, ``bytes_read``, ``bytes_written``, ``recovered``. With ``map`` worker
        processes, each holds a share of the cache and ``cache`` adds theirs up (docs/map.md).
        With ``threads="auto"``, ``autoscale``: ``policy``, ``units`` (threads now),
        ``windows``, ``ups``, ``downs`` and the latest ``decisions`` (each with ``t_ms``,
        ``from``, ``to``, ``production``, ``consumption``, ``stall`` and ``reason``).
        ``prefetch``: ``depth`` (batches kept in flight now), ``auto`` (``prefetch("auto")``),
        ``ready_limit``, ``max_depth`` (what the memory bound allows) and ``grows``.
        ``accelerator`` (after the first step): ``busy`` (the accelerator's busy fraction
        over the last few seconds) and ``source``: ``"reported"``
        (:meth:`report_accelerator_busy`) or ``"step_timing"`` (compute between ``next()``
        calls over compute + wait).
        With the entropy index on (``Pipeline.entropy_index()``), ``entropy_index``: ``indexed`` (files),
        ``bytes`` (their indexes in memory), ``unservable`` (files decoded whole:
        progressive, arithmetic-coded, damaged), ``over_budget``, ``cut`` (crops cut with an
        index), ``loaded`` and ``rejected`` (indexes read from the index folder, and ones
        there refused as damaged); docs/entropy-index.md.
        """
        stats: Dict[str, Any] = json.loads(self._native.stats_json())
        stats["op_seconds"] = {name: seconds for name, seconds in stats["op_seconds"]}
        stats["op_percentiles"] = {
            p["op"]: {"samples": p["samples"], "p50_s": p["p50_s"], "p99_s": p["p99_s"]}
            for p in stats["op_percentiles"]
        }
        stats["threads"] = self.threads
        stats["buffers_reused"] = int(self._native.buffers_reused())
        if self._workers is not None:
            _merge_worker_stats(stats, self._workers)
        return stats

    def report_accelerator_busy(self, fraction: float) -> None:
        """Reports the accelerator's busy fraction (0..1) as the trainer reads it: a device
        counter (:func:`sluice.torch.report_cuda_utilization` reads
        ``torch.cuda.utilization()``) or its own device time per step over step time. It
        replaces the step timing the loader measures itself (compute between ``next()``
        calls over compute + wait) in ``stats()["accelerator"]`` and in what the
        autoscaler's policy reads, for 10 s; report again to keep it. With
        ``threads="auto"``, FastMatch adds no threads while it is 0.95 or more.
        NaN is ignored; other values are clamped to 0..1."""
        self._native.report_accelerator_busy(float(fraction))

    @property
    def processes(self) -> int:
        """Worker processes running the pipeline (0: it runs in this process); more than 0
        only for a pipeline with ``map`` ops."""
        return 0 if self._workers is None else self._workers.processes

    def close(self) -> None:
        """Stops the worker processes of a pipeline with ``map`` ops (also done when the
        loader is garbage collected); a later ``iter(loader)`` starts them again."""
        if self._workers is not None:
            self._workers.close()

    def report(self, keys: Any, losses: Any) -> Dict[str, int]:
        """Reports per-sample importance (usually the per-sample loss, ``reduction="none"``)
        for the samples ``keys`` (a batch's ``key``). Accepts lists, numpy arrays or torch
        tensors (detached for you). Scores are smoothed across epochs and shape the epochs
        after the current one (``sampling``) and the cache's priorities; they are saved in
        :meth:`state_dict`. NaN, infinite or negative values are refused, finite values
        above 1e30 clamped to it (``docs/importance-sampling.md``). Returns the counts,
        ``{"accepted", "refused", "clamped"}`` (``accepted`` includes the clamped), over
        every rank's values reported here; :meth:`stats` adds them up in
        ``importance_reports``.

        With several ranks (DDP) every rank must draw the same epoch order, so every rank
        needs every rank's reports: when ``torch.distributed`` is initialised and
        ``world_size > 1``, this call is collective (every rank calls it once per step) and
        gathers all ranks' values with ``all_gather_object``, then reports them in rank
        order. Without a process group, report every rank's values on every rank yourself.

        Raises:
            ValueError: ``keys`` and ``losses`` differ in length.
        """
        mine = (_as_list(keys, int), _as_list(losses, float))
        reports = [mine]
        dist = sys.modules.get("torch.distributed")  # never import torch just to ask
        if self._world_size > 1 and dist is not None and dist.is_available() and dist.is_initialized():
            gathered: List[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
            reports = gathered
        counts = {"accepted": 0, "refused": 0, "clamped": 0}
        for rank_keys, rank_values in reports:
            accepted, refused, clamped = self._native.report(rank_keys, rank_values)
            counts["accepted"] += accepted
            counts["refused"] += refused
            counts["clamped"] += clamped
        return counts

    def update_gradient_info(self, keys: Any, grads: Any) -> Dict[str, int]:
        """FastMatch's API: reports per-sample gradient information. ``grads`` is either
        one norm per sample (shape ``[n]``) or per-sample gradients (shape ``[n, ...]``,
        e.g. ``inputs.grad``), reduced here to their L2 norms. Returns the counts, as
        :meth:`report` does."""
        return self.report(keys, _gradient_norms(grads))

    def record_importance(self, keys: Any) -> "ImportanceRecorder":
        """A context for one training step, after FastMatch's Listing 1::

            with loader.record_importance(batch["key"]) as rec:
                losses = F.cross_entropy(model(x), y, reduction="none")
                rec.losses(losses)
                (losses * w).mean().backward()

        The values given to ``rec.losses`` (or ``rec.gradients``) are reported when the
        block ends without an exception; nothing is reported if it raises."""
        return ImportanceRecorder(self, keys)

    def set_threads(self, threads: int) -> None:
        """Resizes sluice's worker pool, also while iterating; 0 means one per core."""
        if threads < 0:
            raise ValueError(f"threads must be >= 0, not {threads}")
        self._native.set_threads(threads)

    @property
    def threads(self) -> int:
        """Worker threads now."""
        return int(self._native.threads())

    @threads.setter
    def threads(self, threads: int) -> None:
        self.set_threads(threads)

    @property
    def rank(self) -> int:
        """This loader's rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Ranks sharing each epoch."""
        return self._world_size

    @property
    def output(self) -> str:
        """``"numpy"`` or ``"torch"``."""
        return self._output

    @property
    def samples_per_epoch(self) -> int:
        """Samples this rank sees per epoch."""
        return int(self._native.samples_per_epoch())

    @property
    def num_samples(self) -> int:
        """Samples in the whole dataset (all ranks)."""
        return int(self._native.num_samples())

    @property
    def classes(self) -> List[str]:
        """Class names by label (ImageFolder sources), else an empty list."""
        return list(self._native.classes())

    @property
    def fingerprint(self) -> str:
        """The dataset's fingerprint (16 hex digits), part of every state dict."""
        return str(self._native.fingerprint())

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline this loader runs (defaults filled in)."""
        return Pipeline.from_json(self._native.spec_json())

    def path_of(self, key: int) -> str:
        """The file (or ``shard.tar:member``) of the sample with ``key``."""
        return str(self._native.path_of(int(key)))

    def __repr__(self) -> str:
        return (
            f"Loader({self.num_samples} samples, {len(self)} batches/epoch, rank {self._rank}/{self._world_size}, "
            f"{self.threads} threads, output={self._output!r})"
        )
