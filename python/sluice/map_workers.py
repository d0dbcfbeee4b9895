"""Worker processes for pipelines with Python ``map`` ops (docs/map.md).

Python holds the GIL, so a ``map`` function on sluice's threads runs one sample at a time.
:class:`sluice.Loader` therefore runs such a pipeline in worker processes: worker ``w`` of
``n`` runs the whole pipeline (native ops and the Python op, in-process) on batches
``i`` with ``i % n == w``, writes each batch into a slot of its shared-memory segment and
tells the parent, which copies it out and hands batches over in order. A batch's boxes and
segmentation masks go into the slot too, after the labels, keys and weights (through
the pipe where they do not fit). The parent draws
each epoch's order (from its importance state: the trainer reports to the parent) and
sends it with the epoch; every sample's randomness comes from (seed, epoch, key), so the
batches are the same whatever ``n``.

A worker that dies (killed, crashed) is restarted from its first batch the parent has not
handed out: every sample is delivered once.

Workers are started as ``python -c`` processes that import this module and the ``map``
functions by name; they never run the parent's script (``multiprocessing``'s spawn re-runs
it as ``__mp_main__``, which fails a script without ``if __name__ == "__main__":``). A
function defined in the script itself is refused before any process starts. What a
worker raises while it starts (an import that fails, a folder it cannot open) reaches the
user as the ``__cause__`` of the parent's error, with the worker's traceback in a note.

The spec's cache is the loader's, whatever its processes: each of ``n`` workers holds
``1/n`` of its memory and disk budgets, its disk tier in a subfolder of its own
(``process-<w>-of-<n>``: a folder has one owner), and hears which samples its batches
will look up (Belady's rule needs the future). ``stats()["cache"]`` adds the workers' up.

While the loader records a trace, so does every worker; at the end each writes its own
and the parent adds their events to its file (a process of its own each in the timeline).
"""

from __future__ import annotations

import importlib
import json
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from collections import deque
from multiprocessing import resource_tracker, shared_memory
from multiprocessing.connection import Connection
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import _sluice, errors

__all__ = ["MapWorkers", "MapBatch", "MapBatchInfo", "apply_map_batch"]

#: Batches a worker may have written that the parent has not copied out yet.
SLOTS = 2
#: How often the parent checks that a worker it waits for is alive.
POLL_S = 0.05
#: Restarts of one worker while it owes the same batch before the epoch fails.
MAX_RESTARTS = 3

#: A batch as the parent copied it out of shared memory.
MapBatch = Dict[str, Any]
#: An epoch's order and weights as the parent's native loader drew them (``epoch_draw``).
Draw = Tuple[bytes, Optional[bytes]]


#: A batch's fields from a source with boxes or masks, as the native batch names them.
RECORD_FIELDS = ("boxes", "box_labels", "box_count", "masks")


def _slot_layout(image_bytes: int, batch_size: int, record_bytes: int = 0) -> Tuple[int, int, int, int, int]:
    """Offsets of label, key, weight and the records (boxes and masks) in a slot, and the
    slot's size."""
    label = image_bytes
    key = label + 8 * batch_size
    weight = key + 8 * batch_size
    records = (weight + 4 * batch_size + 15) // 16 * 16
    return label, key, weight, records, records + record_bytes


def _record_bytes(spec: Dict[str, Any], image_bytes: int) -> int:
    """Room in a slot for a batch's masks where the spec's source has them: a one-byte
    mask a pixel, at most a third of an RGB batch's bytes (any dtype), and some for its
    boxes. Records that need more go through the pipe."""

    def has_masks(v: Any) -> bool:
        if isinstance(v, dict):
            return v.get("masks") is True or any(has_masks(x) for x in v.values())
        return isinstance(v, list) and any(has_masks(x) for x in v)

    return image_bytes // 3 + (1 << 16) if has_masks(spec.get("source")) else 0


def _error_message(e: BaseException) -> Tuple[str, str, Dict[str, Any]]:
    """An exception as plain data: sluice's classes carry their key and path as attributes."""
    attrs = {k: v for k, v in vars(e).items() if isinstance(v, (str, int, float, list, type(None)))}
    return type(e).__name__, str(e), attrs


