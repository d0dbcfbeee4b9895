"""``sluice.profile``: the pipeline at several thread counts, measured.

The same sweep as ``sluice profile SPEC --sweep threads=1,2,4``: at each setting one
warm-up epoch and ``epochs`` measured ones with per-op CPU counters on; throughput,
CPU-seconds per image, per-op CPU time, p50/p99 and counters, and the knee (the setting
past which one more thread adds less than 3% throughput). ``report=`` writes the
self-contained HTML report with plots.
"""

from __future__ import annotations

import json
import os
from typing import List, Mapping, Optional, Sequence, TypedDict, Union

from . import _sluice
from .loader import _spec_json
from .pipeline import PathLike, Pipeline


class OpCounters(TypedDict):
    """One op's CPU counters summed over threads; hardware ones are None without a PMU."""

    op: str
    source: str  # "perf_hardware", "perf_software" or "rusage"
    task_clock_ns: int
    page_faults: int
    context_switches: int
    cycles: Optional[int]
    instructions: Optional[int]
    cache_misses: Optional[int]
    branch_misses: Optional[int]


class _OpRowBase(TypedDict):
    op: str
    busy_us_per_image: float
    p50_us: float
    p99_us: float


class OpRow(_OpRowBase, total=False):
    """One op at one setting."""

    counters: OpCounters


class _ProfileRowBase(TypedDict):
    unit: str  # "threads"
    units: int
    images: int
    seconds: float
    images_per_s: float
    cpu_s_per_image: float
    ops: List[OpRow]


class ProfileRow(_ProfileRowBase, total=False):
    """One setting of the sweep: a line of the report's main table."""

    gain_pct: float  # throughput against the previous setting, in percent
    knee: bool  # this setting is the knee


def profile(
    spec: Union[Pipeline, Mapping[str, object], PathLike],
    sweep: Mapping[str, Sequence[int]],
    report: Optional[PathLike] = None,
    epochs: int = 1,
    runs: int = 1,
) -> List[ProfileRow]:
    """Runs ``spec`` at each setting of ``sweep`` (``{"threads": [1, 2, 4]}``) and returns
    the table, one row per setting, the knee marked ``knee: True``.

    Args:
        spec: a :class:`Pipeline`, a spec dict, or the path of a ``.toml``/``.json`` spec.
        sweep: ``{"threads": [...]}``; worker-process sweeps are ``sluice profile
            SPEC --sweep workers=1,2`` (they start ``sluice`` processes).
        report: where to write the HTML report, if anywhere.
        epochs: measured epochs per setting (after one warm-up epoch).
        runs: runs of the whole sweep, interleaved; each setting keeps its median run.

    Raises:
        ValueError: the sweep is not ``{"threads": [positive ints]}``.
        SpecError, SluiceError: the spec is invalid or the pipeline fails.
        OSError: the report cannot be written.
    """
    if set(sweep) != {"threads"}:
        raise ValueError(f"sweep must be {{'threads': [1, 2, ...]}}, not {dict(sweep)!r}")
    threads = [int(n) for n in sweep["threads"]]
    title = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else "pipeline"
    rows_json, knee = _sluice.profile_threads(
        _spec_json(spec),
        threads,
        epochs,
        runs,
        None if report is None else os.fspath(report),
        title,
    )
    rows: List[ProfileRow] = json.loads(rows_json)
    for row in rows:
        row["knee"] = row["units"] == knee
    return rows
