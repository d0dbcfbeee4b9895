"""Shared fixtures: small generated datasets (made by sluice itself, never downloaded) and
a helper to run Python in a fresh process."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

import sluice

#: Images in the shared dataset, and its classes.
N_IMAGES = 48
N_CLASSES = 4


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 small JPEGs in 4 class folders (ImageFolder layout)."""
    root = tmp_path_factory.mktemp("data") / "train"
    info = sluice.generate_dataset(root, images=N_IMAGES, classes=N_CLASSES, seed=1)
    assert info["images"] == N_IMAGES
    return root


@pytest.fixture(scope="session")
def bad_dataset(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, object]:
    """24 good JPEGs plus 5 bad files, one of each kind (truncated, empty, not an image,
    garbage, a huge header)."""
    root = tmp_path_factory.mktemp("bad") / "train"
    info = sluice.generate_dataset(root, images=24, classes=3, seed=2, corrupt=5)
    assert len(info["bad_files"]) == 5
    return {"root": root, "bad_files": [str(p) for p in info["bad_files"]], "good": 24}


def small_pipeline(root: Path, batch: int = 8, size: int = 32, seed: int = 0) -> sluice.Pipeline:
    """The standard training pipeline at a small size, two threads."""
    return (
        sluice.Pipeline.image_folder(root)
        .decode()
        .random_resized_crop(size)
        .random_horizontal_flip()
        .batch(batch)
        .seed(seed)
        .threads(2)
    )


def run_python(
    code: str, *args: str, timeout: float = 60, env: Optional[Dict[str, str]] = None
) -> "subprocess.CompletedProcess[str]":
    """Runs `code` in a new Python process (with `args` as sys.argv[1:])."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    cmd: List[str] = [sys.executable, "-c", textwrap.dedent(code), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


REPO = Path(__file__).resolve().parents[2]


def sluice_binary() -> Path:
    """The ``sluice`` binary: ``$SLUICE_BIN``, else the one ``cargo build`` left in target/
    (the test is skipped when there is none)."""
    if os.environ.get("SLUICE_BIN"):
        return Path(os.environ["SLUICE_BIN"])
    for profile in ("debug", "release"):
        path = REPO / "target" / profile / "sluice"
        if path.exists():
            return path
    pytest.skip("the sluice binary is not built (cargo build -p sluice-cli)")
    raise AssertionError("unreachable")


def free_addr() -> str:
    """A 127.0.0.1 address with a port nothing listens on (yet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@contextlib.contextmanager
def sluice_service(
    roots: Sequence[Path],
    journal: Path,
    token: Optional[str] = None,
    workers: int = 1,
    worker_args: Sequence[str] = (),
    worker_env: Optional[Dict[str, str]] = None,
    python_modules: Sequence[str] = (),
) -> Iterator[str]:
    """A real ``sluice dispatcher`` and ``workers`` worker processes on 127.0.0.1, allowed to
    read under ``roots`` and to run ``map`` functions of ``python_modules`` (the workers
    with ``worker_args`` and ``worker_env`` added); yields the dispatcher's address and
    kills them all at the end."""
    exe = str(sluice_binary())
    addr = free_addr()
    allow = [arg for root in roots for arg in ("--allow-root", str(root))]
    allow += [arg for module in python_modules for arg in ("--allow-python-module", module)]
    auth = ["--token", token] if token is not None else []
    procs: List["subprocess.Popen[bytes]"] = [
        subprocess.Popen([exe, "service", "dispatcher", "--listen", addr, "--journal", str(journal), *allow, *auth])
    ]
    try:
        for _ in range(workers):
            cmd = [exe, "service", "worker", "--dispatcher", addr, "--threads", "1", *allow, *auth, *worker_args]
            procs.append(subprocess.Popen(cmd, env={**os.environ, **(worker_env or {})}))
        yield addr
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Tuple[str, int]]:
    """A redis-server of its own, on a free loopback port: (url, port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/", port
    finally:
        p.kill()
        p.wait()
