"""Every public method of Loader, RemoteLoader and StreamLoader called from a second thread
while the first waits in ``next()``: each returns within a bound (none waits on a lock the
waiting thread holds while the GIL is needed), the methods that must follow the batch in
progress wait for it without the GIL, and Ctrl-C still interrupts the wait.

Each scenario runs in a child process with a timeout, so a deadlock (which no signal can
end) fails the test instead of hanging the run. The child prints a line per call:
``call NAME`` before it, ``done NAME OUTCOME SECONDS`` after it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from conftest import sluice_service

#: Seconds any call may take while another thread waits in next().
BOUND = 5.0
#: Seconds the child may run in all (a deadlock runs into it).
CHILD_TIMEOUT = 60.0

# The child's side. The main thread waits in next(); a second thread makes the `free`
# calls (each must return within BOUND), then starts each `serial` call on a thread of its
# own (they need the loader between batches, so they wait for the batch in progress),
# makes the first free calls again while those wait, and sends SIGINT: the main thread's
# next() must raise KeyboardInterrupt promptly, after which the serial calls finish.
HARNESS = """
import os, signal, sys, threading, time
import sluice, sluice.stream
signal.signal(signal.SIGINT, signal.default_int_handler)

LOG = threading.Lock()

def log(*parts):
    with LOG:
        print(*parts, flush=True)

def timed(name, fn):
    log("call", name)
    t0 = time.monotonic()
    try:
        fn()
        outcome = "ok"
    except Exception as e:
        outcome = type(e).__name__
    log("done", name, outcome, f"{time.monotonic() - t0:.3f}")

def scenario(wait, free, serial):
    started = threading.Event()
    serial_threads = []
    sent = []

    def second():
        started.wait()
        time.sleep(0.5)  # the main thread is inside next() by now
        for name, fn in free:
            timed(name, fn)
        for name, fn in serial:
            t = threading.Thread(target=timed, args=(name, fn))
            t.start()
            serial_threads.append(t)
        time.sleep(0.5)
        for name, fn in free[:3]:
            timed("again-" + name, fn)
        sent.append(time.monotonic())
        log("sigint")
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=second, daemon=True)
    t.start()
    started.set()
    try:
        wait()
        log("next-returned")
    except KeyboardInterrupt:
        log("interrupted", f"{time.monotonic() - sent[0]:.3f}" if sent else "early")
    t.join()
    for s in serial_threads:
        s.join()
    log("end")
"""


def run_scenario(code: str, *args: str) -> Tuple[List[str], Dict[str, Tuple[str, float]]]:
    """Runs HARNESS + `code` in a child; its output lines and each call's (outcome, seconds).
    Fails, rather than hangs, when the child deadlocks."""
    cmd = [sys.executable, "-c", HARNESS + textwrap.dedent(code), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    else:
        out = None
    if out is not None:
        pending = [ln.split()[1] for ln in out.splitlines() if ln.startswith("call ")]
        finished = {ln.split()[1] for ln in out.splitlines() if ln.startswith("done ")}
        stuck = [name for name in pending if name not in finished]
        pytest.fail(f"the process hung (deadlock) in {stuck}; its output:\n{out}")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    calls = {}
    for ln in lines:
        if ln.startswith("done "):
            _, name, outcome, seconds = ln.split()
            calls[name] = (outcome, float(seconds))
    return lines, calls


def check(lines: List[str], calls: Dict[str, Tuple[str, float]], free: List[str], serial: List[str]) -> None:
    for name in free:
        assert name in calls, f"{name} never returned:\n" + "\n".join(lines)
        outcome, seconds = calls[name]
        assert outcome == "ok", f"{name}: {outcome}"
        assert seconds < BOUND, f"{name} took {seconds:.2f}s while another thread waited in next()"
    for name in serial:
        assert name in calls, f"{name} never returned:\n" + "\n".join(lines)
        assert calls[name][0] == "ok", f"{name}: {calls[name][0]}"
    interrupted = [ln for ln in lines if ln.startswith("interrupted")]
    assert interrupted, "Ctrl-C did not interrupt next():\n" + "\n".join(lines)
    assert float(interrupted[0].split()[1]) < 2.0, interrupted[0]
    assert lines[-1] == "end"


LOADER = """
root, trace = sys.argv[1], sys.argv[2]
# One thread and a second per sample: the first batch takes 16 s.
pipe = sluice.Pipeline.image_folder(root).decode().center_crop(16).sleep(1_000_000).batch(16).threads(1)
loader = sluice.Loader(pipe)
state = loader.state_dict()
it = iter(loader)

