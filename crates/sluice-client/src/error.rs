//! Errors of the client side (the remote loader, the dispatcher and scale clients, the
//! data-plane readers, the wire conversions), what kind of failure each is, and how they
//! map to gRPC status codes when a server passes one on.

use sluice_core::SpecError;
use sluice_pipeline::PipelineError;
use tonic::{Code, Status};

use crate::runtime::RuntimeError;

/// An importance report whose keys and values do not pair up (the client checks before it
/// sends one, the dispatcher again when one arrives).
#[derive(Debug, thiserror::Error)]
#[error("importance report for job {job_id}: {keys} keys and {values} values")]
pub struct ReportLengths {
    pub job_id: u64,
    pub keys: usize,
    pub values: usize,
}

/// An autoscaling request (`what`: `SetScale`, a client's `autoscale` option) to a
/// dispatcher started without `--autoscale`.
#[derive(Debug, thiserror::Error)]
#[error("{what}: the dispatcher runs without autoscaling; start it with --autoscale POLICY (`sluice up --autoscale fastmatch --min-workers A --max-workers B`)")]
pub struct AutoscaleOff {
    pub what: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A spec that does not make sense; names the field.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A failure of the local engine's parts the client uses (its trace).
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// An option, checkpoint or token the client cannot use.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    #[error(transparent)]
    ReportLengths(#[from] ReportLengths),
    /// The client's `autoscale` option, against a dispatcher started without `--autoscale`.
    #[error(transparent)]
    AutoscaleOff(#[from] AutoscaleOff),
    #[error("cannot reach {addr}: {message}")]
    Connect { addr: String, message: String },
    #[error("{what} failed: {status}")]
    Rpc {
        what: &'static str,
        #[source]
        status: Box<Status>,
    },
    /// A certificate or CA file that is missing or not usable.
    #[error("TLS: {0}")]
    Tls(String),
    #[error("malformed batch from worker: {0}")]
    BadBatch(String),
    #[error("gave up after {seconds:.0} s without reaching the dispatcher: {last}")]
    Unavailable { seconds: f64, last: String },
    /// The caller asked a waiting iterator to stop (Ctrl-C); iterating again continues.
    #[error("interrupted while waiting for a batch")]
    Interrupted,
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The spec could not be written as the JSON the dispatcher takes.
    #[error("cannot write the spec as JSON: {0}")]
    SpecJson(#[source] serde_json::Error),
    /// The tasks fetching batches stopped without saying why (a panic in one).
    #[error("the batch fetchers stopped: {0}")]
    Fetcher(#[source] tokio::task::JoinError),
    /// The batch stream closed before the epoch's end.
    #[error("the batch stream ended before the end of epoch {epoch}")]
    StreamEnded { epoch: u64 },
    /// A batch of another epoch than the one being read.
    #[error("a batch of epoch {got} arrived while reading epoch {reading}")]
    WrongEpoch { got: u64, reading: u64 },
    /// No random bytes for a client secret.
    #[error("the operating system gave no random bytes for a secret")]
    NoRandomness,
}

/// What kind of failure an error is, whether it happened here or came back from the
/// service as a gRPC status: what callers (the Python binding) match on without reading
/// status codes themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceErrorKind {
    /// A spec or request the service refuses as malformed.
    InvalidRequest,
    /// Refused by the operator's rules (a path outside the allowed roots).
    PermissionDenied,
    /// A missing or wrong token.
    Unauthenticated,
    /// A job, task or worker that does not exist.
    NotFound,
    /// A job of that name exists with another pipeline.
    Conflict,
    /// The work cannot be done: the dataset cannot be read, or a sample failed under
    /// `on_error = "fail"`.
    FailedPrecondition,
    /// The dispatcher or a worker cannot be reached (or went away).
    Unavailable,
    /// A deadline ran out.
    Timeout,
    /// Certificates or keys that are missing or not usable.
    Tls,
    /// Something this service does not do.
    Unsupported,
    /// The caller asked a waiting iterator to stop (Ctrl-C).
    Interrupted,
    /// A bug or an unexpected failure.
    Internal,
}

impl ServiceErrorKind {
    /// The kind of a gRPC status that came back from the service.
    pub fn of_status(code: Code) -> Self {
        use ServiceErrorKind as K;
        match code {
            Code::InvalidArgument | Code::OutOfRange => K::InvalidRequest,
            Code::PermissionDenied => K::PermissionDenied,
            Code::Unauthenticated => K::Unauthenticated,
            Code::NotFound => K::NotFound,
            Code::AlreadyExists => K::Conflict,
            Code::FailedPrecondition => K::FailedPrecondition,
            // A stream cancelled by the other side is a worker or dispatcher going away.
            Code::Unavailable | Code::Cancelled | Code::ResourceExhausted => K::Unavailable,
            Code::DeadlineExceeded => K::Timeout,
            Code::Unimplemented => K::Unsupported,
            Code::Ok | Code::Unknown | Code::Aborted | Code::Internal | Code::DataLoss => K::Internal,
        }
    }

    /// The kind of a failure of the local engine.
    pub fn of_pipeline(e: &PipelineError) -> Self {
        match e {
            PipelineError::Spec(_) => Self::InvalidRequest,
            PipelineError::Source(_) | PipelineError::Sample(_) => Self::FailedPrecondition,
            PipelineError::Interrupted => Self::Interrupted,
            _ => Self::Internal,
        }
    }

    /// The status code of a failure of the local engine, as a server answers it.
    pub fn pipeline_code(e: &PipelineError) -> Code {
        match e {
            PipelineError::Spec(_) => Code::InvalidArgument,
            PipelineError::Source(_) => Code::FailedPrecondition,
            _ => Code::Internal,
        }
    }
}

impl ClientError {
    pub fn rpc(what: &'static str, status: Status) -> Self {
        ClientError::Rpc { what, status: Box::new(status) }
    }

    pub fn kind(&self) -> ServiceErrorKind {
        use ServiceErrorKind as K;
        match self {
            ClientError::Spec(_) | ClientError::InvalidArgument(_) | ClientError::ReportLengths(_) => K::InvalidRequest,
            ClientError::Pipeline(e) => K::of_pipeline(e),
            ClientError::AutoscaleOff(_) => K::FailedPrecondition,
            ClientError::Connect { .. } | ClientError::Unavailable { .. } => K::Unavailable,
            ClientError::Rpc { status, .. } => K::of_status(status.code()),
            ClientError::Tls(_) => K::Tls,
            ClientError::Interrupted => K::Interrupted,
            ClientError::BadBatch(_)
            | ClientError::Runtime(_)
            | ClientError::SpecJson(_)
            | ClientError::Fetcher(_)
            | ClientError::StreamEnded { .. }
            | ClientError::WrongEpoch { .. }
            | ClientError::NoRandomness => K::Internal,
        }
    }

    /// The gRPC status code a server answers with when this error happens on its side
    /// (a worker's dispatcher client, a batch it cannot encode).
    pub fn code(&self) -> Code {
        match self {
            ClientError::Spec(_)
            | ClientError::InvalidArgument(_)
            | ClientError::BadBatch(_)
            | ClientError::ReportLengths(_) => Code::InvalidArgument,
            ClientError::Pipeline(e) => ServiceErrorKind::pipeline_code(e),
            ClientError::AutoscaleOff(_) | ClientError::Tls(_) => Code::FailedPrecondition,
            ClientError::Rpc { status, .. } => status.code(),
            ClientError::Unavailable { .. } | ClientError::Connect { .. } => Code::Unavailable,
            ClientError::Interrupted => Code::Cancelled,
            ClientError::Runtime(_)
            | ClientError::SpecJson(_)
            | ClientError::Fetcher(_)
            | ClientError::StreamEnded { .. }
            | ClientError::WrongEpoch { .. }
            | ClientError::NoRandomness => Code::Internal,
        }
    }
}

impl From<ClientError> for Status {
    fn from(e: ClientError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_has_the_same_kind_after_crossing_grpc() {
        let errors = [
            ClientError::InvalidArgument("bad".into()),
            ClientError::Connect { addr: "127.0.0.1:1".into(), message: "refused".into() },
            ReportLengths { job_id: 1, keys: 2, values: 1 }.into(),
            AutoscaleOff { what: "RemoteLoader option `autoscale`" }.into(),
            ClientError::Unavailable { seconds: 60.0, last: "refused".into() },
            ClientError::StreamEnded { epoch: 3 },
        ];
        for e in errors {
            let kind = e.kind();
            assert_eq!(ClientError::rpc("Call", Status::from(e)).kind(), kind);
        }
        let status = |code| ClientError::rpc("Call", Status::new(code, "x")).kind();
        assert_eq!(status(Code::Unauthenticated), ServiceErrorKind::Unauthenticated);
        assert_eq!(status(Code::DeadlineExceeded), ServiceErrorKind::Timeout);
        assert_eq!(status(Code::Unimplemented), ServiceErrorKind::Unsupported);
        assert_eq!(status(Code::DataLoss), ServiceErrorKind::Internal);
    }
}
