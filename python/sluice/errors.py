"""The exceptions sluice raises.

Every one derives from :class:`SluiceError` and from the builtin exception a caller would
naturally catch, so ``except ValueError`` still works for a bad spec and
``except FileNotFoundError`` for a missing dataset. Each carries the context the Rust error
had: the spec field, or the sample's key and path.
"""

from __future__ import annotations

from typing import List, Optional

__all__ = [
    "SluiceError",
    "SpecError",
    "SourceError",
    "SourceNotFoundError",
    "SampleError",
    "MapBatchError",
    "StateError",
    "StreamEntryError",
    "BrokerError",
    "ServiceError",
    "ServiceRequestError",
    "ServicePermissionError",
    "ServiceAuthError",
    "ServiceNotFoundError",
    "JobConflictError",
    "JobFailedError",
    "ServiceUnavailableError",
    "ServiceTimeoutError",
    "ServiceTlsError",
    "NotSupportedError",
    "ServiceInternalError",
]


class SluiceError(Exception):
    """Base class of every error sluice raises (other than ``KeyboardInterrupt``)."""


class SpecError(SluiceError, ValueError):
    """A pipeline spec that cannot be parsed or does not make sense.

    Attributes:
        field: path of the offending field, e.g. ``"ops[1].size"`` or ``"batch.size"``.
        reason: what is wrong with it, without the field.
    """

    def __init__(self, message: str, field: Optional[str] = None, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason if reason is not None else message


class SourceError(SluiceError, OSError):
    """The dataset could not be enumerated: a missing or unreadable root, an empty folder,
    a corrupt tar shard, a bad label in a file list.

    Attributes:
        path: the file or folder concerned, when there is one.
    """

    def __init__(self, message: str, path: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path


class SourceNotFoundError(SourceError, FileNotFoundError):
    """The dataset root, file list or tar shard does not exist."""


class SampleError(SluiceError, RuntimeError):
    """A sample that could not be read or decoded under ``on_error("fail")``.

    Attributes:
        key: the sample's key (its position in the dataset's manifest).
        path: its file, or ``shard.tar:member``.
        stage: ``"read"``, ``"decode"`` or ``"transform"``.
        reason: what went wrong (corrupt, truncated, empty, too large...).
    """

    def __init__(
        self,
        message: str,
        key: Optional[int] = None,
        path: Optional[str] = None,
        stage: Optional[str] = None,
        reason: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.path = path
        self.stage = stage
        self.reason = reason


class MapBatchError(SluiceError, RuntimeError):
    """A ``Pipeline.map_batch`` function raised on a batch (docs/map.md).

    Attributes:
        epoch: the epoch.
        batch: the batch's index in the epoch.
        keys: the keys of its samples.
        fn: the function (``module:qualname``).
    """

    def __init__(
        self,
        message: str,
        epoch: Optional[int] = None,
        batch: Optional[int] = None,
        keys: Optional[List[int]] = None,
        fn: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.batch = batch
        self.keys = keys
        self.fn = fn


class StateError(SluiceError, ValueError):
    """A loader state (checkpoint) that does not belong to this loader: another dataset,
    seed or rank layout, or not a sluice state at all."""


class StreamEntryError(SluiceError, ValueError):
    """A stream entry that is malformed (a missing or bad ``id``, ``label`` or ``image``
    field) or whose image does not decode, under ``on_error="fail"``.

    Attributes:
        entry: the broker's entry id (``<ms>-<seq>``).
    """

    def __init__(self, message: str, entry: Optional[str] = None) -> None:
        super().__init__(message)
        self.entry = entry


class BrokerError(SluiceError, ConnectionError):
    """The stream's broker (Redis) failed a command, or stayed unreachable longer than
    the loader's ``reconnect_ms``.

    Attributes:
        url: the broker's address.
    """

    def __init__(self, message: str, url: Optional[str] = None) -> None:
        super().__init__(message)
        self.url = url


class ServiceError(SluiceError):
    """A failure of :class:`sluice.RemoteLoader`: reported by the sluice service or met on
    the way to it. Each subclass is also the builtin a caller would catch (below)."""


class ServiceRequestError(ServiceError, ValueError):
    """A request the service (or the client, before sending it) refuses as malformed: an
    unknown compression or data plane, a checkpoint of another job."""


class ServicePermissionError(ServiceError, PermissionError):
    """Refused by the operator's rules: the spec names a path outside the service's
    ``--allow-root`` folders."""


class ServiceAuthError(ServicePermissionError):
    """A missing or wrong token (``token=`` / ``$SLUICE_TOKEN``)."""


class ServiceNotFoundError(ServiceError, LookupError):
    """A job, task or worker the service does not know."""


class JobConflictError(ServiceError, ValueError):
    """A job of that name exists with another pipeline: pick another name, or the same
    pipeline."""


class JobFailedError(ServiceError, RuntimeError):
    """The service could not do the job's work: a sample failed under
    ``on_error("fail")`` on a worker (the message names its key and path), or the dataset
    cannot be read there."""


class ServiceUnavailableError(ServiceError, ConnectionError):
    """The dispatcher or a worker cannot be reached, or went away."""


class ServiceTimeoutError(ServiceError, TimeoutError):
    """The service did not answer in time."""


class ServiceTlsError(ServiceError, ConnectionError):
    """TLS cannot be set up: a CA file (``tls_ca=`` / ``$SLUICE_TLS_CA``) that is missing
    or not a usable certificate."""


class NotSupportedError(ServiceError, NotImplementedError):
    """Something the service does not do (yet), e.g. importance reports from a
    :class:`sluice.RemoteLoader`."""


class ServiceInternalError(ServiceError, RuntimeError):
    """An unexpected failure in the service or the client (a malformed batch, a stream that
    ended early): a bug worth reporting."""
