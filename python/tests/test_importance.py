"""Importance feedback from Python: report / record_importance / update_gradient_info
reshape later epochs, batches carry unbiasing weights, the cache reports its stats, and
state_dict carries the importance state so a new process resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import sluice
from conftest import N_IMAGES, run_python, sluice_service, small_pipeline


def importance_spec(root: Path) -> Dict[str, Any]:
    spec = small_pipeline(root, batch=8, size=24, seed=3).to_dict()
    spec["cache"] = {"budget": "64MB", "level": "decoded", "policy": "importance"}
    spec["sampling"] = {"kind": "importance", "floor": 0.1, "coverage_epochs": 3}
    return spec


def fake_loss(keys: Any) -> np.ndarray:
    keys = np.asarray(keys)
    return np.where(keys % 4 == 0, 5.0, 0.1)


def test_report_reshapes_the_next_epoch_and_weights_are_unbiased(dataset: Path) -> None:
    loader = sluice.Loader(importance_spec(dataset))
    first = list(loader)
    assert all(np.all(b["weight"] == 1.0) for b in first), "uniform until scores exist"
    for b in first:
        with loader.record_importance(b["key"]) as rec:
            rec.losses(fake_loss(b["key"]))
    second = list(loader)
    keys = np.concatenate([b["key"] for b in second])
    weights = np.concatenate([b["weight"] for b in second])
    assert len(keys) == N_IMAGES
    hard = keys % 4 == 0
    assert hard.mean() > 0.4, "hard samples (a quarter) dominate the importance-sampled epoch"
    assert weights[hard].max() < 1.0 < weights[~hard].min()
    stats = loader.stats()
    assert stats["cache"]["hits"] > 0 and 0 < stats["cache"]["hit_rate"] <= 1
    assert stats["cache"]["level"] == "decoded"


def test_update_gradient_info_reduces_per_sample_gradients_to_norms(dataset: Path) -> None:
    loader = sluice.Loader(importance_spec(dataset))
    batch = next(iter(loader))
    grads = np.ones((len(batch["key"]), 3, 2, 2), dtype=np.float32)
    loader.update_gradient_info(batch["key"], grads)
    pending = {k: s for k, s, _ in loader.state_dict()["importance"]["pending"]}
    assert pending[int(batch["key"][0])] == pytest.approx(np.sqrt(12.0))


def test_a_failed_step_reports_nothing_and_mismatched_lengths_raise(dataset: Path) -> None:
    loader = sluice.Loader(importance_spec(dataset))
    with pytest.raises(RuntimeError):
        with loader.record_importance([1, 2]) as rec:
            rec.losses([1.0, 2.0])
            raise RuntimeError("step failed")
    assert loader.state_dict()["importance"]["pending"] == []
    with pytest.raises(ValueError, match="3 keys but 1 values"):
        loader.report([1, 2, 3], [0.5])


def plain_importance_spec(root: Path) -> Dict[str, Any]:
    """Importance sampling without a cache (so no hot set): equal scores draw uniformly."""
    spec = small_pipeline(root, batch=8, size=24, seed=5).to_dict()
    spec["sampling"] = {"kind": "importance", "floor": 0.1, "coverage_epochs": 40, "max_draws": 4.0}
    return spec


def test_a_report_of_1e308_leaves_the_weights_those_of_a_sane_report_and_is_counted(dataset: Path) -> None:
    # Issue 29: after report([a, b], [1e308, 1e308]) every weight of the next epoch was the
    # ceiling's 0.25 (the sums overflowed, the probabilities became NaN).
    def next_epoch(values: List[float]) -> Tuple[Dict[str, int], np.ndarray, Dict[str, Any]]:
        loader = sluice.Loader(plain_importance_spec(dataset))
        keys = next(iter(loader))["key"][:3]
        counts = loader.report(keys, values)
        weights = np.concatenate([b["weight"] for b in loader])
        return counts, weights, loader.stats()

    counts, absurd, stats = next_epoch([1e308, 1e308, float("nan")])
    _, sane, _ = next_epoch([100.0, 100.0, float("nan")])
    assert absurd.mean() == pytest.approx(1.0, rel=1e-6), f"weights after a 1e308 report: {absurd[:8]}"
    assert np.allclose(absurd, sane, rtol=1e-6)
    assert counts == {"accepted": 2, "refused": 1, "clamped": 2}
    assert stats["importance_reports"] == counts


def test_through_the_service_a_1e308_report_is_clamped_and_counted_in_the_reply(dataset: Path, tmp_path: Path) -> None:
    spec = plain_importance_spec(dataset)
    hard = [0, 1, 2, 3]

    def loss(keys: Any) -> List[float]:
        return [5.0 if k % 4 == 0 else 0.1 for k in np.asarray(keys).tolist()]

    def weighted(batches: List[Any]) -> List[Tuple[int, float]]:
        return sorted((int(k), float(w)) for b in batches for k, w in zip(b["key"], b["weight"]))

    # The reference: a local loader fed the same reports, the absurd values at the bound.
    local = sluice.Loader(spec)
    for b in local:
        local.report(b["key"], loss(b["key"]))
    local.report(hard, [1e30] * len(hard))
    want = weighted(list(local))
    with sluice_service([dataset], tmp_path / "journal") as addr:
        remote = sluice.RemoteLoader(spec, dispatcher=addr, job="absurd", output="numpy")
        for i, b in enumerate(remote):
            remote.report(b["key"], loss(b["key"]))
            if i == 1:
                counts = remote.report(hard + [9999, 5], [1e308] * len(hard) + [1.0, float("inf")])
                assert counts == {"accepted": 4, "refused": 1, "clamped": 4, "unknown": 1}
        got = weighted(list(remote))
    assert got == want, "the service clamped the 1e308s as the local loader takes 1e30"
    assert min(w for _, w in got) < 0.3 < 0.9 < max(w for _, w in got), "the four are drawn up to the ceiling"


SCRIPT = """
import json, sys
import numpy as np
import sluice
spec = json.loads(sys.argv[1]); mode = sys.argv[2]; path = sys.argv[3]
loader = sluice.Loader(spec)
def loss(k): return np.where(np.asarray(k) % 4 == 0, 5.0, 0.1)
out = []
if mode == "resume":
    loader.load_state_dict(json.load(open(path)))
    it = iter(loader)