def _rebuild_error(name: str, message: str, attrs: Dict[str, Any]) -> BaseException:
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.SluiceError)):
        return errors.SluiceError(f"{name}: {message}")
    e: BaseException = cls.__new__(cls)
    e.args = (message,)
    e.__dict__.update(attrs)
    return e


def _put(buf: memoryview, offset: int, array: Any) -> None:
    """Copies ``array``'s bytes into ``buf`` at ``offset``."""
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    np.ndarray(flat.shape, np.uint8, buffer=buf, offset=offset)[:] = flat


def _trace(native: Any, conn: Connection, msg: Tuple[Any, ...]) -> None:
    """``("trace", "start")`` starts recording; ``("trace", "stop", path)`` writes what
    was recorded to ``path`` and answers ``("traced", events)``."""
    if msg[1] == "start":
        native.start_trace()
    else:
        conn.send(("traced", native.stop_trace(msg[2])))


class MapBatchInfo:
    """What a ``map_batch`` function is told about its batch besides the arrays."""

    __slots__ = ("epoch", "index", "seed", "rank", "keys", "_rng")

    def __init__(self, epoch: int, index: int, seed: int, rank: int, keys: List[int]) -> None:
        self.epoch, self.index, self.seed, self.rank, self.keys = epoch, index, seed, rank, keys
        self._rng: Optional[np.random.Generator] = None

    @property
    def rng(self) -> np.random.Generator:
        """A ``numpy.random.Generator`` derived from (seed, epoch, index, rank), made on
        first use: the same batch gets the same draws for any process count or resume."""
        if self._rng is None:
            self._rng = np.random.default_rng([self.seed, self.epoch, self.index, self.rank])
        return self._rng

    def __repr__(self) -> str:
        return f"MapBatchInfo(epoch={self.epoch}, index={self.index}, seed={self.seed}, rank={self.rank})"


def import_map_batch(name: str) -> Callable[..., Any]:
    """The function ``module:qualname`` names (the spec checked the form)."""
    module, _, qualname = name.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise errors.SpecError(f"map_batch: `{name}` is not callable", field="map_batch")
    return target  # type: ignore[no-any-return]


def raw_fields(raw: Any) -> Dict[str, Any]:
    """A native batch's arrays, named as the loader yields them."""
    fields: Dict[str, Any] = {"image": raw.image, "label": raw.label, "key": raw.key}
    if raw.weight is not None:
        fields["weight"] = raw.weight
    if raw.boxes is not None:
        fields["boxes"] = raw.boxes
        fields["box_labels"] = raw.box_labels
        fields["box_count"] = raw.box_count
    if raw.masks is not None:
        fields["masks"] = raw.masks
    if raw.fields is not None:
        # The spec's metadata fields, under their names (validation keeps them apart from
        # the entries above).
        fields.update(raw.fields)
    return fields


def as_torch(torch: Any, fields: Dict[str, Any]) -> Dict[str, Any]:
    """numpy arrays as torch tensors sharing their memory (no copy); lists of str (text
    and JSON fields) stay as they are."""
    return {name: value if isinstance(value, list) else torch.from_numpy(value) for name, value in fields.items()}


def apply_map_batch(
    fn: Callable[..., Any], name: str, fields: Dict[str, Any], epoch: int, index: int, seed: int, rank: int
) -> Dict[str, Any]:
    """``fn`` on one batch; what it raises or a result that is not a dict of arrays
    becomes a :class:`sluice.MapBatchError` naming the batch and its samples."""
    keys = [int(k) for k in np.asarray(fields["key"]).reshape(-1)]
    info = MapBatchInfo(epoch, index, seed, rank, keys)

    def fail(what: str) -> errors.MapBatchError:
        return errors.MapBatchError(
            f"map_batch `{name}` failed on batch {index} of epoch {epoch} (sample keys {keys}): {what}",
            epoch=epoch,
            batch=index,
            keys=keys,
            fn=name,
        )

    try:
        out = fn(fields, info)
    except Exception as e:
        raise fail(f"{type(e).__name__}: {e}") from e
    if not isinstance(out, dict) or not all(isinstance(k, str) for k in out):
        raise fail(f"it must return a dict of numpy arrays by name; got {type(out).__name__}")
    result: Dict[str, Any] = {}
    for k, v in out.items():
        # Lists of str pass too: a text or JSON metadata field, as the batch gave it.
        if not isinstance(v, np.ndarray) and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            raise fail(f"it must return numpy arrays (or lists of str); `{k}` is a {type(v).__name__}")
        result[k] = v
    return result


