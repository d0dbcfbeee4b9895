"""The recipes in ``python/examples/``: each sluice recipe trains for one short epoch on
generated data, and differs from its torchvision version only in the statements marked
``# data`` (and the imports and docstring)."""

from __future__ import annotations

import ast
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")
PIL_Image = pytest.importorskip("PIL.Image")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def train(script: str, *args: str) -> "tuple[int, float]":
    """Runs an example; returns (batches trained, final loss) from its last line."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"trained (\d+) batches, final loss (\S+)", proc.stdout)
    assert m, proc.stdout
    return int(m.group(1)), float(m.group(2))


@pytest.fixture(scope="module")
def cifar_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 32x32 PNGs in 4 class folders, each class its own colour plus noise."""
    root = tmp_path_factory.mktemp("cifar") / "train"
    rng = np.random.default_rng(0)
    for c in range(4):
        (root / f"class_{c}").mkdir(parents=True)
        base = np.array([(c * 70) % 256, 255 - c * 60, (c * 130) % 256], dtype=np.int16)
        for i in range(16):
            img = np.clip(base + rng.integers(-40, 40, size=(32, 32, 3)), 0, 255).astype(np.uint8)
            PIL_Image.fromarray(img).save(root / f"class_{c}" / f"{i:03}.png")
    return root


def test_imagenet_recipe_trains_an_epoch(dataset: Path) -> None:
    """48 generated JPEGs, batches of 16 with drop_last: 3 batches with TrivialAugmentWide,
    RandomErasing and MixUp/CutMix, and a finite loss."""
    steps, loss = train("imagenet_sluice.py", "--data", str(dataset), "--size", "32", "--batch", "16", "--workers", "2")
    assert steps == 3 and math.isfinite(loss) and loss > 0


def test_cifar_recipe_trains_an_epoch(cifar_like: Path) -> None:
    """64 PNGs of 32x32, padding 4 and a 32 crop, batches of 16: an epoch of 4 batches,
    stopped after 3 by ``--steps``, with a finite loss."""
    steps, loss = train("cifar_sluice.py", "--data", str(cifar_like), "--batch", "16", "--workers", "2", "--steps", "3")
    assert steps == 3 and math.isfinite(loss) and loss > 0


@pytest.fixture(scope="module")
def detection_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 generated JPEGs in 3 classes with boxes (``sluice gen-images --boxes``)."""
    from sluice import _sluice

    root = tmp_path_factory.mktemp("det")
    _sluice.generate_dataset(str(root), images=24, classes=3, boxes=True, texture=0)
    return root


@pytest.mark.parametrize("recipe", ["torchvision", "sluice"])
def test_detection_recipe_trains_a_short_epoch(detection_data: Path, recipe: str) -> None:
    """Both detection recipes train the tiny Faster R-CNN for 2 batches of 4 at 64 px with
    a finite loss."""
    args = ["--annotations", str(detection_data / "instances.json"), "--images", str(detection_data)]
    args += ["--classes", "3", "--size", "64", "--batch", "4", "--workers", "1", "--steps", "2"]
    steps, loss = train(f"detection_{recipe}.py", *args)
    assert steps == 2 and math.isfinite(loss) and loss > 0


def statements_but_data(path: Path) -> List[str]:
    """The module's code after its imports, statement by statement, without the ones whose
    first line is marked ``# data`` (and the module docstring)."""
    source = path.read_text()
    lines = source.splitlines()
    out: List[str] = []

    def walk(body: List[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt is body[0]:
                continue  # a docstring
            if "# data" in lines[stmt.lineno - 1]:
                continue
            if isinstance(stmt, ast.FunctionDef):
                out.append(f"def {stmt.name}")
                walk(stmt.body)
            else:
                out.append(ast.get_source_segment(source, stmt) or "")

    walk(ast.parse(source).body)
    return out


@pytest.mark.parametrize("recipe", ["imagenet", "cifar", "detection"])
def test_the_sluice_recipe_changes_only_its_data_statements(recipe: str) -> None:
    theirs = statements_but_data(EXAMPLES / f"{recipe}_torchvision.py")
    ours = statements_but_data(EXAMPLES / f"{recipe}_sluice.py")
    assert ours == theirs
    marked = [line for line in (EXAMPLES / f"{recipe}_sluice.py").read_text().splitlines() if line.endswith("# data")]
    assert len(marked) == (3 if recipe == "imagenet" else 2), marked