def traced():
    with loader.trace(trace):
        pass

def set_threads():
    loader.threads = 1

free = [
    ("len", lambda: len(loader)),
    ("epoch", lambda: loader.epoch),
    ("remaining", lambda: it.remaining),
    ("iterator_epoch", lambda: it.epoch),
    ("length_hint", lambda: it.__length_hint__()),
    ("stats", loader.stats),
    ("state_dict", loader.state_dict),
    ("threads", lambda: loader.threads),
    ("set_threads", lambda: loader.set_threads(1)),
    ("threads_setter", set_threads),
    ("rank", lambda: loader.rank),
    ("world_size", lambda: loader.world_size),
    ("output", lambda: loader.output),
    ("samples_per_epoch", lambda: loader.samples_per_epoch),
    ("num_samples", lambda: loader.num_samples),
    ("classes", lambda: loader.classes),
    ("fingerprint", lambda: loader.fingerprint),
    ("pipeline", lambda: loader.pipeline),
    ("path_of", lambda: loader.path_of(0)),
    ("repr", lambda: repr(loader)),
    ("report", lambda: loader.report([0, 1], [1.0, 2.0])),
    ("update_gradient_info", lambda: loader.update_gradient_info([0], [0.5])),
    ("record_importance", lambda: loader.record_importance([0])),
    ("close_trace", loader.close_trace),
    ("trace", traced),
    # Last: these move the loader (the waiting iterator is retired at its next batch).
    ("set_epoch", lambda: loader.set_epoch(0)),
    ("load_state_dict", lambda: loader.load_state_dict(state)),
    ("iter", lambda: iter(loader)),
]
scenario(lambda: next(it), free, [])
"""
LOADER_FREE = [
    "len",
    "epoch",
    "remaining",
    "iterator_epoch",
    "length_hint",
    "stats",
    "state_dict",
    "threads",
    "set_threads",
    "threads_setter",
    "rank",
    "world_size",
    "output",
    "samples_per_epoch",
    "num_samples",
    "classes",
    "fingerprint",
    "pipeline",
    "path_of",
    "repr",
    "report",
    "update_gradient_info",
    "record_importance",
    "close_trace",
    "trace",
    "set_epoch",
    "load_state_dict",
    "iter",
]


def test_loader_methods_from_another_thread_while_next_waits(dataset: Path, tmp_path: Path) -> None:
    lines, calls = run_scenario(LOADER, str(dataset), str(tmp_path / "trace.json"))
    check(lines, calls, LOADER_FREE, [])


STREAM = """
url, rehearsal_dir = sys.argv[1], sys.argv[2]
ops = [{"op": "decode"}, {"op": "center_crop", "size": 16}]
loader = sluice.stream.StreamLoader(
    url, "empty", group="job", ops=ops, new_per_batch=4, rehearsal_per_batch=2,
    rehearsal={"capacity": 8, "policy": "reservoir", "dir": rehearsal_dir}, threads=1,
)
state = loader.state_dict()
free = [
    ("stats", loader.stats),
    ("rehearsal_ids", loader.rehearsal_ids),
    ("iter", lambda: iter(loader)),
]
serial = [
    ("state_dict", loader.state_dict),
    ("load_state_dict", lambda: loader.load_state_dict(state)),
]
scenario(lambda: next(loader), free, serial)
"""


def test_stream_loader_methods_from_another_thread_while_next_waits_on_an_empty_stream(
    redis: Tuple[str, int], tmp_path: Path
) -> None:
    lines, calls = run_scenario(STREAM, redis[0], str(tmp_path / "rehearsal"))
    check(lines, calls, ["stats", "rehearsal_ids", "iter", "again-stats"], ["state_dict", "load_state_dict"])


REMOTE = """
addr, root, trace = sys.argv[1], sys.argv[2], sys.argv[3]
# One worker thread and a second per sample: the first batch takes 16 s.
pipe = sluice.Pipeline.image_folder(root).decode().center_crop(16).sleep(1_000_000).batch(16)
loader = sluice.RemoteLoader(pipe, dispatcher=addr, job="threads", connect_timeout=30)
state = loader.state_dict()
it = iter(loader)