else:
    for _ in range(2):
        for b in loader:
            loader.report(b["key"], loss(b["key"]))
    it = iter(loader)
    for i, b in enumerate(it):
        loader.report(b["key"], loss(b["key"]))
        if i == 1:
            json.dump(loader.state_dict(), open(path, "w"))
            break
    it = iter(loader) if mode == "stop" else it
    if mode == "stop":
        sys.exit(0)
for b in it:
    out.append([b["key"].tolist(), b["weight"].tolist(), int(b["image"].sum())])
    loader.report(b["key"], loss(b["key"]))
print(json.dumps(out))
"""


def test_state_dict_carries_importance_and_resumes_exactly_in_a_new_process(dataset: Path, tmp_path: Path) -> None:
    spec = json.dumps(importance_spec(dataset))
    state = tmp_path / "state.json"
    full = run_python(SCRIPT, spec, "full", str(tmp_path / "unused.json"))
    assert full.returncode == 0, full.stderr
    stop = run_python(SCRIPT, spec, "stop", str(state))
    assert stop.returncode == 0, stop.stderr
    assert json.loads(state.read_text())["importance"]["scores"], "scores travel in the state"
    resumed = run_python(SCRIPT, spec, "resume", str(state))
    assert resumed.returncode == 0, resumed.stderr
    expected: List[Any] = json.loads(full.stdout)
    assert json.loads(resumed.stdout) == expected