def _pack(out: Dict[str, Any], slot_bytes: int) -> Optional[List[Tuple[str, Tuple[int, ...], str, int]]]:
    """Where each array of ``out`` goes in a slot (name, shape, dtype, offset), or None
    if they do not fit (or one holds Python objects)."""
    metas = []
    at = 0
    for k, v in out.items():
        if not isinstance(v, np.ndarray) or v.dtype.hasobject:
            return None  # e.g. a text field's list of str: through the pipe
        at = (at + 15) // 16 * 16
        metas.append((k, tuple(v.shape), v.dtype.str, at))
        at += v.nbytes
    return metas if at <= slot_bytes else None


def _worker_main(
    spec_json: str, rank: int, world_size: int, index: int, count: int, shm_name: str, conn: Connection
) -> None:
    """One worker process: runs the batches of each epoch that are its share."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # Attaching registers the segment again with the resource tracker this process shares
    # with the parent (a set: no change); the parent unlinks it.
    shm = shared_memory.SharedMemory(name=shm_name)
    native = _sluice.Loader(spec_json, rank, world_size)
    spec = json.loads(spec_json)
    batch_size = int(spec["batch"]["size"])
    image_bytes = int(native.batch_bytes())
    layout = _slot_layout(image_bytes, batch_size, _record_bytes(spec, image_bytes))
    name = spec.get("map_batch")
    # (function, name, seed, rank) of the spec's map_batch, run on each batch made here.
    batch_fn = None if name is None else (import_map_batch(name), name, int(spec.get("seed", 0)), rank)
    buf = shm.buf
    assert buf is not None
    command: Optional[Tuple[Any, ...]] = None
    while True:
        msg = command if command is not None else conn.recv()
        command = None
        if msg[0] == "stop":
            break
        if msg[0] == "trace":
            _trace(native, conn, msg)
            continue
        if msg[0] != "run":
            continue  # a "free" of an abandoned run
        _, run, epoch, first, end, draw = msg
        # The disk tier's Belady rule ranks entries by when this process needs them next.
        native.tell_future_of_share(epoch, draw[0], first, index, count)
        command = _run(native, conn, buf, layout, run, (epoch, draw), first, end, index, count, batch_fn)
    del native
    shm.close()


def _run(
    native: Any,
    conn: Connection,
    buf: memoryview,
    layout: Tuple[int, int, int, int, int],
    run: int,
    drawn: Tuple[int, Draw],
    first: int,
    end: int,
    index: int,
    count: int,
    batch_fn: Optional[Tuple[Callable[..., Any], str, int, int]] = None,
) -> Optional[Tuple[Any, ...]]:
    """Makes this worker's batches of ``first..end`` of the epoch ``drawn`` (its number and
    the parent's draw of it); returns a command that interrupted it."""
    epoch, (order, weights) = drawn
    mine = deque(i for i in range(first, end) if i % count == index)
    free: List[int] = list(range(SLOTS))
    ahead: Deque[Tuple[int, Any]] = deque()  # started batches, so the threads work ahead
    label_at, key_at, weight_at, records_at, slot_bytes = layout
    while mine or ahead:
        while mine and len(ahead) <= SLOTS:
            i = mine.popleft()
            ahead.append((i, native.iter_draw(epoch, i, i + 1, order, weights)))
        while not free or conn.poll():
            msg = conn.recv()
            if msg[0] == "free" and msg[1] == run:
                free.append(msg[2])
            elif msg[0] == "trace":
                _trace(native, conn, msg)
            elif msg[0] in ("run", "stop"):
                return msg  # type: ignore[no-any-return]
        i, it = ahead.popleft()
        try:
            raw = next(it, None)
            if raw is not None and batch_fn is not None:
                fn, name, seed, rank = batch_fn
                out = apply_map_batch(fn, name, raw_fields(raw), epoch, i, seed, rank)
        except BaseException as e:
            conn.send(("error", run, i, *_error_message(e)))
            return None
        if raw is None:  # every sample of the batch was skipped
            conn.send(("batch", run, i, None, 0, None, None, None, native.stats_json()))
            continue
        if batch_fn is not None:
            # Whatever map_batch made: into a slot where it fits, else through the pipe.
            metas = _pack(out, slot_bytes)
            if metas is None:
                inline = ("inline", out, raw.layout)
                conn.send(("batch", run, i, None, len(raw.label), None, raw.index, inline, native.stats_json()))
                continue
            slot = free.pop()
            for (_, _, _, offset), v in zip(metas, out.values()):
                _put(buf, slot * slot_bytes + offset, v)
            packed = ("slot", metas, raw.layout)
            conn.send(("batch", run, i, slot, len(raw.label), None, raw.index, packed, native.stats_json()))
            continue
        slot = free.pop()
        base = slot * slot_bytes
        image = np.ascontiguousarray(raw.image)
        _put(buf, base, image)
        _put(buf, base + label_at, np.asarray(raw.label, np.int64))
        _put(buf, base + key_at, np.asarray(raw.key, np.int64))
        has_weight = raw.weight is not None
        if has_weight:
            _put(buf, base + weight_at, np.asarray(raw.weight, np.float32))
        n = len(raw.label)
        # Boxes and masks: after the weights where they fit, else through the pipe.
        found = {k: np.asarray(getattr(raw, k)) for k in RECORD_FIELDS if getattr(raw, k, None) is not None}
        records: Optional[Tuple[str, Any]] = None
        if found:
            metas = _pack(found, slot_bytes - records_at)
            if metas is None:
                records = ("inline", found)
            else:
                for (_, _, _, offset), v in zip(metas, found.values()):
                    _put(buf, base + records_at + offset, v)
                records = ("slot", metas)
        # Metadata fields (small; lists of str among them) go through the pipe.
        shape = (image.shape, str(image.dtype), raw.layout, has_weight, raw.fields, records)
        conn.send(("batch", run, i, slot, n, shape, raw.index, None, native.stats_json()))
    return None


