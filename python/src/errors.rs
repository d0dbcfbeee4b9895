//! The one place where Rust errors become Python exceptions.
//!
//! The exception classes live in the pure-Python module `sluice.errors`, so they can inherit
//! from both sluice's base class and the builtin a caller would naturally catch
//! (`SpecError(ValueError)`, `SampleError(RuntimeError)`, `SourceError(OSError)`, ...). Each
//! carries the context the Rust error had: the spec field, the sample key and path. Remote
//! loader failures are `sluice.errors.ServiceError` subclasses, chosen by the service
//! error's kind (whether it happened here or came back as a gRPC status).

use std::path::Path;

use pyo3::exceptions::{PyKeyboardInterrupt, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_client::{ClientError, ServiceErrorKind};
use sluice_core::{SampleError, SpecError};
use sluice_pipeline::pack::PackError;
use sluice_pipeline::source::SourceError;
use sluice_pipeline::{PipelineError, TraceError};
use sluice_synth::SynthError;

const ERRORS_MODULE: &str = "sluice.errors";

/// Instantiates `sluice.errors.<class>(message, **attrs)` as a `PyErr`. If the Python
/// package cannot be imported (the native module used on its own), falls back to a
/// `RuntimeError` with the same message rather than losing it.
fn raise<'py>(
    py: Python<'py>,
    class: &str,
    message: String,
    attrs: impl FnOnce(&Bound<'py, PyDict>) -> PyResult<()>,
) -> PyErr {
    let made = (|| -> PyResult<Bound<'py, PyAny>> {
        let cls = py.import(ERRORS_MODULE)?.getattr(class)?;
        let kwargs = PyDict::new(py);
        attrs(&kwargs)?;
        cls.call((message.as_str(),), Some(&kwargs))
    })();
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(_) => PyRuntimeError::new_err(message),
    }
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// `sluice.errors.SpecError` naming the offending field.
pub fn spec_error(py: Python<'_>, e: SpecError) -> PyErr {
    let message = e.to_string();
    raise(py, "SpecError", message, |kw| {
        kw.set_item("field", &e.field)?;
        kw.set_item("reason", &e.message)
    })
}

/// `sluice.errors.SampleError` with the sample's key, path and stage.
pub fn sample_error(py: Python<'_>, e: SampleError) -> PyErr {
    let message = e.to_string();
    raise(py, "SampleError", message, |kw| {
        kw.set_item("key", e.key.0)?;
        kw.set_item("path", path_str(&e.path))?;
        kw.set_item("stage", e.stage.to_string())?;
        kw.set_item("reason", e.kind.to_string())
    })
}

/// The file or folder a source error is about.
fn source_path(e: &SourceError) -> Option<&Path> {
    match e {
        SourceError::NotFound { path, .. }
        | SourceError::NotADirectory { path }
        | SourceError::Io { path, .. }
        | SourceError::BadLabel { path, .. }
        | SourceError::BadAnnotations { path, .. }
        | SourceError::OutsideRoots { path, .. } => Some(path),
        SourceError::NoClasses { root } => Some(root),
        SourceError::CorruptTar { shard, .. }
        | SourceError::BadClassFile { shard, .. }
        | SourceError::TruncatedShard { shard, .. }
        | SourceError::ShardTooLarge { shard, .. } => Some(shard),
        SourceError::Object(e) => Some(Path::new(&e.url)),
        SourceError::Parquet(e) => Some(Path::new(e.file())),
        SourceError::NoSamples { .. } | SourceError::NoFields { .. } => None,
    }
}

/// `sluice.errors.SourceError` (an `OSError`), or `SourceNotFoundError` (also a
/// `FileNotFoundError`) when the dataset is missing.
pub fn source_error(py: Python<'_>, e: SourceError) -> PyErr {
    let class = if matches!(e, SourceError::NotFound { .. }) { "SourceNotFoundError" } else { "SourceError" };
    let path = source_path(&e).map(path_str);
    raise(py, class, e.to_string(), |kw| kw.set_item("path", path))
}

/// `sluice.errors.StateError`: a checkpoint that does not fit this loader.
pub fn state_error(py: Python<'_>, message: String) -> PyErr {
    raise(py, "StateError", message, |_| Ok(()))
}

/// `sluice.errors.SluiceError`: `class.method()` needs the loader between batches but was
/// called from inside that loader's own wait for one (a signal handler that ran during
/// `next()`), where waiting would never end.
pub fn reentrant_error(py: Python<'_>, class: &str, method: &str) -> PyErr {
    let message = format!(
        "{class}.{method}() was called while this thread waits for a batch of the same loader \
         (from a signal handler that ran during next()): call it after next() returns"
    );
    raise(py, "SluiceError", message, |_| Ok(()))
}

