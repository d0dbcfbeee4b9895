//! Errors of the service layer, and how they map to gRPC status codes.

use std::path::PathBuf;

use sluice_core::SpecError;
use sluice_pipeline::PipelineError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A spec or request that does not make sense; names the field.
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// A spec naming a path outside the roots the operator allowed.
    #[error("{} is outside the allowed roots ({allowed}); start the service with --allow-root to allow it", path.display())]
    PathNotAllowed { path: PathBuf, allowed: String },
    /// A spec asking a worker for more than its operator allows.
    #[error("spec field `{field}` asks for {asked}, over this worker's limit of {limit} ({flag})")]
    OverLimit { field: &'static str, asked: String, limit: String, flag: &'static str },
    #[error("this worker already runs {max} jobs (--max-jobs); try again when one ends")]
    TooManyJobs { max: usize },
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    #[error("job `{name}` exists with another pipeline (fingerprint {existing}, this spec has {requested})")]
    JobConflict { name: String, existing: String, requested: String },
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("journal {}: {message}", path.display())]
    Journal { path: PathBuf, message: String },
    #[error("cannot listen on {addr}: {message}")]
    Listen { addr: String, message: String },
    #[error("cannot reach {addr}: {message}")]
    Connect { addr: String, message: String },
    #[error("{what} failed: {status}")]
    Rpc {
        what: &'static str,
        #[source]
        status: Box<Status>,
    },
    /// A certificate, key or CA file that is missing or not usable.
    #[error("TLS: {0}")]
    Tls(String),
    #[error("malformed batch from worker: {0}")]
    BadBatch(String),
    #[error("gave up after {seconds:.0} s without reaching the dispatcher: {last}")]
    Unavailable { seconds: f64, last: String },
    /// The caller asked a waiting iterator to stop (Ctrl-C); iterating again continues.
    #[error("interrupted while waiting for a batch")]
    Interrupted,
    #[error("{0}")]
    Internal(String),
}

impl ServiceError {
    pub fn rpc(what: &'static str, status: Status) -> Self {
        ServiceError::Rpc { what, status: Box::new(status) }
    }
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Status {
        let code = match &e {
            ServiceError::Spec(_)
            | ServiceError::InvalidArgument(_)
            | ServiceError::BadBatch(_)
            | ServiceError::OverLimit { .. } => Code::InvalidArgument,
            ServiceError::Pipeline(PipelineError::Spec(_)) => Code::InvalidArgument,
            ServiceError::Pipeline(PipelineError::Source(_)) => Code::FailedPrecondition,
            ServiceError::PathNotAllowed { .. } => Code::PermissionDenied,
            ServiceError::NotFound { .. } => Code::NotFound,
            ServiceError::JobConflict { .. } => Code::AlreadyExists,
            ServiceError::Rpc { status, .. } => status.code(),
            ServiceError::Unavailable { .. } | ServiceError::Connect { .. } => Code::Unavailable,
            ServiceError::Interrupted => Code::Cancelled,
            ServiceError::TooManyJobs { .. } => Code::ResourceExhausted,
            ServiceError::Tls(_) => Code::FailedPrecondition,
            _ => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}
