"""``sluice.profile``: a real threads sweep returns the table and writes the HTML report."""

from __future__ import annotations

from pathlib import Path

import pytest

import sluice
from conftest import N_IMAGES, small_pipeline


def test_profile_sweeps_threads_returns_the_table_and_writes_the_report(
    dataset: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "profile.html"
    rows = sluice.profile(small_pipeline(dataset), sweep={"threads": [1, 2]}, report=report)
    assert [(r["unit"], r["units"], r["images"]) for r in rows] == [("threads", 1, N_IMAGES), ("threads", 2, N_IMAGES)]
    assert sum(r["knee"] for r in rows) == 1
    assert "gain_pct" not in rows[0] and isinstance(rows[1]["gain_pct"], float)
    for r in rows:
        assert r["images_per_s"] > 0 and r["cpu_s_per_image"] > 0
        ops = r["ops"]
        assert ops[0]["op"] == "read" and any("random_resized_crop" in o["op"] for o in ops)
        for o in ops:
            assert 0 < o["p50_us"] <= o["p99_us"], o
            assert o["counters"]["op"] == o["op"] and o["counters"]["task_clock_ns"] >= 0
    assert "[2/2] run 0: 2 threads" in capfd.readouterr().err, "progress on stderr"
    html = report.read_text()
    assert html.count("<svg") == 3 and "Throughput vs threads" in html


def test_profile_refuses_a_sweep_it_cannot_run(dataset: Path) -> None:
    with pytest.raises(ValueError, match="sweep"):
        sluice.profile(small_pipeline(dataset), sweep={"cores": [1]})
    with pytest.raises(ValueError, match="positive"):
        sluice.profile(small_pipeline(dataset), sweep={"threads": [0, 1]})