def traced():
    with loader.trace(trace):
        pass

free = [
    ("len", lambda: len(loader)),
    ("epoch", lambda: loader.epoch),
    ("iterator_epoch", lambda: it.epoch),
    ("stats", loader.stats),
    ("rank", lambda: loader.rank),
    ("world_size", lambda: loader.world_size),
    ("samples_per_epoch", lambda: loader.samples_per_epoch),
    ("job", lambda: loader.job),
    ("fingerprint", lambda: loader.fingerprint),
    ("duplicates_dropped", lambda: loader.duplicates_dropped),
    ("shared_memory_batches", lambda: loader.shared_memory_batches),
    ("output", lambda: loader.output),
    ("repr", lambda: repr(loader)),
    ("record_importance", lambda: loader.record_importance([0])),
    ("close_trace", loader.close_trace),
]
serial = [
    ("state_dict", loader.state_dict),
    ("trace", traced),
    ("report", lambda: loader.report([0], [1.0])),
    ("update_gradient_info", lambda: loader.update_gradient_info([0], [0.5])),
    ("set_epoch", lambda: loader.set_epoch(0)),
    ("load_state_dict", lambda: loader.load_state_dict(state)),
    ("iter", lambda: iter(loader)),
]
scenario(lambda: next(it), free, serial)
"""
REMOTE_FREE = [
    "len",
    "epoch",
    "iterator_epoch",
    "stats",
    "rank",
    "world_size",
    "samples_per_epoch",
    "job",
    "fingerprint",
    "duplicates_dropped",
    "shared_memory_batches",
    "output",
    "repr",
    "record_importance",
    "close_trace",
]


def test_remote_loader_methods_from_another_thread_while_next_waits(dataset: Path, tmp_path: Path) -> None:
    with sluice_service([dataset], tmp_path / "journal") as addr:
        lines, calls = run_scenario(REMOTE, addr, str(dataset), str(tmp_path / "trace.json"))
    # A uniform job takes no importance reports: the service says so, promptly.
    for name in ("report", "update_gradient_info"):
        assert calls[name][0] == "JobFailedError", calls[name]
        calls[name] = ("ok", calls[name][1])
    check(lines, calls, REMOTE_FREE, ["state_dict", "trace", "report", "set_epoch", "load_state_dict", "iter"])


STREAM_REENTRANT = """
url, rehearsal_dir = sys.argv[1], sys.argv[2]
ops = [{"op": "decode"}, {"op": "center_crop", "size": 16}]
loader = sluice.stream.StreamLoader(
    url, "empty", group="job", ops=ops, new_per_batch=4,
    rehearsal={"capacity": 8, "policy": "reservoir", "dir": rehearsal_dir}, threads=1,
)

# A handler that checkpoints (as a trainer might on SIGTERM) runs while next() waits on
# this very thread: it cannot wait for that next() to finish, so it raises.
def checkpoint(signum, frame):
    loader.state_dict()

signal.signal(signal.SIGALRM, checkpoint)
signal.setitimer(signal.ITIMER_REAL, 0.5)
try:
    next(loader)
    log("next-returned")
except sluice.SluiceError as e:
    log("raised", type(e).__name__, str(e))

# The main thread waits for another thread's next() to finish: Ctrl-C interrupts it.
threading.Thread(target=lambda: next(loader), daemon=True).start()
time.sleep(0.5)
sent = []
def interrupt():
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGINT)
threading.Timer(0.5, interrupt).start()
try:
    loader.state_dict()
    log("state_dict-returned")
except KeyboardInterrupt:
    log("interrupted", f"{time.monotonic() - sent[0]:.3f}")
sys.stdout.flush()
os._exit(0)  # the other thread's next() waits for good: the stream stays empty
"""


def test_a_stream_wait_is_not_waited_for_by_its_own_thread_and_a_waiting_caller_answers_ctrl_c(
    redis: Tuple[str, int], tmp_path: Path
) -> None:
    lines, _ = run_scenario(STREAM_REENTRANT, redis[0], str(tmp_path / "rehearsal"))
    assert lines[0].startswith("raised SluiceError StreamLoader.state_dict()"), lines
    assert "during next()" in lines[0]
    assert lines[1].startswith("interrupted"), lines
    assert float(lines[1].split()[1]) < 2.0, lines[1]
