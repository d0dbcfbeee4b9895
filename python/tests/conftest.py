"""Shared fixtures: small generated datasets (made by sluice itself, never downloaded) and
a helper to run Python in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Optional

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


def run_python(code: str, *args: str, timeout: float = 60, env: Optional[Dict[str, str]] = None) -> "subprocess.CompletedProcess[str]":
    """Runs `code` in a new Python process (with `args` as sys.argv[1:])."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    cmd: List[str] = [sys.executable, "-c", textwrap.dedent(code), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