#: What a worker process runs: ``sys.path`` as the parent has it, then this module's entry.
_CHILD_CODE = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[3]); "
    "from sluice.map_workers import _worker_process; _worker_process(int(sys.argv[1]), int(sys.argv[2]))"
)


def _worker_process(conn_fd: int, tracker_fd: int) -> None:
    """The entry of a worker process: reads its arguments from the parent, runs
    :func:`_worker_main`, and sends what it raises (other than the parent going away) to
    the parent as ``("fatal", ...)`` instead of printing it."""
    if tracker_fd >= 0:
        # The parent's resource tracker, as multiprocessing's spawn hands it over: the shared
        # memory this process attaches stays registered there (and the parent unlinks it).
        resource_tracker._resource_tracker._fd = tracker_fd  # type: ignore[attr-defined]
    conn = Connection(conn_fd)
    try:
        args = conn.recv()
    except (EOFError, OSError):
        return
    spec_json, rank, world_size, index, count, shm_name = args
    try:
        _worker_main(spec_json, rank, world_size, index, count, shm_name, conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent is gone
    except BaseException as e:
        try:
            conn.send(("fatal", *_fatal_message(e)))
        except OSError:
            pass
        sys.exit(1)


def _fatal_message(e: BaseException) -> Tuple[Optional[bytes], str, str, str]:
    """An exception of a worker process for its parent: pickled where it can be, its type,
    message and traceback as text."""
    try:
        pickled: Optional[bytes] = pickle.dumps(e)
    except Exception:
        pickled = None
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return pickled, f"{type(e).__module__}.{type(e).__qualname__}", str(e), text


def _worker_failure(w: int, pid: Optional[int], msg: Tuple[Any, ...]) -> BaseException:
    """The parent's error for worker ``w``'s ``("fatal", ...)``, its own exception (with the
    worker's traceback as a note) the ``__cause__``."""
    pickled, kind, message, text = msg[1:5]
    cause: Optional[BaseException] = None
    if pickled is not None:
        try:
            cause = pickle.loads(pickled)
        except Exception:
            cause = None
    if not isinstance(cause, BaseException):
        cause = errors.SluiceError(f"{kind}: {message}")
    note = f"in map worker process {w} (pid {pid}):\n{text}"
    if hasattr(cause, "add_note"):
        cause.add_note(note)
    error = errors.SluiceError(f"map worker process {w} failed: {kind}: {message}")
    error.__cause__ = cause
    return error


def main_functions(spec: Dict[str, Any]) -> List[str]:
    """The spec's ``map`` and ``map_batch`` functions that live in the script being run."""
    names = [op.get("fn", "") for op in spec.get("ops", []) if op.get("op") == "map"]
    names.append(spec.get("map_batch") or "")
    return [n for n in names if n.partition(":")[0] in ("__main__", "__mp_main__")]


def refuse_main_functions(spec: Dict[str, Any]) -> None:
    """Raises a :class:`sluice.SpecError` naming a ``map`` function that lives in the
    script being run: worker processes import functions by module and never run the script."""
    found = main_functions(spec)
    if not found:
        return
    name = found[0]
    script = getattr(sys.modules.get("__main__"), "__file__", None) or "the script being run"
    fn = name.partition(":")[2]
    raise errors.SpecError(
        f"map function `{name}` is defined in {script} (`__main__`); sluice's worker processes import a "
        f"map function by its module and never run the script, so they cannot find it: move `{fn}` into a "
        "module of its own (e.g. `augment.py` beside the script) and import it from there, or pass "
        "processes=0 to run it in this process",
        field="ops.fn" if spec.get("map_batch") != name else "map_batch",
    )


class _Worker:
    """A worker process started by :func:`_launch` (the part of ``multiprocessing.Process``
    the parent uses)."""

    def __init__(self, popen: "subprocess.Popen[bytes]") -> None:
        self._popen = popen

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> Optional[int]:
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: Optional[float] = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self._popen.poll() is None:
            self._popen.kill()


def _launch(args: Tuple[Any, ...]) -> Tuple[_Worker, Connection]:
    """Starts a worker process running ``_worker_main(*args, conn)``, and its connection."""
    parent, child = mp.Pipe()
    resource_tracker.ensure_running()
    tracker_fd = resource_tracker.getfd()
    assert tracker_fd is not None  # ensure_running started it
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    command = [sys.executable, *flags, "-c", _CHILD_CODE, str(child.fileno()), str(tracker_fd), json.dumps(sys.path)]
    try:
        popen = subprocess.Popen(command, pass_fds=(child.fileno(), tracker_fd), stdin=subprocess.DEVNULL)
    finally:
        child.close()
    parent.send(args)
    return _Worker(popen), parent


class MapWorkers:
    """The worker processes of one loader, started on first use and kept across epochs."""

    def __init__(self, spec_json: str, rank: int, world_size: int, processes: int, batch_bytes: int) -> None:
        spec = json.loads(spec_json)
        refuse_main_functions(spec)
        self._batch_size = int(spec["batch"]["size"])
        # Each process runs one native thread: the processes are the parallelism; each holds
        # its share of the cache (checked here, before any process starts).
        one_thread = json.dumps({**spec, "threads": 1})
        self._specs = [_sluice.spec_process_share(one_thread, w, processes) for w in range(processes)]
        self._rank, self._world_size = rank, world_size
        self._count = processes
        layout = _slot_layout(batch_bytes, self._batch_size, _record_bytes(spec, batch_bytes))
        self._label_at, self._key_at, self._weight_at, self._records_at, self._slot_bytes = layout
        self._shms: List[shared_memory.SharedMemory] = []
        self._procs: List[Any] = []  # _Worker, None before the first start
        self._conns: List[Connection] = []
        self._run = 0
        self._stats: List[Optional[str]] = [None] * processes
        # Messages read while waiting for a trace, per worker, for _receive.
        self._early: List[Deque[Tuple[Any, ...]]] = [deque() for _ in range(processes)]
        self._tracing = False
        self.restarts = 0
        self.wait_s = 0.0
        self._finalizer = weakref.finalize(self, MapWorkers._shutdown, self._procs, self._conns, self._shms)

    @property
    def processes(self) -> int:
        return self._count

    def _start(self, w: int) -> None:
        if w == len(self._shms):
            self._shms.append(shared_memory.SharedMemory(create=True, size=max(1, SLOTS * self._slot_bytes)))
            self._procs.append(None)
            self._conns.append(None)  # type: ignore[arg-type]
        args = (self._specs[w], self._rank, self._world_size, w, self._count, self._shms[w].name)
        proc, parent = _launch(args)
        self._procs[w], self._conns[w] = proc, parent
        self._early[w].clear()  # a dead worker's batches: the new one makes them again
        if self._tracing:
            parent.send(("trace", "start"))

    def pids(self) -> List[int]:
        """The worker processes' ids (a restarted worker has a new one)."""
        return [p.pid for p in self._procs if p is not None]

    def epoch(self, epoch: int, draw: Draw, first: int, end: int) -> Iterator[Tuple[int, Optional[MapBatch]]]:
        """Batches ``first..end`` of ``epoch`` (drawn as ``draw``) in order, as ``(index,
        batch)``; ``batch`` is None for a batch whose every sample was skipped."""
        while len(self._shms) < self._count:
            self._start(len(self._shms))
        self._run += 1
        run = self._run
        for conn in self._conns:
            conn.send(("run", run, epoch, first, end, draw))
        for i in range(first, end):
            if self._run != run:
                return  # a later epoch (a newer iterator) took the workers
            w = i % self._count
            yield i, self._receive(w, run, (epoch, draw), i, end)

    def _receive(self, w: int, run: int, drawn: Tuple[int, Draw], i: int, end: int) -> Optional[MapBatch]:
        """Worker ``w``'s batch ``i`` of this run, restarting the worker if it died."""
        epoch, draw = drawn
        restarts = 0
        t0 = time.perf_counter()
        while True:
            conn, proc = self._conns[w], self._procs[w]
            msg = None
            try:
                if self._early[w]:
                    msg = self._early[w].popleft()
                elif conn.poll(POLL_S):
                    msg = conn.recv()
            except (EOFError, OSError):
                msg = None
            if msg is None:
                if proc.is_alive():
                    continue
                restarts += 1
                self.restarts += 1
                if restarts > MAX_RESTARTS:
                    raise errors.SluiceError(
                        f"map worker process {w} died {restarts} times while making batch {i} of epoch {epoch} "
                        f"(exit code {proc.exitcode})"
                    )
                conn.close()
                proc.join(timeout=1)
                self._start(w)
                self._conns[w].send(("run", run, epoch, i, end, draw))
                continue
            if msg[0] == "fatal":
                raise _worker_failure(w, proc.pid, msg)
            if msg[1] != run:
                continue  # left over from an abandoned run
            if msg[0] == "error":
                self.wait_s += time.perf_counter() - t0
                raise _rebuild_error(msg[3], msg[4], msg[5])
            _, _, index, slot, n, shape, _, fields, stats = msg
            self._stats[w] = stats
            if index != i:
                continue  # cannot happen: a worker sends its batches in order
            batch: Optional[MapBatch] = None
            if fields is not None:
                batch = self._copy_fields(w, slot, fields)
            elif slot is not None:
                batch = self._copy_out(w, slot, n, shape)
            if slot is not None:
                try:
                    conn.send(("free", run, slot))
                except OSError:
                    pass  # it died after sending this batch: the next receive restarts it
            self.wait_s += time.perf_counter() - t0
            return batch

    def _copy_out(self, w: int, slot: int, n: int, shape: Tuple[Any, ...]) -> MapBatch:
        (image_shape, dtype, layout, has_weight, metadata, records) = shape
        buf = self._shms[w].buf
        assert buf is not None
        base = slot * self._slot_bytes
        image = np.frombuffer(buf, dtype=np.dtype(dtype), count=int(np.prod(image_shape)), offset=base)
        fields: MapBatch = {
            "image": image.reshape(image_shape).copy(),
            "label": np.frombuffer(buf, np.int64, n, base + self._label_at).copy(),
            "key": np.frombuffer(buf, np.int64, n, base + self._key_at).copy(),
        }
        if has_weight:
            fields["weight"] = np.frombuffer(buf, np.float32, n, base + self._weight_at).copy()
        if records is not None:
            kind, data = records
            if kind == "inline":
                fields.update(data)
            else:
                for name, shape_, dtype_, offset in data:
                    count = int(np.prod(shape_, dtype=np.int64))
                    flat = np.frombuffer(buf, np.dtype(dtype_), count, base + self._records_at + offset)
                    fields[name] = flat.reshape(shape_).copy()
        if metadata is not None:
            fields.update(metadata)
        fields["__layout__"] = layout
        return fields

    def start_trace(self) -> None:
        """Makes every worker record a trace: the running ones now, the others when they
        start."""
        self._tracing = True
        for conn in self._conns:
            try:
                conn.send(("trace", "start"))
            except OSError:
                pass  # it died: its restart starts tracing

    def stop_trace(self, path: str) -> int:
        """Stops the workers' traces and adds their events to the trace file ``path`` that
        the parent wrote (Perfetto: their packets appended, every worker a process of its
        own with its own packet sequence; Chrome JSON: their events added to
        ``traceEvents``). Returns the events added. A worker that died while tracing
        leaves its events out."""
        self._tracing = False
        with tempfile.TemporaryDirectory(prefix="sluice-trace-") as tmp:
            asked = []
            for w, conn in enumerate(self._conns):
                part = os.path.join(tmp, f"worker-{w}{os.path.splitext(path)[1]}")
                try:
                    conn.send(("trace", "stop", part))
                    asked.append((w, part))
                except OSError:
                    pass
            answers = [(part, self._traced(w)) for w, part in asked]
            written = [(part, events) for part, events in answers if events is not None]
            _append_traces(path, [part for part, _ in written])
            return sum(events for _, events in written)

    def _traced(self, w: int) -> Optional[int]:
        """Worker ``w``'s answer to a trace stop (its events), keeping the batches it sends
        meanwhile for :meth:`_receive`; None if it died first."""
        conn, proc = self._conns[w], self._procs[w]
        while True:
            try:
                if conn.poll(POLL_S):
                    msg = conn.recv()
                    if msg[0] == "traced":
                        return msg[1]  # type: ignore[no-any-return]
                    self._early[w].append(msg)
                    continue
            except (EOFError, OSError):
                return None
            if not proc.is_alive():
                return None

    def _copy_fields(self, w: int, slot: Optional[int], fields: Tuple[str, Any, str]) -> MapBatch:
        """A ``map_batch`` result: sent through the pipe, or copied out of its slot."""
        kind, data, layout = fields
        if kind == "inline":
            batch: MapBatch = dict(data)
        else:
            buf = self._shms[w].buf
            assert buf is not None and slot is not None
            base = slot * self._slot_bytes
            batch = {}
            for name, shape, dtype, offset in data:
                dt = np.dtype(dtype)
                flat = np.frombuffer(buf, dt, int(np.prod(shape, dtype=np.int64)), base + offset)
                batch[name] = flat.reshape(shape).copy()
        batch["__layout__"] = layout
        return batch

    def stats(self) -> List[Dict[str, Any]]:
        """Each worker's latest native stats."""
        return [json.loads(s) for s in self._stats if s is not None]

    def close(self) -> None:
        """Stops the workers and frees the shared memory; a later epoch starts them again."""
        self._finalizer()
        self._shms, self._procs, self._conns = [], [], []
        self._stats = [None] * self._count
        self._finalizer = weakref.finalize(self, MapWorkers._shutdown, self._procs, self._conns, self._shms)

    @staticmethod
    def _shutdown(procs: List[Any], conns: List[Connection], shms: List[shared_memory.SharedMemory]) -> None:
        for conn in conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError, AttributeError):
                pass
        deadline = time.monotonic() + 2.0
        for proc in procs:
            if proc is None:
                continue
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=1.0)
        for conn in conns:
            if conn is not None:
                conn.close()
        for shm in shms:
            shm.close()
            try:
                shm.unlink()
            except FileNotFoundError:
                pass


def _append_traces(path: str, parts: List[str]) -> None:
    """Adds the events of the trace files ``parts`` to the trace file ``path`` (all of the
    format its name asks for)."""
    if path.lower().endswith(".json"):
        with open(path) as f:
            whole = json.load(f)
        for part in parts:
            with open(part) as f:
                whole["traceEvents"].extend(json.load(f)["traceEvents"])
        with open(path, "w") as f:
            json.dump(whole, f)
        return
    with open(path, "ab") as out:
        for part in parts:
            with open(part, "rb") as f:
                # A Perfetto trace is a sequence of packets: two files' bytes end to end
                # are one trace holding both.
                out.write(f.read())


def default_processes(threads: Any) -> int:
    """Worker processes when the loader is not told: its thread count, or one per core."""
    if isinstance(threads, int) and threads > 0:
        return threads
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
