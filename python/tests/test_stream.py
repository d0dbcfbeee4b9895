"""sluice.stream against a real redis-server on a free loopback port: push, batches with
rehearsal flags, state_dict round trip, stats, and malformed entries."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import List, Tuple, Union

import numpy as np
import pytest

import sluice
import sluice.stream
from conftest import N_IMAGES

OPS = [
    {"op": "decode"},
    {"op": "resize", "size": 20},
    {"op": "center_crop", "size": 16},
    {"op": "random_horizontal_flip"},
]


def loader(url: str, tmp: Path, group: str = "job", threads: Union[int, str] = 1) -> sluice.stream.StreamLoader:
    return sluice.stream.StreamLoader(
        url,
        "s",
        group=group,
        ops=OPS,
        new_per_batch=4,
        rehearsal_per_batch=2,
        rehearsal={"capacity": 8, "policy": "class_balanced", "dir": tmp / "rehearsal"},
        threads=threads,
    )


def test_pushed_samples_come_back_once_with_rehearsal_mixed_in(
    redis: Tuple[str, int], dataset: Path, tmp_path: Path
) -> None:
    url, _ = redis
    report = sluice.stream.push(dataset, url=url, stream="s", order="class-incremental", classes_per_task=2)
    assert report["pushed"] == N_IMAGES
    first = loader(url, tmp_path)
    new: List[int] = []
    for i, batch in enumerate(first):
        flags = batch["rehearsal"]
        assert flags.dtype == np.bool_ and batch["image"].shape[1:] == (16, 16, 3)
        new += [int(k) for k, r in zip(batch["key"], flags) if not r]
        if i > 0:
            assert int(flags.sum()) == 2, "each batch after the first carries 2 rehearsal samples"
        if i == 3:
            state = first.state_dict()
            saved_buffer = first.rehearsal_ids()
            break
    assert Path(state["rehearsal"]["file"]).is_file()
    # A new loader of the same job resumes from the state: the rest, nothing twice.
    second = loader(url, tmp_path)
    second.load_state_dict(state)
    assert second.rehearsal_ids() == saved_buffer
    new += [int(k) for b in second for k, r in zip(b["key"], b["rehearsal"]) if not r]
    assert sorted(new) == list(range(N_IMAGES))
    stats = second.stats()
    assert stats["trained"] == N_IMAGES and stats["rehearsed"] > 0 and stats["backlog"] == 0


def test_stats_have_per_op_percentiles_like_the_file_loader_and_threads_auto_runs(
    redis: Tuple[str, int], dataset: Path, tmp_path: Path
) -> None:
    url, _ = redis
    sluice.stream.push(dataset, url=url, stream="s", order="as-listed")
    stream = loader(url, tmp_path, threads="auto")
    batches = sum(1 for _ in stream)
    stats = stream.stats()
    assert stats["batches"] == batches and stats["trained"] == N_IMAGES
    ops = [p["op"] for p in stats["op_percentiles"]]
    assert ops == [op for op, _ in stats["op_seconds"]] and ops[0].startswith("decode"), stats
    decode = stats["op_percentiles"][0]
    assert decode["samples"] == stats["trained"] + stats["rehearsed"], decode
    assert 0 < decode["p50_s"] <= decode["p99_s"], decode
    # threads="auto": the engine's autoscaler sizes the pool and says how many it runs.
    assert 1 <= stats["threads"] <= (os.cpu_count() or 1), stats["threads"]
    assert stats["autoscale"]["units"] == stats["threads"], stats["autoscale"]


def test_a_malformed_entry_raises_stream_entry_error_naming_the_entry(redis: Tuple[str, int], tmp_path: Path) -> None:
    url, port = redis
    out = subprocess.run(
        ["redis-cli", "-p", str(port), "XADD", "s", "*", "id", "x1", "label", "1", "image", "a"],
        capture_output=True,
        text=True,
        check=True,
    )
    entry = out.stdout.strip()
    with pytest.raises(sluice.StreamEntryError) as e:
        next(loader(url, tmp_path))
    assert e.value.entry == entry and "field `id`" in str(e.value)


def test_bad_config_and_unreachable_broker_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(sluice.SpecError):
        sluice.stream.StreamLoader("redis://127.0.0.1:1/", "s", group="g", ops=OPS, new_per_batch=0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(sluice.BrokerError) as e:
        sluice.stream.StreamLoader(
            f"redis://127.0.0.1:{port}/", "s", group="g", ops=OPS, new_per_batch=4, reconnect_ms=200
        )
    assert str(port) in str(e.value)


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_distributed_buffer_draws_from_the_peers_shard_in_the_background(
    redis: Tuple[str, int], dataset: Path, tmp_path: Path
) -> None:
    url, _ = redis
    for stream in ("s", "peer"):
        sluice.stream.push(dataset, url=url, stream=stream)
    peers = [free_addr(), free_addr()]

    def learner(stream: str, rank: int) -> sluice.stream.StreamLoader:
        rehearsal = {
            "capacity": 8,
            "dir": tmp_path / f"rehearsal-{rank}",
            "peers": peers,
            "rank": rank,
            "token": "python-test-token",
        }
        return sluice.stream.StreamLoader(
            url, stream, group="job", ops=OPS, new_per_batch=4, rehearsal_per_batch=4, rehearsal=rehearsal, threads=1
        )

    peer = learner("peer", 1)
    for _ in peer:  # fills its shard, which it serves from now on
        pass
    me = learner("s", 0)
    deadline = time.monotonic() + 30
    while me.stats()["peer_ready"] < 16:  # the peer's samples prefetched: 2 x (4 + 4)
        assert time.monotonic() < deadline, me.stats()
        time.sleep(0.01)
    batches = list(me)
    stats = me.stats()
    # The first batch, with an empty local shard, draws from the peer's alone; every batch is full.
    assert all(int(b["rehearsal"].sum()) == 4 for b in batches)
    assert stats["rehearsed"] == 4 * len(batches)
    assert stats["rehearsed_remote"] >= 4 and stats["peer_errors"] == 0


def test_a_rehearsal_file_that_cannot_be_written_raises_oserror(
    redis: Tuple[str, int], dataset: Path, tmp_path: Path
) -> None:
    url, _ = redis
    sluice.stream.push(dataset, url=url, stream="s")
    first = loader(url, tmp_path)
    next(first)
    rehearsal = tmp_path / "rehearsal"
    for f in rehearsal.iterdir():
        f.unlink()
    rehearsal.rmdir()
    rehearsal.write_bytes(b"")  # a file where the directory was: nothing can be written under it
    with pytest.raises(OSError) as e:
        first.state_dict()
    assert "cannot write the rehearsal buffer file" in str(e.value) and str(rehearsal) in str(e.value)


def test_a_rehearsal_buffer_without_a_dir_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(sluice.SpecError) as e:
        sluice.stream.StreamLoader(
            "redis://127.0.0.1:1/", "s", group="g", ops=OPS, new_per_batch=4, rehearsal={"capacity": 8}
        )
    assert "`rehearsal.dir` is required" in str(e.value)
