"""Ctrl-C while waiting for a slow batch: KeyboardInterrupt comes promptly, and a caught
interrupt loses nothing (the next call returns the same batch)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

# Throttled storage: every read waits 200 ms and there is one thread, so the first batch
# of 16 takes over 3 s: the SIGINT always lands while Python waits inside sluice.
# Python installs its KeyboardInterrupt handler only if SIGINT was not ignored when it
# started, and a shell ignores SIGINT in what it runs in the background (`cmd &` without
# job control), so a test run started that way would never see the interrupt: the child
# installs the handler itself, as an interactive Python has it.
SLOW = """
import signal, sys, sluice
signal.signal(signal.SIGINT, signal.default_int_handler)
pipe = (sluice.Pipeline.image_folder(sys.argv[1]).decode().center_crop(16).batch(16)
        .threads(1).throttled(latency_ms=200, bandwidth_mb_s=1000))
loader = sluice.Loader(pipe)
it = iter(loader)
print("waiting", flush=True)
"""


def start(code: str, dataset: Path) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SLOW + code), str(dataset)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigint_raises_keyboard_interrupt_promptly(dataset: Path) -> None:
    proc = start("next(it)\nprint('got a batch', flush=True)\n", dataset)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "waiting"
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    elapsed = time.monotonic() - sent
    assert elapsed < 2.0, f"took {elapsed:.2f}s to stop after SIGINT"
    assert "KeyboardInterrupt" in err
    assert "got a batch" not in out
    assert proc.returncode != 0


def test_a_caught_interrupt_loses_nothing(dataset: Path) -> None:
    code = """
try:
    next(it)
    print("no interrupt")
except KeyboardInterrupt:
    print("interrupted", flush=True)
batch = next(it)
print("index", batch.index, "size", batch.size, flush=True)
print("remaining", it.remaining, flush=True)
"""
    proc = start(code, dataset)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "waiting"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = out.split("\n")
    assert lines[0] == "interrupted"
    assert lines[1] == "index 0 size 16"
    assert lines[2] == "remaining 2"
