"""Importance sampling with its default settings trains a model as well as uniform sampling
does, with SGD + momentum and the batch ``weight`` applied to the per-sample loss as the
docs say (issue 44: before, the default sampler drew the uncached half of the data rarely
and with weights up to 20, and the same model with SGD stopped learning after one epoch:
10-18% test accuracy against uniform's 91-95%).

scikit-learn's digits (real handwritten digits, shipped with scikit-learn), a cache of half
the decoded dataset, local storage (the sampler and the cache do not depend on timing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import sluice

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("sklearn.datasets")

EPOCHS = 8
SIZE = 28


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Path, int]:
    """Digits as 32x32 RGB PNGs: train/<digit>/*.png (every third image held out in test/)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("digits")
    d = datasets.load_digits()
    x = (d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    n_train = 0
    for i, (img, label) in enumerate(zip(x, d.target)):
        split = "test" if i % 3 == 0 else "train"
        n_train += split == "train"
        out = root / split / str(int(label))
        out.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").resize((32, 32), Image.BILINEAR).convert("RGB").save(out / f"{i:05d}.png")
    return root / "train", root / "test", n_train


def spec(root: Path, train: bool, seed: int = 0) -> Dict[str, Any]:
    ops: List[Dict[str, Any]] = [{"op": "decode"}]
    if train:
        ops.append({"op": "random_resized_crop", "size": SIZE, "scale": [0.7, 1.0], "ratio": [0.9, 1.1]})
    else:
        ops += [{"op": "resize", "size": SIZE}, {"op": "center_crop", "size": SIZE}]
    ops += [{"op": "normalize", "mean": [0.5] * 3, "std": [0.5] * 3}, {"op": "layout", "order": "chw"}]
    return {
        "source": {"kind": "image_folder", "root": str(root)},
        "ops": ops,
        "shuffle": {"kind": "global" if train else "none"},
        "batch": {"size": 64 if train else 512},
        "seed": seed,
        "threads": 1,
    }


def model() -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip


def train_and_test(train: Path, test: Path, n_train: int, importance: bool) -> Tuple[float, float]:
    """SGD (lr 0.05, momentum 0.9) for EPOCHS epochs; the last epoch's mean training loss
    and the test accuracy."""
    s = spec(train, train=True)
    if importance:
        s["cache"] = {"budget": n_train * 32 * 32 * 3 // 2, "level": "decoded", "policy": "importance"}
        s["sampling"] = {"kind": "importance"}  # every knob at its default
    loader = sluice.Loader(s, output="torch")
    torch.manual_seed(0)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    ce = torch.nn.CrossEntropyLoss(reduction="none")
    last = 0.0
    for _ in range(EPOCHS):
        total = count = 0.0
        for b in loader:
            with loader.record_importance(b["key"]) as rec:
                losses = ce(net(b["image"]), b["label"])
                if importance:
                    rec.losses(losses)
                loss = (losses * b["weight"]).mean() if importance else losses.mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            total += float(losses.detach().sum())
            count += len(losses)
        last = total / count
    net.eval()
    correct = seen = 0
    with torch.no_grad():
        for b in sluice.Loader(spec(test, train=False), output="torch"):
            correct += int((net(b["image"]).argmax(1) == b["label"]).sum())
            seen += len(b["label"])
    return last, correct / seen


def test_sgd_with_the_default_importance_sampler_learns_as_uniform_does(digits: Tuple[Path, Path, int]) -> None:
    torch.set_num_threads(1)
    train, test, n_train = digits
    uniform_loss, uniform_acc = train_and_test(train, test, n_train, importance=False)
    loss, acc = train_and_test(train, test, n_train, importance=True)
    assert uniform_acc > 0.85, f"the uniform baseline itself did not train: {uniform_acc:.3f}"
    assert loss < 0.5, f"importance-sampled training loss {loss:.3f} after {EPOCHS} epochs (uniform {uniform_loss:.3f})"
    assert acc > uniform_acc - 0.03, f"importance sampling: test accuracy {acc:.3f} against uniform's {uniform_acc:.3f}"