/// Maps every error a loader can return.
pub fn pipeline_error(py: Python<'_>, e: PipelineError) -> PyErr {
    match e {
        PipelineError::Spec(e) => spec_error(py, e),
        PipelineError::Source(e) => source_error(py, e),
        PipelineError::Sample(e) => sample_error(py, e),
        PipelineError::State(_) => state_error(py, e.to_string()),
        PipelineError::BadRank { .. } | PipelineError::ReportLengths { .. } | PipelineError::Autoscale(_) => {
            PyValueError::new_err(e.to_string())
        }
        PipelineError::RamUnknown
        | PipelineError::SharedCache(_)
        | PipelineError::Root(_)
        | PipelineError::StorageLink(_)
        | PipelineError::Peer(_)
        | PipelineError::AlreadyStarted
        | PipelineError::ManifestWithoutFields
        | PipelineError::BufferStillShared { .. } => raise(py, "SluiceError", e.to_string(), |_| Ok(())),
        PipelineError::Interrupted => PyKeyboardInterrupt::new_err(e.to_string()),
        // The disk tier's folder cannot be created or listed.
        PipelineError::DiskCache(_) => PyOSError::new_err(e.to_string()),
        PipelineError::Trace(TraceError::Write { .. } | TraceError::Read { .. }) => PyOSError::new_err(e.to_string()),
        PipelineError::Trace(
            TraceError::AlreadyTracing
            | TraceError::Malformed { .. }
            | TraceError::Unaligned { .. }
            | TraceError::SameProcess { .. },
        ) => raise(py, "SluiceError", e.to_string(), |_| Ok(())),
    }
}

/// Dataset generation failures: writing is an `OSError` on the path, encoding a bug.
pub fn synth_error(py: Python<'_>, e: SynthError) -> PyErr {
    match &e {
        SynthError::Io { path, .. } => {
            let path = path_str(path);
            raise(py, "SourceError", e.to_string(), |kw| kw.set_item("path", path))
        }
        SynthError::Encode { .. } => raise(py, "SluiceError", e.to_string(), |_| Ok(())),
    }
}

/// Packing failures: a missing dataset is `SourceNotFoundError`, the rest `SourceError` on
/// the path concerned.
pub fn pack_error(py: Python<'_>, e: PackError) -> PyErr {
    let class = if matches!(e, PackError::NotFound(_)) { "SourceNotFoundError" } else { "SourceError" };
    let path = path_str(e.path());
    raise(py, class, e.to_string(), |kw| kw.set_item("path", path))
}

/// Remote loader failures: a spec or pipeline error as the local loader raises it, the
/// rest as the `ServiceError` subclass of its kind (each also a builtin: `ConnectionError`,
/// `PermissionError`, `ValueError`...).
pub fn service_error(py: Python<'_>, e: ClientError) -> PyErr {
    let class = match e {
        ClientError::Spec(e) => return spec_error(py, e),
        ClientError::Pipeline(e) => return pipeline_error(py, e),
        ref e => match e.kind() {
            ServiceErrorKind::InvalidRequest => "ServiceRequestError",
            ServiceErrorKind::PermissionDenied => "ServicePermissionError",
            ServiceErrorKind::Unauthenticated => "ServiceAuthError",
            ServiceErrorKind::NotFound => "ServiceNotFoundError",
            ServiceErrorKind::Conflict => "JobConflictError",
            ServiceErrorKind::FailedPrecondition => "JobFailedError",
            ServiceErrorKind::Unavailable => "ServiceUnavailableError",
            ServiceErrorKind::Timeout => "ServiceTimeoutError",
            ServiceErrorKind::Tls => "ServiceTlsError",
            ServiceErrorKind::Unsupported => "NotSupportedError",
            ServiceErrorKind::Interrupted => return PyKeyboardInterrupt::new_err(e.to_string()),
            ServiceErrorKind::Internal => "ServiceInternalError",
        },
    };
    raise(py, class, e.to_string(), |_| Ok(()))
}

/// Maps a streaming error: a bad config is a `SpecError`, a state for another stream a
/// `StateError`, a malformed entry or undecodable image a `StreamEntryError` naming the
/// entry, a broker failure a `BrokerError`, a rehearsal file that cannot be written an
/// `OSError`.
pub fn stream_error(py: Python<'_>, e: sluice_stream::StreamError) -> PyErr {
    use sluice_stream::StreamError as E;
    let message = e.to_string();
    match e {
        E::Spec(e) => spec_error(py, e),
        E::Config { field, problem } => raise(py, "SpecError", message, |kw| {
            kw.set_item("field", field)?;
            kw.set_item("reason", problem)
        }),
        E::StateMismatch { .. } => state_error(py, message),
        E::Dataset(e) => source_error(py, e),
        E::MalformedEntry { entry, .. } | E::Decode { entry, .. } => {
            raise(py, "StreamEntryError", message, |kw| kw.set_item("entry", entry))
        }
        E::Broker { url, .. } | E::Unreachable { url, .. } => {
            raise(py, "BrokerError", message, |kw| kw.set_item("url", url))
        }
        E::RehearsalFile { .. } | E::RehearsalCorrupt { .. } | E::RehearsalGone { .. } | E::BadLedger(_) => {
            state_error(py, message)
        }
        E::RehearsalWrite { .. } => PyOSError::new_err(message),
        E::Thread { .. } => raise(py, "SluiceError", message, |_| Ok(())),
        E::RehearsalListen { .. } => raise(py, "SluiceError", message, |_| Ok(())),
        E::ReadSample { .. } => raise(py, "SluiceError", message, |_| Ok(())),
    }
}
