"""``map`` worker processes started from real script files, as users run them
(``python train.py``): a script without ``if __name__ == "__main__":`` works (the workers
import the function's module and never run the script), a function defined in the script
itself is refused before any process starts, naming it and the fix, and what a worker
raises while it starts reaches the user as the ``__cause__`` with the worker's traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

#: A module of map functions beside the script. Imported in a worker process (a pid other
#: than the one in SLUICE_TEST_PARENT), `fragile` fails at import, as a module needing
#: something only the parent has would.
AUGMENT = """
import os

import numpy as np

if os.environ.get("SLUICE_TEST_FRAGILE") and os.environ.get("SLUICE_TEST_PARENT") not in (None, str(os.getpid())):
    raise RuntimeError("augment needs the parent's GPU handle")


def invert(image: np.ndarray, sample: object) -> np.ndarray:
    return 255 - image
"""

#: Builds a loader with two worker processes at the top level of the script, unguarded.
HEADER = """
import os
import sys

import sluice
from augment import invert

os.environ["SLUICE_TEST_PARENT"] = str(os.getpid())
"""

RUN = """
pipe = sluice.Pipeline.image_folder(sys.argv[1]).decode().center_crop(16).map({fn}).batch(8)
loader = sluice.Loader(pipe, processes=2)
try:
    batches = list(loader)
except sluice.SluiceError as e:
    cause = e.__cause__
    print("ERROR", e)
    print("CAUSE", type(cause).__name__, cause)
    print("NOTES", *getattr(cause, "__notes__", []))
    sys.exit(3)
print("BATCHES", len(batches), sum(len(b["key"]) for b in batches))
"""


def _run_script(tmp_path: Path, dataset: Path, body: str, env: Dict[str, str]) -> "subprocess.CompletedProcess[str]":
    (tmp_path / "augment.py").write_text(AUGMENT)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(HEADER + body))
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, str(script), str(dataset)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
    )


def test_a_script_without_a_main_guard_runs_its_map_in_worker_processes(tmp_path: Path, dataset: Path) -> None:
    out = _run_script(tmp_path, dataset, RUN.format(fn="invert"), {})
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    assert "BATCHES 6 48" in out.stdout, out.stdout
    assert "Traceback" not in out.stderr, out.stderr


def test_a_map_function_defined_in_the_script_is_refused_before_any_process_starts(
    tmp_path: Path, dataset: Path
) -> None:
    body = """
def local_invert(image, sample):
    return 255 - image

""" + RUN.format(fn="local_invert")
    out = _run_script(tmp_path, dataset, body, {})
    assert out.returncode == 1, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("sluice.errors.SpecError: map function `__main__:local_invert` is defined in"), last
    assert str(tmp_path / "train.py") in last, last
    assert "move `local_invert` into a module of its own" in last and "processes=0" in last, last
    # Refused at Loader(): no worker process ran, so nothing else was printed.
    assert out.stderr.count("Traceback") == 1, out.stderr


def test_a_worker_that_fails_to_start_gives_its_own_exception_as_the_cause(tmp_path: Path, dataset: Path) -> None:
    out = _run_script(tmp_path, dataset, RUN.format(fn="invert"), {"SLUICE_TEST_FRAGILE": "1"})
    assert out.returncode == 3, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    lines = {line.split(" ", 1)[0]: line for line in out.stdout.splitlines()}
    assert lines["ERROR"].startswith("ERROR map worker process 0 failed: builtins.RuntimeError:"), out.stdout
    assert lines["CAUSE"] == "CAUSE RuntimeError augment needs the parent's GPU handle", out.stdout
    # The worker's traceback, as a note on the cause: where in the module it was raised.
    assert "in map worker process 0" in out.stdout and 'augment.py", line 7' in out.stdout, out.stdout
    assert "Traceback" not in out.stderr, out.stderr
