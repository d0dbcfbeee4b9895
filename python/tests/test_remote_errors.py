"""Every way a RemoteLoader can fail is a ``sluice.SluiceError`` (a ``sluice.ServiceError``
subclass, or the SpecError a local loader raises) and also the builtin a caller would
naturally catch. Against real service processes on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Type

import pytest

import sluice
from conftest import free_addr, sluice_service


def _pipeline(root: Path, seed: int = 0) -> sluice.Pipeline:
    return sluice.Pipeline.image_folder(root).decode().random_resized_crop(32).batch(8).seed(seed)


def _check(err: BaseException, cls: Type[sluice.SluiceError], builtin: Type[BaseException]) -> None:
    assert isinstance(err, cls), type(err).__mro__
    assert isinstance(err, sluice.SluiceError) and isinstance(err, builtin)


def test_an_unreachable_dispatcher_is_a_service_unavailable_error(dataset: Path) -> None:
    with pytest.raises(sluice.ServiceError) as info:
        sluice.RemoteLoader(_pipeline(dataset), dispatcher=free_addr(), job="nobody", connect_timeout=0.5)
    _check(info.value, sluice.ServiceUnavailableError, ConnectionError)
    assert "gave up" in str(info.value)


def test_a_wrong_token_is_a_service_auth_error(dataset: Path, tmp_path: Path) -> None:
    with sluice_service([dataset], tmp_path / "journal", token="s3cret") as addr:
        with pytest.raises(sluice.ServiceError) as info:
            sluice.RemoteLoader(_pipeline(dataset), dispatcher=addr, job="auth", token="wrong")
        _check(info.value, sluice.ServiceAuthError, PermissionError)
        assert isinstance(info.value, sluice.ServicePermissionError)
        assert "token" in str(info.value)
        # The right token gets in.
        assert len(sluice.RemoteLoader(_pipeline(dataset), dispatcher=addr, job="auth", token="s3cret")) == 6


def test_spec_and_job_failures_are_sluice_errors(dataset: Path, bad_dataset: Dict[str, object], tmp_path: Path) -> None:
    bad_root = Path(str(bad_dataset["root"]))
    outside = tmp_path / "outside"
    sluice.generate_dataset(outside, images=2, classes=1)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    with sluice_service([dataset, bad_root, allowed], tmp_path / "journal") as addr:
        sluice.RemoteLoader(_pipeline(dataset), dispatcher=addr, job="taken")

        # The same name with another pipeline.
        with pytest.raises(sluice.ServiceError) as conflict:
            sluice.RemoteLoader(_pipeline(dataset, seed=9), dispatcher=addr, job="taken")
        _check(conflict.value, sluice.JobConflictError, ValueError)
        assert "taken" in str(conflict.value)

        # A spec that does not validate: the same SpecError a local loader raises.
        spec = _pipeline(dataset).to_dict()
        spec["batch"]["size"] = 0
        with pytest.raises(sluice.SpecError) as bad_spec:
            sluice.RemoteLoader(spec, dispatcher=addr, job="bad-spec")
        _check(bad_spec.value, sluice.SpecError, ValueError)
        assert bad_spec.value.field == "batch.size"

        # A path the operator did not allow.
        with pytest.raises(sluice.ServiceError) as denied:
            sluice.RemoteLoader(_pipeline(outside), dispatcher=addr, job="outside")
        _check(denied.value, sluice.ServicePermissionError, PermissionError)
        assert "outside the allowed roots" in str(denied.value)

        # An allowed path with no dataset: the service cannot do the job.
        with pytest.raises(sluice.ServiceError) as missing:
            sluice.RemoteLoader(_pipeline(allowed / "missing"), dispatcher=addr, job="missing")
        _check(missing.value, sluice.JobFailedError, RuntimeError)
        assert "missing" in str(missing.value)

        # A corrupt sample under on_error("fail"), met on a worker.
        failing = sluice.RemoteLoader(_pipeline(bad_root).shuffle("none"), dispatcher=addr, job="corrupt")
        with pytest.raises(sluice.ServiceError) as sample:
            for _ in failing:
                pass
        _check(sample.value, sluice.JobFailedError, RuntimeError)
        assert any(str(p) in str(sample.value) for p in bad_dataset["bad_files"])  # type: ignore[attr-defined]


def test_client_side_refusals_are_sluice_errors(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(sluice.ServiceError) as compression:
        sluice.RemoteLoader(_pipeline(dataset), dispatcher=free_addr(), job="x", compression="zip")
    _check(compression.value, sluice.ServiceRequestError, ValueError)
    # tls_ca is an argument: a CA file that does not exist is refused before connecting.
    with pytest.raises(sluice.ServiceError) as tls:
        sluice.RemoteLoader(_pipeline(dataset), dispatcher=free_addr(), job="x", tls_ca=tmp_path / "no-ca.pem")
    _check(tls.value, sluice.ServiceTlsError, ConnectionError)
    assert "no-ca.pem" in str(tls.value)
